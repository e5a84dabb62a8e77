"""Training the EAGLE head on the target's own features, and measuring its chains.

Loss per depth d of the chain (`eagle.chains.chain_passes`, training-time test): smooth-L1 between
the predicted and the true feature f_{b+d}, plus `cls_weight` x the cross-entropy of the draft's
distribution against the target's own distribution at that position, both over the draft
vocabulary (EAGLE's regression + classification loss, Li et al. 2024 §4.3; they weight the
classification 0.1 on raw features, here it is 1.0 on unit-RMS features: acceptance is what
counts, and a pilot on 30 sequences learned the target's argmax faster that way). Depths are
weighted by `depth_decay`^(d-1). AdamW with linear warm-up and cosine decay; one optimiser step
per `sequences_per_step` sequences; every random choice (init, order, noise) comes from `seed`,
so two runs on the same threads give the same weights. `feature_noise` > 0 adds uniform noise to
the true features the head reads (not to those it must predict): EAGLE's augmentation (U(-0.1,
0.1) on raw features, §4.3), here on unit-RMS ones, against the head memorising its data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eagle.losses import PackedBatch, packed_loss, sequence_loss, windowed
from eagle.train_spec import LAYER_INITS, TrainSpec
from models.eagle_head import EagleHead, head_state
from traces import atomic_write

#: The format name inside a training checkpoint (`train_head(checkpoint=...)`).
CHECKPOINT_FORMAT = "spectune-eagle-train-checkpoint/1"


def draft_vocabulary(texts: Iterable[Sequence[int]], size: int, always: Sequence[int] = (),
                     vocab: int | None = None) -> torch.Tensor:
    """`size` token ids: `always`, then the tokens of `texts` by frequency (ties: lower id
    first), then, with `vocab` given, unseen ids from 0 up (a BPE vocabulary's ids follow its
    merge order, which roughly follows frequency)."""
    counts = Counter(t for text in texts for t in text)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    chosen = list(dict.fromkeys([*always, *ranked]))[:size]
    if vocab is not None and len(chosen) < size:
        seen = set(chosen)
        chosen += [t for t in range(vocab) if t not in seen][: size - len(chosen)]
    return torch.tensor(chosen, dtype=torch.int64)


def init_head(head: EagleHead, seed: int, layer_init: str = "random",
              feature_rms: float | None = None) -> EagleHead:
    """Start from "the next feature is this one, nudged by the token": fc passes the (unit-RMS)
    feature half through (identity) plus the embedding half ~ N(0, 1/fan_in), and the layer's
    output projections are near zero, so the residual layer begins close to identity and learns
    the step from f_i to f_{i+1}; other matrices ~ N(0, 1/fan_in).

    `layer_init="last"` starts the layer from the target's last decoder layer instead (a head of
    n layers: from the target's last n, in order; a prior
    for a head trained on little data: attention and MLP that already read this residual
    stream). Its norms see directions only, but its output projections were made for features of
    RMS `feature_rms` (~33 for SmolLM2): they are divided by it, so the layer adds to unit-RMS
    entries what the target's last layer adds, in proportion."""
    if layer_init not in LAYER_INITS:
        raise ValueError(f"layer_init must be one of {', '.join(LAYER_INITS)}; got {layer_init!r}")
    if layer_init == "last" and not (feature_rms and feature_rms > 0):
        raise ValueError("layer_init='last' needs the target features' RMS (feature_rms > 0)")
    gen = torch.Generator().manual_seed(seed)
    hidden = head.config.shape.hidden
    count = len(head.layers)
    with torch.no_grad():
        for name, p in head_state(head).items():
            prefix, _, param = name.rpartition(".")
            outputs = param in ("o", "down")  # the residual branches' output projections
            if name == "fuse":  # the last layer's block passes through: an unfused start
                p.zero_()
                p[-hidden:].copy_(torch.eye(hidden))
            elif layer_init == "last" and prefix.startswith("layer"):
                index = int(prefix.rpartition(".")[2]) if prefix != "layer" else 0
                source = getattr(head.target.layers[index - count], param).float()
                if outputs:
                    source = source / feature_rms
                p.copy_(source)
            elif name.endswith("norm"):
                p.fill_(1.0)
            elif name == "fc_bias":
                p.zero_()
            else:
                scale = 1e-3 if outputs else p.shape[0] ** -0.5
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale)
        head.fc[hidden:].copy_(torch.eye(hidden))
    return head


def feature_rms(data: Sequence[tuple], width: int | None = None) -> float:
    """The mean per-row RMS of the target features in (tokens, features[, start]) data (of
    each row's last `width` columns, the last layer's, if given)."""
    rms = [f[..., -(width or f.shape[-1]):].float().pow(2).mean(-1).sqrt().mean()
           for _, f, *_ in data]
    return float(torch.stack(rms).mean()) if rms else 0.0


def train_head(head: EagleHead, data: Sequence[tuple],
               spec: TrainSpec, log: Callable[[str], None] = print,
               evaluate: Callable[[int], str] | None = None,
               checkpoint: Path | None = None, checkpoint_every_s: float = 600.0,
               packed: bool = False) -> list[dict]:
    """Train on (tokens, features[, start]) sequences (with a start, the loss covers the
    features from that position on: the prompt before it is context only); returns the curve
    (one row per epoch).

    With a `checkpoint` path, everything training carries from one step to the next (weights,
    optimiser, both random streams, where it is in the epoch, the curve) is written there after
    every epoch and every `checkpoint_every_s` seconds, and a run that finds it resumes there
    with the same result as a run never stopped: a full-size CPU run outlasts a working session.
    The file must come from the same head, data and spec (`checkpoint_name` names it by them).

    `packed`: each step's sequences go through one `packed_loss` instead of one `sequence_loss`
    each: the same loss up to rounding in a fraction of the kernel launches (a GPU's bound)."""
    params = list(head_state(head).values())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(spec.seed)
    noise = torch.Generator().manual_seed(spec.seed)
    per_step = spec.sequences_per_step
    steps_per_epoch = math.ceil(len(data) / per_step)
    total_steps = spec.epochs * steps_per_epoch
    at = _Position(curve=[], epoch=0, sequence=0, sums=Counter())
    if checkpoint is not None and Path(checkpoint).is_file():
        at = _resume(Path(checkpoint), head, opt, rng, noise)
        log(f"resumed from {checkpoint} in epoch {at.epoch + 1} of {spec.epochs} after "
            f"{at.sequence} of {len(data)} sequences")
    step = at.epoch * steps_per_epoch + at.sequence // per_step
    started = saved = time.perf_counter()
    while at.epoch < spec.epochs:
        epoch_rng = rng.bit_generator.state  # what this epoch's order is drawn from
        order = rng.permutation(len(data))
        for start in range(at.sequence, len(order), per_step):
            group = order[start : start + per_step]
            lr = spec.lr * min(1.0, (step + 1) / spec.warmup_steps) * 0.5 * (
                1 + math.cos(math.pi * step / total_steps))
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad(set_to_none=True)
            if packed:
                batch = PackedBatch.of([windowed(data[i], spec.window) for i in group],
                                       spec.depths)
                loss, stats = packed_loss(head, batch, spec, noise)
                loss.backward()
                names = list(stats)
                sums = torch.stack([stats[k].nan_to_num(0.0).sum() for k in names]).tolist()
                at.sums.update({**dict(zip(names, sums)), "n": len(group)})
            else:
                for index in group:
                    tokens, features, first_base = windowed(data[index], spec.window)
                    loss, stats = sequence_loss(head, tokens, features, spec, first_base, noise)
                    (loss / len(group)).backward()
                    at.sums.update({**stats, "loss": float(loss.detach()), "n": 1})
            torch.nn.utils.clip_grad_norm_(params, spec.grad_clip)
            opt.step()
            step += 1
            at.sequence = start + per_step
            if (checkpoint is not None and at.sequence < len(order)
                    and time.perf_counter() - saved >= checkpoint_every_s):
                _save_checkpoint(Path(checkpoint), head, opt, epoch_rng, noise, at)
                saved = time.perf_counter()
        row = {k: v / at.sums["n"] for k, v in at.sums.items() if k != "n"}
        row.update(epoch=at.epoch + 1, seconds=round(time.perf_counter() - started, 1))
        note = evaluate(at.epoch + 1) if evaluate is not None else ""
        if note:
            row["evaluation"] = note
        at = _Position(curve=[*at.curve, row], epoch=at.epoch + 1, sequence=0, sums=Counter())
        if checkpoint is not None:
            _save_checkpoint(Path(checkpoint), head, opt, rng.bit_generator.state, noise, at)
            saved = time.perf_counter()
        log(f"epoch {row['epoch']}: loss {row['loss']:.4f}  " + "  ".join(
            f"d{d} match {row[f'match{d}']:.3f} reg {row[f'reg{d}']:.3f} cls "
            f"{row[f'cls{d}']:.3f}" for d in range(1, spec.depths + 1)
            if f"match{d}" in row) + f"  ({row['seconds']:.0f} s) {note}")
    for p in params:
        p.requires_grad_(False)
    return at.curve


def checkpoint_name(spec: TrainSpec, head: EagleHead, data: Sequence[tuple]) -> str:
    """A file name that changes with anything a resumed run must share with the first: the
    spec, torch's thread count (it changes the sums' rounding), the draft vocabulary, the
    starting weights and every sequence's tokens, start and features (a checkpoint of other
    data or settings is then never picked up)."""
    settings = {**dataclasses.asdict(spec), "threads": torch.get_num_threads()}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    digest.update(head.vocab_ids.cpu().numpy().astype(np.int64).tobytes())
    for tensor in head_state(head).values():
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    for tokens, features, *start in data:
        digest.update(tokens.cpu().numpy().astype(np.int64).tobytes())
        digest.update(np.asarray(start, dtype=np.int64).tobytes())
        digest.update(features.float().cpu().numpy().tobytes())
    return f"train-{digest.hexdigest()[:16]}.pt"


@dataclass
class _Position:
    """Where training stands between two steps, besides the tensors: the finished epochs' rows,
    the epoch it is in, how many sequences of that epoch's order are done, and their stats."""

    curve: list[dict]
    epoch: int
    sequence: int
    sums: Counter


def _save_checkpoint(path: Path, head: EagleHead, opt: torch.optim.Optimizer, epoch_rng: dict,
                     noise: torch.Generator, at: _Position) -> None:
    """`epoch_rng`: the order stream's state before epoch `at.epoch` drew its order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"format": CHECKPOINT_FORMAT, "curve": at.curve, "epoch": at.epoch,
             "sequence": at.sequence, "sums": dict(at.sums), "optimizer": opt.state_dict(),
             "weights": {n: p.detach().clone() for n, p in head_state(head).items()},
             "order_rng": epoch_rng, "noise_rng": noise.get_state()}
    with atomic_write(path) as handle:
        torch.save(state, handle)


def _resume(path: Path, head: EagleHead, opt: torch.optim.Optimizer, rng: np.random.Generator,
            noise: torch.Generator) -> _Position:
    try:
        state = torch.load(path, weights_only=False)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"format {state.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
        with torch.no_grad():
            for name, p in head_state(head).items():
                p.copy_(state["weights"][name])
        opt.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["order_rng"]
        noise.set_state(state["noise_rng"])
        return _Position(curve=list(state["curve"]), epoch=int(state["epoch"]),
                         sequence=int(state["sequence"]), sums=Counter(state["sums"]))
    except Exception as error:  # any unreadable or foreign file: say which, and what to do
        raise ValueError(f"{path}: not a training checkpoint this run can resume ({error}); "
                         f"delete it to train from the start") from error

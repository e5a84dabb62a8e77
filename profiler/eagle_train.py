"""Training the EAGLE head on the target's own features, and measuring its chains.

Loss per depth d of the chain (`eagle_chain.chain_passes`, training-time test): smooth-L1 between
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
import torch.nn.functional as F

from profiler.drafters import NgramDrafter
from profiler.eagle import EagleHead, head_state, unit_rms, unit_rms_blocks
from profiler.eagle_chain import chain_passes
from profiler.model import LlamaModel
from simulator.draft_tree import TreeShape
from traces import atomic_write

#: The format name inside a training checkpoint (`train_head(checkpoint=...)`).
CHECKPOINT_FORMAT = "spectune-eagle-train-checkpoint/1"


@dataclass(frozen=True)
class TrainSpec:
    """How the head is trained (saved with the weights)."""

    epochs: int = 4
    lr: float = 2e-3
    warmup_steps: int = 20
    sequences_per_step: int = 4
    depths: int = 3  # chain depths trained on (1: plain EAGLE teacher forcing)
    depth_decay: float = 0.8
    cls_weight: float = 1.0
    window: int = 512  # the last `window` positions of a sequence (attention span in training)
    grad_clip: float = 1.0
    seed: int = 0
    feature_noise: float = 0.0  # half-width of U(-a, a) added to the unit-RMS input features
    layer_init: str = "random"  # or "last": the layer starts as the target's last layer

    def __post_init__(self) -> None:
        if not 0.0 <= self.feature_noise < 10.0:
            raise ValueError(f"feature_noise is the half-width of the uniform noise on unit-RMS "
                             f"features, in [0, 10); got {self.feature_noise}")
        if self.layer_init not in LAYER_INITS:
            raise ValueError(f"layer_init must be one of {', '.join(LAYER_INITS)}; "
                             f"got {self.layer_init!r}")


#: How the head's decoder layer starts: "random" (near identity, `init_head`) or "last" (the
#: target's last layer, its output projections rescaled to the unit-RMS stream, `init_head`).
LAYER_INITS = ("random", "last")


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


def target_probs(head: EagleHead, features: torch.Tensor) -> torch.Tensor:
    """The target's distribution over the draft vocabulary at each feature (renormalised)."""
    with torch.no_grad():
        return torch.softmax(head.draft_logits(features).float(), dim=-1)


def noisy(features: torch.Tensor, width: float, generator: torch.Generator | None,
          block: int | None = None) -> torch.Tensor:
    """unit_rms(features) (per `block` columns: fused layers) + U(-width, width), drawn from
    `generator` (the features if width 0)."""
    if width <= 0:
        return features
    noise = torch.rand(features.shape, generator=generator, dtype=torch.float32)
    scaled = unit_rms_blocks(features, block or features.shape[-1])
    return scaled + ((2 * noise - 1) * width).to(features)


def sequence_loss(head: EagleHead, tokens: torch.Tensor, features: torch.Tensor,
                  spec: TrainSpec, first_base: int = 0, generator: torch.Generator | None = None
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted loss of one sequence's chains from base `first_base` on (the prompt before it
    is context only), and per depth the share of draft argmaxes equal to the target's (what
    greedy acceptance needs). The chains read the features with `spec.feature_noise` (from
    `generator`); the targets are the clean ones."""
    p = target_probs(head, features[first_base + 1 :])
    hidden = head.config.shape.hidden
    inputs = noisy(features, spec.feature_noise, generator, hidden)
    total, stats, weights = 0.0, {}, 0.0
    for depth, rows, predicted in chain_passes(head, tokens, inputs, spec.depths, first_base):
        if depth == 1:
            predicted = predicted[first_base:]
            rows = slice(first_base, rows.stop)
        lo, hi = rows.start + depth, rows.stop + depth  # predicted[j] ~ f at base + depth
        offset = first_base + 1  # p[0] is the target's at position first_base + 1
        want, want_p = unit_rms(features[lo:hi, -hidden:]), p[lo - offset : hi - offset]
        reg = F.smooth_l1_loss(predicted, want)
        logq = torch.log_softmax(head.draft_logits(predicted).float(), dim=-1)
        cls = -(want_p * logq).sum(dim=-1).mean()
        w = spec.depth_decay ** (depth - 1)
        total = total + w * (reg + spec.cls_weight * cls)
        weights += w
        stats[f"match{depth}"] = float((logq.argmax(-1) == want_p.argmax(-1)).float().mean())
        stats[f"reg{depth}"], stats[f"cls{depth}"] = float(reg.detach()), float(cls.detach())
    return total / weights, stats


def windowed(item: tuple, window: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(tokens, features, first base) of a (tokens, features[, start]) sequence cut to its last
    `window` positions: the loss covers bases from the first base on."""
    tokens, features, *prompt = item
    cut = max(tokens.shape[0] - window, 0)
    first_base = max(prompt[0] - cut - 1, 0) if prompt else 0
    return tokens[cut:], features[cut:], first_base


@dataclass
class PackedBatch:
    """Several sequences one after another, each followed by `pad` rows (token 0, feature 0),
    so that one set of chain passes (`chain_passes` with segments) covers them all.

    `segments`/`positions`: each row's sequence and position in it; `lengths` and
    `first_bases` per sequence (first bases relative to the sequence's start)."""

    tokens: torch.Tensor
    features: torch.Tensor
    segments: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    first_bases: torch.Tensor

    @classmethod
    def of(cls, sequences: Sequence[tuple[torch.Tensor, torch.Tensor, int]], pad: int
           ) -> PackedBatch:
        """Pack `windowed` sequences (all on one device)."""
        device = sequences[0][0].device
        tokens, features, segments, positions = [], [], [], []
        for index, (t, f, _) in enumerate(sequences):
            n = t.shape[0]
            tokens += [t, t.new_zeros(pad)]
            features += [f, f.new_zeros(pad, f.shape[1])]
            segments.append(torch.full((n + pad,), index, dtype=torch.int64, device=device))
            positions.append(torch.arange(n + pad, device=device))

        def ints(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(torch.cat(tokens), torch.cat(features), torch.cat(segments),
                   torch.cat(positions), ints([t.shape[0] for t, _, _ in sequences]),
                   ints([b for _, _, b in sequences]))


def packed_loss(head: EagleHead, batch: PackedBatch, spec: TrainSpec,
                generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The mean over the packed sequences of `sequence_loss`, in one set of chain passes (on a
    GPU, ~1/len(sequences) of the kernel launches), and per sequence its `sequence_loss` stats
    and loss as tensors [sequences] (a depth a sequence is too short for: NaN, as it is absent
    from `sequence_loss`'s stats). The same function up to rounding (tests/profiler/
    test_eagle_packed.py); the noise, if any, is drawn in another order."""
    hidden = head.config.shape.hidden
    features, segments = batch.features, batch.segments
    count = batch.lengths.shape[0]
    p = target_probs(head, features[1:])  # p[i]: the target's at position i + 1
    inputs = noisy(features, spec.feature_noise, generator, hidden)
    local = batch.positions
    first = batch.first_bases[segments]
    length = batch.lengths[segments]
    total = torch.zeros(count, dtype=torch.float32, device=features.device)
    weights = torch.zeros_like(total)
    stats: dict[str, torch.Tensor] = {}
    for depth, rows, predicted in chain_passes(head, batch.tokens, inputs, spec.depths,
                                               segments=segments, positions=local):
        bases = torch.arange(rows.start, rows.stop, device=features.device)
        valid = (local[bases] >= first[bases]) & (local[bases] + depth <= length[bases] - 1)
        seg = segments[bases][valid]
        predicted, bases = predicted[valid], bases[valid]
        want, want_p = unit_rms(features[bases + depth, -hidden:]), p[bases + depth - 1]
        reg_rows = F.smooth_l1_loss(predicted, want, reduction="none").mean(dim=-1)
        logq = torch.log_softmax(head.draft_logits(predicted).float(), dim=-1)
        cls_rows = -(want_p * logq).sum(dim=-1)
        match_rows = (logq.argmax(-1) == want_p.argmax(-1)).float()
        rows_per = torch.zeros_like(total).index_add_(0, seg, torch.ones_like(reg_rows))
        present = rows_per > 0
        reg, cls, match = (_segment_mean(v, seg, rows_per) for v in (reg_rows, cls_rows,
                                                                     match_rows))
        w = spec.depth_decay ** (depth - 1)
        total = total + w * (reg + spec.cls_weight * cls)  # 0 where the depth is absent
        weights = weights + present * w
        for name, value in (("match", match), ("reg", reg), ("cls", cls)):
            stats[f"{name}{depth}"] = torch.where(present, value.detach(), torch.nan)
    per_sequence = total / weights
    stats["loss"] = per_sequence.detach()
    return per_sequence.mean(), stats


def _segment_mean(values: torch.Tensor, segments: torch.Tensor, counts: torch.Tensor
                  ) -> torch.Tensor:
    """Per segment the mean of its rows' `values` (0 for a segment without rows)."""
    sums = torch.zeros_like(counts).index_add(0, segments, values)
    return sums / counts.clamp_min(1)


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

@torch.no_grad()
def eagle_runs(head: EagleHead, target: LlamaModel, prompt: Sequence[int], output: Sequence[int],
               max_run: int, features: torch.Tensor | None = None,
               lookup: NgramDrafter | None = None, lookup_min_match: int = 2,
               tree: TreeShape | None = None) -> tuple[np.ndarray, torch.Tensor]:
    """run[t] of the head's greedy chain from the true prefix at every output position t
    (run[0] = 0: the prefill emits it), and the first draft's distribution over the draft
    vocabulary at each t [N, V_d] (row 0: the prefill's position, never drafted).

    The chain at t starts from history prompt + output[:t]: its depth-d draft comes from base
    b = P + t - 2 and predicts output[t + d - 1]; the run is the matching prefix, capped at
    `max_run`. With a `lookup` (the `eagle+ngram` drafter), the draft of output[s] is the
    lookup's token wherever it matched a suffix of >= `lookup_min_match` tokens of the true
    history before s (the live chain's history while its drafts match), else the head's.

    With a draft `tree` (profiler/tree_layout.py) the run is how deep the tree follows the
    target's greedy path: the rank of the true token under the head's distribution at each
    depth (the chain fed the true tokens, as the tree's node on that path is) names the path.
    """
    if tree is not None:
        if lookup is not None:
            raise ValueError("a draft tree takes the head's candidates only: no lookup with it")
        max_run = min(max_run, tree.depth)
        ranks = np.full((len(output), max_run), np.iinfo(np.int32).max, dtype=np.int64)
        in_draft = draft_index(head)
    from profiler.eagle_data import target_features

    tokens_list = [int(t) for t in prompt] + [int(t) for t in output]
    n_prompt, n_out = len(prompt), len(output)
    if features is None:
        features = target_features(target, tokens_list[:-1] if n_out > 0 else tokens_list)
    features = features.to(head.config.device, head.config.dtype)  # the head's device (a GPU)
    tokens = torch.tensor(tokens_list, dtype=torch.int64, device=features.device)
    tokens = tokens[:-1]  # x_{N-1} predicts nothing
    matches = np.zeros((n_out, max_run), dtype=bool)
    first = None
    still = np.ones(n_out, dtype=bool)
    still[0] = False
    first_base = max(n_prompt - 1, 0)  # t >= 1 needs b = P + t - 2 >= P - 1
    truth = torch.tensor([int(t) for t in output], dtype=torch.int64)
    looked_up = None
    if lookup is not None:
        token, length = lookup.next_tokens(prompt, output)
        looked_up = torch.as_tensor(np.where(length >= lookup_min_match, token, -1))
    for depth, rows, predicted in chain_passes(head, tokens, features, max_run, first_base):
        logits = head.draft_logits(predicted).float()
        drafts = head.vocab_ids[logits.argmax(dim=-1)].cpu()
        bases = torch.arange(rows.start, rows.stop)
        t = bases - n_prompt + 2  # chain start
        keep = (t >= 1) & (t + depth - 1 < n_out)
        if tree is not None:
            store_ranks(ranks, logits[keep.to(logits.device)].cpu(), in_draft,
                         truth, t[keep], depth)
        t, drafts = t[keep], drafts[keep]
        if looked_up is not None:
            from_lookup = looked_up[t + depth - 1]
            drafts = torch.where(from_lookup >= 0, from_lookup, drafts)
        ok = (drafts == truth[t + depth - 1]).numpy()
        matches[t.numpy(), depth - 1] = ok
        if depth == 1:
            first = torch.zeros(n_out, logits.shape[1])
            rows_t = bases - n_prompt + 2
            sel = (rows_t >= 0) & (rows_t < n_out)
            first[rows_t[sel]] = torch.softmax(logits[sel.to(logits.device)], dim=-1).cpu()
        still[t.numpy()] &= ok
        if not still.any() and tree is None:  # a tree's runners-up may still go deeper
            break
    run = np.zeros(n_out, dtype=np.int32)
    for t in range(1, n_out):
        if tree is not None:
            run[t] = tree.run(ranks[t])
            continue
        m = matches[t]
        run[t] = max_run if m.all() else int(np.argmin(m))
    return run, first


def draft_index(head: EagleHead) -> torch.Tensor:
    """[target vocab]: each token's column in the head's draft vocabulary, -1 outside it (CPU)."""
    index = torch.full((head.target.config.shape.vocab,), -1, dtype=torch.int64)
    index[head.vocab_ids.cpu()] = torch.arange(head.draft_vocab)
    return index


def eagle_ranks(head: EagleHead, target: LlamaModel, prompt: Sequence[int],
                output: Sequence[int], depth: int) -> np.ndarray:
    """ranks[t, d - 1]: the true token's rank under the head's depth-d distribution of the chain
    from output position t (fed the true tokens, as a draft tree's node on the target's greedy
    path is); the int32 maximum outside the draft vocabulary. What a tree shape is chosen and
    scored from (simulator/draft_tree.py)."""
    from profiler.eagle_data import target_features

    tokens = [*prompt, *output]
    features = target_features(target, tokens[:-1]).to(head.config.device, head.config.dtype)
    ranks = np.full((len(output), depth), np.iinfo(np.int32).max, dtype=np.int64)
    in_draft, truth = draft_index(head), torch.tensor(list(output))
    fed = torch.tensor(tokens[:-1], device=features.device)
    with torch.no_grad():
        for d, rows, predicted in chain_passes(head, fed, features, depth,
                                               max(len(prompt) - 1, 0)):
            t = torch.arange(rows.start, rows.stop) - len(prompt) + 2
            keep = (t >= 1) & (t + d - 1 < len(output))
            logits = head.draft_logits(predicted).float()[keep.to(predicted.device)].cpu()
            store_ranks(ranks, logits, in_draft, truth, t[keep], d)
    return ranks


def store_ranks(ranks: np.ndarray, logits: torch.Tensor, in_draft: torch.Tensor,
                 truth: torch.Tensor, t: torch.Tensor, depth: int) -> None:
    """ranks[t, depth - 1] = how many draft tokens the head puts above the true next token
    (0: its top-1); a token outside the draft vocabulary keeps the int32 maximum (never drafted)."""
    index = in_draft[truth[t + depth - 1]]
    known = index >= 0
    own = logits.gather(1, index.clamp_min(0)[:, None])
    above = (logits > own).sum(dim=1)
    ranks[t[known].numpy(), depth - 1] = above[known].numpy()

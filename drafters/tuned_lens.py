"""A least-squares "tuned lens" for early exit: map layer L's output to the last layer's.

Plain early exit reads the target's layer-L residual stream with the final norm and head, which
were trained for the last layer's stream: below ~24 of SmolLM2's 30 layers its drafts are rarely
accepted. A tuned lens (Belrose et al. 2023, arXiv:2303.08112) learns an affine map per layer so
the head reads it better; theirs is trained to minimise KL to the final logits, ours is the
closed-form ridge regression from layer L's output to the last layer's output (both before the
final norm) on the target's own hidden states: h_last ~ h_L W + b.

Fitting text: teacher-forced token sequences the caller chooses (`spectune record` and
`validate` use the Spec-Bench questions with even ids, so acceptance measured on odd ids is
held out). The map is saved as .npz with what it was fitted on, and loaded by
`early-exit:L:lens`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from models.early_exit import early_exit_model
from models.llama import LlamaModel
from traces import atomic_write

RIDGE = 1e-2  # relative to the mean diagonal of X^T X: keeps rare directions near identity


@torch.no_grad()
def hidden_pairs(target: LlamaModel, layers: int, sequences: Sequence[Sequence[int]],
                 max_tokens: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer-L outputs, last-layer outputs) [N, hidden] in float64 over every token of every
    sequence (each cut to its first `max_tokens`)."""
    exit_model = early_exit_model(target, layers)
    device = target.config.device
    xs, ys = [], []
    for seq in sequences:
        tokens = torch.tensor(list(seq)[:max_tokens], dtype=torch.int64, device=device)
        xs.append(exit_model([tokens], [exit_model.new_cache(len(tokens))], logits="hidden")[0])
        ys.append(target([tokens], [target.new_cache(len(tokens))], logits="hidden")[0])
    return torch.cat(xs).double(), torch.cat(ys).double()


def fit_lens(x: torch.Tensor, y: torch.Tensor, ridge: float = RIDGE
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression y ~ x W + b, shrinking W towards the identity (the residual stream's
    own map); returns (W [hidden, hidden], b [hidden]) in float64."""
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"need x and y of the same [N, hidden] shape, got {tuple(x.shape)} "
                         f"and {tuple(y.shape)}")
    mx, my = x.mean(dim=0), y.mean(dim=0)
    xc, yc = x - mx, y - my
    gram = xc.T @ xc
    lam = ridge * float(gram.diagonal().mean())
    eye = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    # minimise |xc W - yc|^2 + lam |W - I|^2  =>  (xc^T xc + lam I) W = xc^T yc + lam I
    weight = torch.linalg.solve(gram + lam * eye, xc.T @ yc + lam * eye)
    return weight, my - mx @ weight


def lens_path(target: LlamaModel, layers: int, cache_dir: str | os.PathLike[str] | None = None
              ) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spectune" / "lens"
    folder = Path(cache_dir) if cache_dir is not None else base
    return folder / f"{target.config.shape.name}-L{layers}.npz"


def save_lens(path: Path, weight: torch.Tensor, bias: torch.Tensor, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        np.savez(handle, weight=weight.cpu().numpy(), bias=bias.cpu().numpy(),
                 meta=np.asarray(json.dumps(meta)))


def load_lens(path: Path, target: LlamaModel, layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The saved map, checked against the target's shape and L."""
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        weight, bias = data["weight"], data["bias"]
    hidden = target.config.shape.hidden
    if meta.get("target") != target.config.shape.name or meta.get("layers") != layers:
        raise ValueError(f"{path}: a lens for {meta.get('target')} layer {meta.get('layers')}, "
                         f"not {target.config.shape.name} layer {layers}")
    if weight.shape != (hidden, hidden) or bias.shape != (hidden,):
        raise ValueError(f"{path}: map of shape {weight.shape}, need ({hidden}, {hidden})")
    dtype, device = target.config.dtype, target.config.device
    return (torch.as_tensor(weight, dtype=dtype, device=device),
            torch.as_tensor(bias, dtype=dtype, device=device))


def saved_lens(target: LlamaModel, layers: int,
               fit_text: Callable[[], tuple[list[list[int]], str]] | None = None,
               cache_dir: str | os.PathLike[str] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The saved lens of layer `layers` (`early-exit:L:lens`). On a miss it is fitted on
    `fit_text()` = (token sequences, what they are) and saved."""
    path = lens_path(target, layers, cache_dir)
    if not path.exists():
        if fit_text is None:
            raise ValueError(f"no tuned lens at {path}, and no text to fit one on: fit it with "
                             "the real model (spectune record --drafter early-exit:L:lens)")
        sequences, described = fit_text()
        x, y = hidden_pairs(target, layers, sequences)
        weight, bias = fit_lens(x, y)
        digest = hashlib.sha256(json.dumps(sequences).encode()).hexdigest()[:16]
        save_lens(path, weight, bias, {"target": target.config.shape.name, "layers": layers,
                                       "tokens": int(x.shape[0]), "ridge": RIDGE,
                                       "fitted_on": described,
                                       "sequences_sha256_16": digest})
    return load_lens(path, target, layers)

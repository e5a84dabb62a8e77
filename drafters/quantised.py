"""`quant:BITS`: the target itself with its weights rounded to BITS bits, as a drafter.

Not a cheaper drafter (it runs at the target's cost here: the weights are rounded, then stored
back in the target's dtype): a draft of known, tunable quality for validation experiments, the
way a quantised copy of the target drafts in self-speculation. Rounding is asymmetric per group
of `group` consecutive input rows of every weight matrix (a scale and a minimum per group, the
layout of llama.cpp's Q4_1), applied to every 2-D weight including the embedding / tied head;
norms keep full precision.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from drafters.model import ModelDrafter
from drafters.registry import DraftSetup, Spelling, register
from models.llama import LlamaModel

GROUP = 32


def fake_quantize(weight: torch.Tensor, bits: int, group: int = GROUP) -> torch.Tensor:
    """`weight` [in, out] rounded to 2**bits levels per group of `group` input rows, per column."""
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in 1..16, got {bits}")
    rows, cols = weight.shape
    if rows % group:
        raise ValueError(f"{rows} input rows do not split into groups of {group}")
    w = weight.float().reshape(rows // group, group, cols)
    low = w.amin(dim=1, keepdim=True)
    step = (w.amax(dim=1, keepdim=True) - low) / (2**bits - 1)
    step = torch.where(step > 0, step, torch.ones_like(step))
    levels = torch.round((w - low) / step).clamp(0, 2**bits - 1)
    return (levels * step + low).reshape(rows, cols).to(weight.dtype)


def quantized_copy(target: LlamaModel, bits: int, group: int = GROUP) -> LlamaModel:
    """A copy of `target` with every 2-D weight fake-quantised (norms untouched)."""
    model = copy.deepcopy(target)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(fake_quantize(p, bits, group))
    shape = model.config.shape
    model.config = replace(model.config, shape=replace(
        shape, name=f"{shape.name}-Q{bits}", source=f"{shape.name} fake-quantised to {bits} bits, "
        f"groups of {group}"))
    return model


class QuantDrafter(ModelDrafter):
    """Greedy chains from a fake-quantised copy of the target (see the module doc)."""

    def __init__(self, target: LlamaModel, bits: int, group: int = GROUP,
                 cache_tokens: int = 256) -> None:
        super().__init__(quantized_copy(target, bits, group), f"quant:{bits}", cache_tokens)


@register("quant", "quant:BITS")
def build_quant(spelling: Spelling, setup: DraftSetup) -> QuantDrafter:
    """"quant:BITS" with BITS in 1..16."""
    bits = spelling.arg
    if not bits.isdigit() or not 1 <= int(bits) <= 16:
        raise ValueError(f"drafter {spelling.spec!r}: write quant:BITS with BITS in 1..16, e.g. "
                         "quant:4")
    return QuantDrafter(setup.target, int(bits))

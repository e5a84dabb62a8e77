"""Drafter `early-exit:L[:lens]`: self-speculation with the target's first L layers.

The drafter is a `ModelDrafter` over a model that shares the target's first layers, final norm
and head (no weight copied); ":lens" maps layer L's output towards the last layer's first
(drafters/tuned_lens.py), which plain early exit needs below ~24 of SmolLM2's 30 layers.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from drafters.model import ModelDrafter
from drafters.registry import DraftSetup, Spelling, register
from drafters.tuned_lens import saved_lens
from models.early_exit import early_exit_model
from models.llama import LlamaModel


class EarlyExitDrafter(ModelDrafter):
    """Self-speculation: the target's first L layers draft (see `early_exit_model`)."""

    def __init__(self, target: LlamaModel, layers: int, cache_tokens: int = 256) -> None:
        super().__init__(early_exit_model(target, layers), f"early-exit:{layers}", cache_tokens)


@register("early-exit", "early-exit:L[:lens]")
def build_early_exit(spelling: Spelling, setup: DraftSetup) -> EarlyExitDrafter:
    """"early-exit:L" or "early-exit:L:lens" (L: the layers kept)."""
    layers, _, lens = spelling.arg.partition(":")
    if not layers.isdigit() or lens not in ("", "lens"):
        raise ValueError(f"drafter {spelling.spec!r}: write early-exit:L or early-exit:L:lens "
                         "with L the layers kept")
    if lens:
        return lens_drafter(setup.target, int(layers), setup.lens_text)
    return EarlyExitDrafter(setup.target, int(layers))


def lens_drafter(target: LlamaModel, layers: int,
                 fit_text: Callable[[], tuple[list[list[int]], str]] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> EarlyExitDrafter:
    """`early-exit:L:lens`: the early exit reading its saved lens (fitted on `fit_text()` and
    saved on a miss, drafters/tuned_lens.py)."""
    drafter = EarlyExitDrafter(target, layers)
    drafter.model.exit_map = saved_lens(target, layers, fit_text, cache_dir)
    drafter.name = f"early-exit:{layers}:lens"
    return drafter

"""Drafters by name: each drafter module registers the spellings it builds (`@register`).

A spelling is KIND[@WEIGHTS][:ARG], e.g. "ngram", "early-exit:4:lens", "eagle@int8",
"model:Llama-68M": what the CLI takes and what records and exports name. Importing the
`drafters` package imports every drafter module, so adding a drafter is adding one module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from drafters.base import Drafter

if TYPE_CHECKING:
    from models.llama import LlamaModel
    from simulator.catalog import ModelShape

__all__ = ["DraftSetup", "DrafterKind", "Spelling", "drafter_kinds", "make_drafter", "register"]


@dataclass(frozen=True)
class Spelling:
    """A drafter's name taken apart: "eagle@int8:h.npz" is kind "eagle", weights "int8", arg
    "h.npz" (`weights` is None without an "@")."""

    spec: str
    kind: str
    weights: str | None
    arg: str


@dataclass(frozen=True)
class DraftSetup:
    """What a builder may use besides the spelling (see `make_drafter`)."""

    target: LlamaModel
    draft_model: LlamaModel | None = None
    shapes: Mapping[str, ModelShape] | None = None
    seed: int = 0
    lens_text: Callable[[], tuple[list[list[int]], str]] | None = None
    vocab_check: bool = True


Builder = Callable[[Spelling, DraftSetup], Drafter]


@dataclass(frozen=True)
class DrafterKind:
    """One registered kind: how users spell it (`usage`, shown when a name is unknown), whether
    it takes "@WEIGHTS", and its builder."""

    name: str
    usage: str
    build: Builder
    weights: bool = False


_KINDS: dict[str, DrafterKind] = {}


def register(name: str, usage: str, *, weights: bool = False) -> Callable[[Builder], Builder]:
    """Decorator: `build(spelling, setup)` makes the drafters of kind `name`."""

    def add(build: Builder) -> Builder:
        if name in _KINDS and _KINDS[name].build is not build:
            raise TypeError(f"drafter kind {name!r} is already registered")
        _KINDS[name] = DrafterKind(name, usage, build, weights)
        return build

    return add


def drafter_kinds() -> list[DrafterKind]:
    """Every registered kind, by name."""
    return [_KINDS[name] for name in sorted(_KINDS)]


def make_drafter(
    spec: str,
    target: LlamaModel,
    *,
    draft_model: LlamaModel | None = None,
    shapes: Mapping[str, ModelShape] | None = None,
    seed: int = 0,
    lens_text: Callable[[], tuple[list[list[int]], str]] | None = None,
    vocab_check: bool = True,
) -> Drafter:
    """A drafter by name: "ngram", "ngram:MIN-MAX", "early-exit:L", "quant:BITS", "eagle" (the
    shipped EAGLE head; "eagle:PATH" another .npz; "eagle@int8" its weights in int8,
    models/int8_weight.py; "eagle+ngram" with the n-gram lookup; "eagle-tree" drafting the
    shipped static tree, drafters/tree_layout.py) or "model:<shape name>".

    "model:<name>" uses `draft_model` if given, else random weights (`seed`) of the shape named in
    `shapes` or the catalog, on the target's dtype and device (random weights: for timing and for
    losslessness tests; real weights come from GGUF). "early-exit:L:lens" adds a tuned lens
    (drafters/tuned_lens.py), fitted on `lens_text()` if none is saved yet. `vocab_check=False`
    lets a draft model's vocabulary differ from the target's: only replay mode, where tokens and
    acceptance come from a trace and the passes only keep time, can use such a pair.
    """
    head, _, arg = spec.partition(":")
    kind, at, weights = head.partition("@")
    entry = _KINDS.get(kind)
    if entry is None or (at and not entry.weights):
        known = ", ".join(k.usage for k in drafter_kinds())
        raise ValueError(f"unknown drafter {spec!r}; known: {known}")
    spelling = Spelling(spec, kind, weights if at else None, arg)
    setup = DraftSetup(target, draft_model, shapes, seed, lens_text, vocab_check)
    return entry.build(spelling, setup)

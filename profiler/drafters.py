"""Drafters by name: n-gram prompt lookup (here), a draft model and an early exit (model_drafter).

The interface is `profiler.draft_base.Drafter`; `make_drafter` builds one from a name such as
"ngram", "early-exit:4" or "model:Llama-68M", the spelling the CLI and the records use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from profiler.draft_base import DraftChain, Drafter, StopRule
from profiler.model_drafter import EarlyExitDrafter, ModelDrafter, early_exit_model
from simulator.catalog import ModelShape, get_model

__all__ = [
    "DraftChain",
    "Drafter",
    "EarlyExitDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "StopRule",
    "early_exit_model",
    "make_drafter",
]


class NgramDrafter(Drafter):
    """Prompt lookup (Saxena 2023; transformers' `prompt_lookup_num_tokens`, vLLM's ngram).

    Find the longest suffix n-gram (max_n down to min_n tokens) of prompt + generated text that
    occurred earlier, at its earliest occurrence (as transformers does), and propose the tokens
    that followed it there. Model-free: no pass, no distribution. The stop rule sees top-1 = 1.0
    and entropy = 0.0 (the lookup is certain of its proposal), and the signals treat the draft
    distribution as one-hot on the proposed token.
    """

    model_free = True

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.name = "ngram" if (min_n, max_n) == (1, 3) else f"ngram:{min_n}-{max_n}"

    def lookup(self, history: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the earliest earlier occurrence of the longest suffix."""
        return self.match(history, k)[0]

    def match(self, history: Sequence[int], k: int) -> tuple[list[int], int]:
        """`lookup`'s proposal and the length of the suffix it matched (0: no match). A longer
        match is likelier right: the hybrid EAGLE drafter takes the lookup's token on it."""
        tokens = np.asarray(history, dtype=np.int64)
        size = tokens.size
        if k <= 0 or size < 2:
            return [], 0
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            # windows starting at j = 0 .. size - n - 1: earlier than the suffix, with a follower
            windows = sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[size - n :]).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n
                return tokens[start : start + k].tolist(), n
        return [], 0

    def next_tokens(self, prompt: Sequence[int], output: Sequence[int]
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Per output position s >= 1: the lookup's proposal for output[s] from the true history
        before it (-1: none) and the suffix length it matched (0: none); position 0: -1, 0."""
        history = [*prompt, *output]
        token = np.full(len(output), -1, dtype=np.int64)
        length = np.zeros(len(output), dtype=np.int64)
        for s in range(1, len(output)):
            proposal, n = self.match(history[: len(prompt) + s], 1)
            if proposal:
                token[s], length[s] = proposal[0], n
        return token, length

    def propose(
        self,
        request_ids: Sequence[int],
        histories: Sequence[Sequence[int]],
        ks: Sequence[int],
        stop: StopRule | None = None,
        keep_probs: bool = False,
    ) -> list[DraftChain]:
        chains = []
        for row, (history, k) in enumerate(zip(histories, ks)):
            chain = DraftChain()
            for depth, token in enumerate(self.lookup(history, k)):
                chain.tokens.append(token)
                chain.top1.append(1.0)
                chain.entropy.append(0.0)
                if stop is not None and stop(row, depth, 1.0, 0.0):
                    break
            chains.append(chain)
        return chains


def make_drafter(
    spec: str,
    target,
    *,
    draft_model=None,
    shapes: Mapping[str, ModelShape] | None = None,
    seed: int = 0,
    lens_text: Callable[[], tuple[list[list[int]], str]] | None = None,
    vocab_check: bool = True,
) -> Drafter:
    """A drafter by name: "ngram", "ngram:MIN-MAX", "early-exit:L", "quant:BITS", "eagle" (the
    shipped EAGLE head; "eagle:PATH" another .npz; "eagle@int8" its weights in int8,
    profiler/int8_weight.py; "eagle+ngram" with the n-gram lookup; "eagle-tree" drafting the
    shipped static tree, profiler/tree_layout.py) or "model:<shape name>".

    "model:<name>" uses `draft_model` if given, else random weights (`seed`) of the shape named in
    `shapes` or the catalog, on the target's dtype and device (random weights: for timing and for
    losslessness tests; real weights come from GGUF). "early-exit:L:lens" adds a tuned lens
    (profiler/tuned_lens.py), fitted on `lens_text()` if none is saved yet. `vocab_check=False`
    lets a draft model's vocabulary differ from the target's: only replay mode, where tokens and
    acceptance come from a trace and the passes only keep time, can use such a pair.
    """
    kind, _, arg = spec.partition(":")
    if kind == "ngram":
        if not arg:
            return NgramDrafter()
        lo, _, hi = arg.partition("-")
        if not (lo.isdigit() and hi.isdigit()):
            raise ValueError(f"drafter {spec!r}: write ngram:MIN-MAX, e.g. ngram:1-3")
        return NgramDrafter(int(lo), int(hi))
    if kind == "early-exit":
        layers, _, lens = arg.partition(":")
        if not layers.isdigit() or lens not in ("", "lens"):
            raise ValueError(f"drafter {spec!r}: write early-exit:L or early-exit:L:lens with L "
                             "the layers kept")
        if lens:
            from profiler.tuned_lens import lens_drafter

            return lens_drafter(target, int(layers), lens_text)
        return EarlyExitDrafter(target, int(layers))
    if kind == "quant":
        if not arg.isdigit() or not 1 <= int(arg) <= 16:
            raise ValueError(f"drafter {spec!r}: write quant:BITS with BITS in 1..16, e.g. quant:4")
        from profiler.quant_drafter import QuantDrafter

        return QuantDrafter(target, int(arg))
    base, at, weights = kind.partition("@")
    if base in ("eagle", "eagle+ngram", "eagle-tree"):
        from profiler.eagle import load_head
        from profiler.eagle_drafter import EagleDrafter
        from profiler.tree_layout import SHIPPED_TREE
        from simulator.draft_tree import load_tree

        if at and weights != "int8":
            raise ValueError(f"drafter {spec!r}: the head's weights can be {base}@int8, not "
                             f"@{weights}")
        head = load_head(target, Path(arg) if arg else None)
        if weights:
            head.quantize()
        lookup = NgramDrafter() if base == "eagle+ngram" else None
        tree = load_tree(SHIPPED_TREE)[0] if base == "eagle-tree" else None
        return EagleDrafter(head, name=spec, lookup=lookup, tree=tree)
    if kind == "model":
        if draft_model is None:
            draft_model = _random_draft(arg, target, shapes, seed)
        vocab, target_vocab = draft_model.config.shape.vocab, target.config.shape.vocab
        if vocab_check and vocab != target_vocab:
            raise ValueError(f"drafter {spec!r}: vocabulary {vocab} != the target's {target_vocab}")
        return ModelDrafter(draft_model, name=spec)
    raise ValueError(f"unknown drafter {spec!r}; known: ngram, early-exit:L[:lens], quant:BITS, "
                     "eagle[@int8][:PATH], eagle+ngram[@int8][:PATH], eagle-tree[@int8][:PATH], "
                     "model:<shape name>")


def _random_draft(name: str, target, shapes: Mapping[str, ModelShape] | None, seed: int):
    """Random weights of a named shape, in the target's dtype and on its device."""
    from profiler.model import LlamaModel, config_for

    if not name:
        raise ValueError("drafter 'model:' needs a shape name, e.g. model:Llama-68M")
    shape = (shapes or {}).get(name) or get_model(name)
    config = config_for(shape, dtype=target.config.dtype, device=target.config.device)
    return LlamaModel.random(config, seed)

"""Prompt lookup: propose the tokens that followed the longest earlier match of the text's suffix.

Model-free (no pass, no distribution), so it costs nothing to draft; the EAGLE hybrid and the
recorder use its `match`/`next_tokens` too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from drafters.base import DraftChain, Drafter, StopRule
from drafters.registry import DraftSetup, Spelling, register


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


@register("ngram", "ngram")
def build_ngram(spelling: Spelling, setup: DraftSetup) -> NgramDrafter:
    """"ngram" (suffixes of 1 to 3 tokens) or "ngram:MIN-MAX"."""
    if not spelling.arg:
        return NgramDrafter()
    lo, _, hi = spelling.arg.partition("-")
    if not (lo.isdigit() and hi.isdigit()):
        raise ValueError(f"drafter {spelling.spec!r}: write ngram:MIN-MAX, e.g. ngram:1-3")
    return NgramDrafter(int(lo), int(hi))

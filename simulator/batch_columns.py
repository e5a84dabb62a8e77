"""The running batch's per-step sums, kept across fast-path segments.

A model-free chain drafter's step is priced from four sums over the batch (simulator/step_cost:
`chain_steps_s`): requests, drafts, cached tokens and causal pairs. Each running request's
walk (simulator.request.walk_chain) fixes its share of every sum for all its remaining steps,
so the replica keeps the sums themselves, one array per sum indexed by decode step: a
request's share is added once when its walk starts and taken out when it finishes or walks
anew (a new k). A segment then reads its steps' sums as slices, instead of stacking every
request's walk into a (requests x steps) matrix and summing it again segment after segment.
The sums are integers, so the order they are added in changes nothing: the same integers
reach the latency model.
"""

from __future__ import annotations

import numpy as np

from simulator.request import RequestState

#: the columns: tokens generated before each step (and after the last), drafts, twice the
#: verify pass's causal pairs, and requests whose step saw a first rejection
COLUMNS = ("tokens", "drafted", "pairs2", "rejected")


class BatchColumns:
    """Sums over the running requests' walks, by decode step from `now` (steps committed)."""

    __slots__ = ("_origin", "_sums", "now")

    def __init__(self, capacity: int = 4096) -> None:
        self.now = 0  # decode steps committed so far
        self._origin = 0  # the step index of the arrays' first entry
        self._sums = np.zeros((len(COLUMNS), capacity), dtype=np.int64)

    def window(self, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Views of the next `steps` steps' sums (tokens: steps + 1 entries, the last after
        the last step): valid until the sums next change."""
        at = self.now - self._origin
        sums = self._sums
        return (sums[0, at: at + steps + 1], sums[1, at: at + steps],
                sums[2, at: at + steps], sums[3, at: at + steps])

    def add(self, request: RequestState, k: int) -> None:
        """Add the request's remaining walk (from `chain_at`, drafting min(k, cap) a step)."""
        self._apply(request, k, 1)

    def remove(self, request: RequestState) -> None:
        """Take out what `add` put in for the request's walk, from where it has got to."""
        self._apply(request, request.chain_k, -1)

    def _apply(self, request: RequestState, k: int, sign: int) -> None:
        gen = request.chain[request.chain_at:]
        m = len(gen) - 1  # steps left
        at = self._room(m + 1)
        op = np.add if sign > 0 else np.subtract
        tokens, drafted, pairs2, rejected = self._sums[:, at: at + m + 1]
        op(tokens, gen, out=tokens)
        if m == 0:  # a finished walk holds its last entry only
            return
        before = gen[:-1]
        d = k if request.chain_ks is None else request.chain_ks[request.chain_at:]
        op(drafted[:m], d, out=drafted[:m])
        # (k + 1)(2 (c + 1) + k), c + 1 = prompt + g: twice the step's causal pairs
        # (step_cost.chain_segment_s)
        op(pairs2[:m], (d + 1) * (2 * (before + request.prompt_tokens) + d), out=pairs2[:m])
        # a first rejection: fewer emitted than d + 1
        op(rejected[:m], gen[1:] - before <= d, out=rejected[:m])

    def _room(self, length: int) -> int:
        """The index of step `now` in the arrays, with `length` entries from it available:
        the steps before `now` are dropped (moved out) or the arrays grown where they lack it."""
        at = self.now - self._origin
        capacity = self._sums.shape[1]
        if at + length <= capacity:
            return at
        live = self._sums[:, at:]
        sums = np.zeros((len(COLUMNS), max(capacity, 2 * length)), dtype=np.int64)
        sums[:, : live.shape[1]] = live
        self._sums, self._origin = sums, self.now
        return 0

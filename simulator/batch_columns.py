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
from simulator.step_cost import own_pairs

#: the columns: the batch's cached tokens before each step (and after the last: differences
#: give each step's emitted tokens), drafts, the verify pass's causal pairs, and requests
#: whose step saw a first rejection
COLUMNS = ("cached", "drafted", "pairs", "rejected")


class BatchColumns:
    """Sums over the running requests' walks, by decode step from `now` (steps committed)."""

    __slots__ = ("_levels", "_origin", "_sums", "now")

    def __init__(self, capacity: int = 4096, k_max: int = 0) -> None:
        """`k_max` > 0 keeps, below the sums, how many requests draft at least j tokens at
        each step (j = 1..k_max): the most drafts of a step is the number of levels some
        request reaches (a drafter that caps its drafts; k_max at least the ks drafted)."""
        self.now = 0  # decode steps committed so far
        self._origin = 0  # the step index of the arrays' first entry
        self._levels = np.arange(1, k_max + 1, dtype=np.int64)[:, None]
        self._sums = np.zeros((len(COLUMNS) + k_max, capacity), dtype=np.int64)

    def window(self, steps: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Views of the next `steps` steps' sums (cached: steps + 1 entries, the last after
        the last step), and of the requests reaching each level of drafts (k_max x steps):
        valid until the sums next change."""
        at = self.now - self._origin
        sums = self._sums
        return (sums[0, at: at + steps + 1], sums[1, at: at + steps],
                sums[2, at: at + steps], sums[3, at: at + steps],
                sums[len(COLUMNS):, at: at + steps])

    def add(self, request: RequestState, k: int) -> None:
        """Add the request's remaining walk (from `chain_at`, drafting min(k, cap) a step)."""
        self._apply(request, k, 1)

    def remove(self, request: RequestState) -> None:
        """Take out what `add` put in for the request's walk, from where it has got to."""
        self._apply(request, request.chain_k, -1)

    def _apply(self, request: RequestState, k: int, sign: int) -> None:
        start = request.chain_at
        gen = request.chain[start:]
        m = len(gen) - 1  # steps left
        at = self._room(m + 1)
        if not m:  # a finished walk: its last entry only, its KV after its last step
            self._sums[0, at] += sign * (int(gen[0]) + request.prompt_tokens - 1)
            return
        end, sums = at + m, self._sums
        c = gen + (request.prompt_tokens - 1)  # its KV before each step: prompt - 1 + g
        capped = request.chain_ks is not None
        d = request.chain_ks[start:] if capped else k  # drafts: k every step uncapped
        # a (d + 1)-token verify pass over c cached: (d + 1) c + (d + 1)(d + 2) / 2 pairs; a
        # first rejection: fewer emitted than d + 1
        shares = [(sums[0, at: end + 1], c), (sums[1, at:end], d),
                  (sums[2, at:end], (d + 1) * c[:-1] + own_pairs(d)),
                  (sums[3, at:end], gen[1:] - gen[:-1] <= d)]
        if capped and len(self._levels):  # the levels j = 1..k_max its drafts reach
            shares.append((sums[len(COLUMNS):, at:end], self._levels <= d))
        if sign > 0:  # in place: ufuncs given out= cost more calling
            for column, share in shares:
                column += share
        else:
            for column, share in shares:
                column -= share

    def _room(self, length: int) -> int:
        """The index of step `now` in the arrays, with `length` entries from it available:
        the steps before `now` are dropped (moved out) or the arrays grown where they lack it."""
        at = self.now - self._origin
        capacity = self._sums.shape[1]
        if at + length <= capacity:
            return at
        live = self._sums[:, at:]
        sums = np.zeros((len(self._sums), max(capacity, 2 * length)), dtype=np.int64)
        sums[:, : live.shape[1]] = live
        self._sums, self._origin = sums, self.now
        return 0

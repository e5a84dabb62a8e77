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

With a draft model drafting a chain, each step's draft passes are priced from sums too (pass j:
the requests drafting at least j and their cached tokens; the first pass's catch-up tokens and
causal pairs, fixed by each request's walk and its draft feed before it), so a segment builds
no per-request matrix there either.

Under vLLM's scheduler (`blocks`), each step's KV blocks held by the batch are kept too: a
request's blocks after each step of its walk are fixed by the walk and the blocks it held
when the walk was added (`walk_blocks` of simulator/scheduler_vllm.py), so a segment reads
what each step allocates as a slice, without a (requests x steps) matrix of blocks.
"""

from __future__ import annotations

import numpy as np

from simulator.kernels import compiled
from simulator.request import RequestState
from simulator.step_cost import own_pairs

#: the columns: the batch's cached tokens before each step (and after the last: differences
#: give each step's emitted tokens), drafts, the verify pass's causal pairs, and requests
#: whose step saw a first rejection
COLUMNS = ("cached", "drafted", "pairs", "rejected")
_NONE = np.zeros(0, dtype=np.int64)  # the compiled loop's drafts (k every step) or feeds: none


class BatchColumns:
    """Sums over the running requests' walks, by decode step from `now` (steps committed)."""

    __slots__ = ("_blocks", "_by_drafts", "_draft", "_origin", "_steps", "_sums", "now")

    def __init__(self, capacity: int = 4096, k_max: int = 0, draft: bool = False,
                 blocks: bool = False) -> None:
        """`k_max` > 0 keeps, below the sums, how many requests draft d tokens at each step
        (d = 0..k_max): a step's most drafts is the largest d with any (a drafter that caps
        its drafts; k_max at least the ks drafted). `draft` (a draft model, with k_max) keeps
        below those their cached tokens by d, and the first pass's catch-up tokens and
        causal pairs, from each walk's `chain_feeds`: a step's draft pass j runs over the
        requests with d >= j. `blocks` (not with `draft`) keeps, in a last row, the KV blocks
        the batch holds before each step, from each walk's `chain_blocks`."""
        self.now = 0  # decode steps committed so far
        self._origin = 0  # the step index of the arrays' first entry
        self._by_drafts = k_max + 1 if k_max else 0  # rows d = 0..k_max, where kept
        self._draft = draft and k_max > 0
        self._steps = np.arange(capacity, dtype=np.int64)  # a walk's step offsets
        rows = len(COLUMNS) + (2 * self._by_drafts + 2 if self._draft else self._by_drafts)
        if blocks and self._draft:
            raise ValueError("the kept sums hold blocks or a draft model's passes, not both")
        self._blocks = rows if blocks else -1  # the blocks' row, where kept
        self._sums = np.zeros((rows + blocks, capacity), dtype=np.int64)

    def window(self, steps: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Views of the next `steps` steps' sums (cached: steps + 1 entries, the last after
        the last step), and of the requests drafting d tokens ((k_max + 1) x steps; no rows
        where not kept): valid until the sums next change."""
        at = self.now - self._origin
        sums, first = self._sums, len(COLUMNS)
        return (sums[0, at: at + steps + 1], sums[1, at: at + steps],
                sums[2, at: at + steps], sums[3, at: at + steps],
                sums[first: first + self._by_drafts, at: at + steps])

    def blocks_window(self, steps: int) -> np.ndarray:
        """`blocks`: the KV blocks the batch holds before each of the next `steps` steps and
        after the last (steps + 1 entries): a view, valid until the sums next change."""
        at = self.now - self._origin
        return self._sums[self._blocks, at: at + steps + 1]

    def draft_passes(self, steps: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """`draft`: each of the next `steps` steps' draft passes j = 1..P (P the most drafts
        of any of them): the requests drafting at least j and their cached tokens (P x
        steps), and pass 1's catch-up tokens and causal pairs; None where nothing drafts."""
        at = self.now - self._origin
        rows, first = self._by_drafts, len(COLUMNS)
        counts = self._sums[first + 1: first + rows, at: at + steps]  # d = 1..k_max
        deepest = np.flatnonzero(counts.any(axis=1))
        if not len(deepest):
            return None
        passes = int(deepest[-1]) + 1
        cached = self._sums[first + rows + 1: first + rows + 1 + passes, at: at + steps]
        # at least j: the counts and tokens of d = j..P summed (integers: in any order)
        return (counts[passes - 1:: -1].cumsum(axis=0)[::-1],
                cached[::-1].cumsum(axis=0)[::-1],
                self._sums[-2, at: at + steps], self._sums[-1, at: at + steps])

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
        if self._blocks >= 0:  # its blocks before each step, and after its last
            held = request.chain_blocks[start:]
            if sign > 0:
                self._sums[self._blocks, at: at + m + 1] += held
            else:
                self._sums[self._blocks, at: at + m + 1] -= held
        if not m:  # a finished walk: its last entry only, its KV after its last step
            self._sums[0, at] += sign * (int(gen[0]) + request.prompt_tokens - 1)
            return
        capped = request.chain_ks is not None
        if self._by_drafts and not capped and not 0 <= k < self._by_drafts:
            raise ValueError(f"a walk at k={k} outside the kept sums' 0..{self._by_drafts - 1}")
        loops = compiled()
        if loops is not None:  # the loop below, compiled (simulator/compiled.py)
            feeds = request.chain_feeds
            loops.add_shares(self._sums, at, gen, request.prompt_tokens - 1,
                             request.chain_ks[start:] if capped else _NONE, capped, k, sign,
                             len(COLUMNS), self._by_drafts, self._draft,
                             feeds[start:] if self._draft and k else _NONE)
            return
        end, sums = at + m, self._sums
        c = gen + (request.prompt_tokens - 1)  # its KV before each step: prompt - 1 + g
        d = request.chain_ks[start:] if capped else k  # drafts: k every step uncapped
        # a (d + 1)-token verify pass over c cached: (d + 1) c + (d + 1)(d + 2) / 2 pairs; a
        # first rejection: fewer emitted than d + 1
        shares = [(sums[0, at: end + 1], c), (sums[1, at:end], d),
                  (sums[2, at:end], (d + 1) * c[:-1] + own_pairs(d)),
                  (sums[3, at:end], gen[1:] - gen[:-1] <= d)]
        if sign > 0:  # in place: ufuncs given out= cost more calling
            for column, share in shares:
                column += share
        else:
            for column, share in shares:
                column -= share
        if self._by_drafts:  # by drafts: each step's (d, step) entry, one per step
            first, rows = len(COLUMNS), self._by_drafts
            width = sums.shape[1]
            if capped:  # entries (d, step) are distinct: a fancy-indexed add adds each once
                cells = d * width + (self._steps[:m] + (first * width + at))
                flat = sums.reshape(-1)  # a view: the sums are one C-ordered block
                flat[cells] += sign
                if self._draft:
                    flat[cells + rows * width] += sign * c[:-1]
            else:
                sums[first + k, at:end] += sign
                if self._draft:
                    sums[first + rows + k, at:end] += sign * c[:-1]
            if self._draft and k:  # (k = 0: no chain, no catch-up)
                self._catch_up(request, start, c[:-1], d, capped, sign, at, end)

    def _catch_up(self, request: RequestState, start: int, c: np.ndarray, d, capped: bool,
                  sign: int, at: int, end: int) -> None:
        """A walk's share of pass 1's catch-up at each step that drafts: g = feed - 1 more
        tokens, g (c + 1) - g (g + 1) / 2 more causal pairs (step_cost's `_catch_up_steps`)."""
        extra = request.chain_feeds[start: start + len(c)] - 1
        if capped:
            extra = np.where(d > 0, extra, 0)
        pairs = extra * (c + 1) - extra * (extra + 1) // 2
        if sign > 0:
            self._sums[-2, at:end] += extra
            self._sums[-1, at:end] += pairs
        else:
            self._sums[-2, at:end] -= extra
            self._sums[-1, at:end] -= pairs

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
        if len(self._steps) < sums.shape[1]:
            self._steps = np.arange(sums.shape[1], dtype=np.int64)
        return 0

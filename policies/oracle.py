"""`oracle` (simulation only): knows how many drafts each request will get accepted.

With every request's future accepted run in hand (the speculation trace's run[t], which a real
engine never sees), a step drafts k_r = min(run_r, c): no draft is ever rejected, and the batch
cap c in 0..k_max is the one that maximises this step's goodput, emitted tokens / step time, on
the engine's own cost model. It is the yardstick that shows how much a real policy leaves on the
table (DISCO, Mamou et al. 2024, arXiv 2405.04304, reports an oracle up to 39% over static k).

It is greedy per step: the best tokens/s now, not a plan over the whole run, so it bounds what
a per-step policy can do with perfect foresight of acceptance, not every conceivable schedule.

`knows=probabilities` is a weaker yardstick: it knows each position's chance of acceptance (a
parametric trace's per-position probability p_t), not the draws. Draft j of a chain from g is
accepted with chance p_g ... p_{g+j}; the step drafts the D drafts most likely accepted, D
chosen for the most expected tokens per second. It is what a policy with perfect calibration
could do: the distance from it to the outcome oracle is luck that no signal of a draw's chance
recovers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import groupby
from operator import itemgetter
from typing import ClassVar

import numpy as np

from policies.base import (
    Policy,
    RequestStates,
    StepContext,
    StepCost,
    SumsPricer,
    prefix_counts,
    price_steps,
)
from policies.kernels import compiled
from policies.registry import register

KNOWS = ("outcomes", "probabilities")
_NO_INTS, _NO_FLOATS = np.zeros(0, dtype=np.int64), np.zeros(0)  # (no state: it knows them)
GRID = 8  # knows=probabilities: draft counts tried per depth before the local search


@register
@dataclass
class Oracle(Policy):
    name: ClassVar[str] = "oracle"
    description: ClassVar[str] = (
        "simulation only: knows future acceptance; per-step goodput-optimal k (upper bound)")
    simulation_only: ClassVar[bool] = True

    k_max: int = field(default=10, metadata={"help": "largest k considered (also <= engine's)"})
    knows: str = field(default="outcomes", metadata={
        "help": "outcomes: how many drafts each request will get accepted (the upper bound); "
                "probabilities: only each position's chance of acceptance (a parametric "
                "trace's), not the draws: what perfect calibration could do"})

    def __post_init__(self) -> None:
        if not 0 <= self.k_max <= 64:
            raise ValueError(f"k_max must be in 0..64, got {self.k_max}")
        if self.knows not in KNOWS:
            raise ValueError(f"knows must be one of {', '.join(KNOWS)}, got {self.knows!r}")
        self._sums_pricer = SumsPricer()  # the cost model's chain_sums_s, or None

    def choose(self, ctx: StepContext) -> Sequence[int]:
        if ctx.lookahead is None:
            raise RuntimeError("the oracle needs the simulator's lookahead; it cannot run live")
        bound = min(self.k_max, ctx.k_max)
        if self.knows == "probabilities":
            return self._calibrated(ctx, bound)
        runs = []
        for r in ctx.requests:
            left = r.output_tokens - r.generated - 1  # drafts past the last token are wasted
            runs.append(min(int(ctx.lookahead(r.request_id)[r.generated]), left, bound))
        contexts = [r.context_tokens for r in ctx.requests]
        top = max(runs, default=0)
        if top == 0:  # nothing to accept: no draft pays
            return [0] * len(runs)
        sums = self._sums_pricer(ctx.cost)
        if sums is not None:
            cap = _best_cap(sums, runs, contexts, top)
            return [min(run, cap) for run in runs]
        best_ks, best_rate = [0] * len(runs), -1.0
        for cap in range(0, top + 1):
            ks = [min(run, cap) for run in runs]
            rate = (len(ks) + sum(ks)) / ctx.cost.step_s(ks, contexts)
            if rate > best_rate:
                best_ks, best_rate = ks, rate
        return best_ks

    def walker(self, request_id: int, k_max: int, signals, run: np.ndarray | None = None
               ) -> _OracleWalk:
        """Where its batch cap does not bind (`walks_agree` says where it does), each
        request's k is its own: min(run, the drafts before its last token, the bound)."""
        if run is None:
            raise RuntimeError("the oracle walks a request only with its accepted runs (run=)")
        return _OracleWalk(run, min(self.k_max, k_max))

    def request_states(self, request_ids: Sequence[int], k_max: int) -> RequestStates:
        """For compiled engine steps (`RequestStates`): no state (it knows the outcomes, or
        the probabilities), knobs its bound min(k_max, the engine's); knowing probabilities,
        then the width of a row of `_grid`'s table and the table, up to this batch's most
        drafts (row n: how many counts `_grid(n)` tries, then them)."""
        bound = min(self.k_max, k_max)
        if self.knows == "outcomes":
            return RequestStates("oracle", _NO_INTS, _NO_FLOATS, _NO_FLOATS,
                                 np.array([bound], dtype=np.int64), _NO_FLOATS)
        return RequestStates("oracle_calibrated", _NO_INTS, _NO_FLOATS, _NO_FLOATS,
                             _grid_knobs(bound, len(request_ids) * bound), _NO_FLOATS)

    def keep_states(self, request_ids: Sequence[int], states: RequestStates,
                    touched: np.ndarray) -> None:
        """Nothing: it learns nothing from outcomes."""

    def walks_with(self, cost: StepCost) -> bool:
        """knows=outcomes, where each cap is priced from its verify pass's sums: the check of
        a segment's steps (`walks_agree`) is then a few array passes and one pricing call.
        (With a draft model the cap binds often, its passes costing per depth: stepped.)"""
        return self.knows == "outcomes" and self._sums_pricer(cost) is not None

    def walks_agree(self, ctx: StepContext, positions: np.ndarray) -> int:
        """The steps, from the first, where `choose`'s best cap is the largest run (so each
        request drafts its walk's min(run, left, bound)): every cap of every step priced in
        one call, as `_best_cap` prices them one by one (the same floats)."""
        requests = ctx.requests
        sums = self._sums_pricer(ctx.cost)
        if not requests or sums is None:
            return 0 if requests else positions.shape[1]
        bound = min(self.k_max, ctx.k_max)
        runs = np.array([ctx.lookahead(r.request_id)[row] for r, row in zip(requests, positions)],
                        dtype=np.int64).reshape(positions.shape)
        last = np.array([r.output_tokens - 1 for r in requests], dtype=np.int64)[:, None]
        asked = np.minimum(np.minimum(runs, last - positions), bound)
        prompts = np.array([r.prompt_tokens for r in requests], dtype=np.int64)[:, None]
        return _overruled_at(sums, asked, positions + prompts)

    def _calibrated(self, ctx: StepContext, bound: int) -> list[int]:
        """knows=probabilities: the most expected tokens per second over the allocations that
        draft, for some deepest depth K, the D drafts of depth below K most likely accepted
        (with a draft model the K passes cost whoever is in them, so a request's first draft
        can be nearly free once another drafts K). D is tried on a geometric grid for every K,
        then every D between the best one's neighbours: tokens grow concavely in D and time
        about linearly, so their ratio has one peak."""
        requests = ctx.requests
        b = len(requests)
        if b == 0 or bound == 0:
            return [0] * b
        chance = np.zeros((b, bound))
        for i, r in enumerate(requests):
            reach = min(bound, r.output_tokens - r.generated - 1)
            if getattr(r, "draftable", None) is not None:
                reach = min(reach, r.draftable)
            if reach > 0:
                p = ctx.lookahead.probabilities(r.request_id)
                chance[i, :reach] = p[r.generated:r.generated + reach]
        survival = np.cumprod(chance, axis=1)  # draft j accepted: positions g..g+j all match
        contexts = [r.context_tokens for r in requests]
        ranked = []  # per depth K: (request of each draft by worth, cumulative worth)
        for depth in range(1, bound + 1):
            worth = survival[:, :depth].ravel()
            order = np.argsort(-worth, kind="stable")[: int(np.count_nonzero(worth))]
            ranked.append((order // depth, np.concatenate(([0.0], np.cumsum(worth[order])))))

        def best_of(tries: list[tuple[int, int]]) -> tuple[int, int]:
            rows = []  # each depth's tries' ks in one call
            for k, same_k in groupby(tries, key=itemgetter(0)):
                rows += prefix_counts(ranked[k - 1][0], [d for _, d in same_k], b)
            times = price_steps(ctx.cost, rows, contexts)
            rates = [(b + ranked[k - 1][1][d]) / t for (k, d), t in zip(tries, times)]
            return tries[int(np.argmax(rates))]

        grid = {k: _grid(len(ranked[k - 1][0])) for k in range(1, bound + 1)}
        k, d = best_of([(k, d) for k in grid for d in grid[k]])
        at = grid[k].index(d)
        low, high = grid[k][max(at - 1, 0)], grid[k][min(at + 1, len(grid[k]) - 1)]
        k, d = best_of([(k, x) for x in range(low, high + 1)])
        return np.bincount(ranked[k - 1][0][:d], minlength=b).tolist()


_table = np.zeros(0, dtype=np.int64)  # `_grid_knobs`' table, its rows kept for the process


def _grid_knobs(bound: int, most: int) -> np.ndarray:
    """The bound, a row's width and `_grid`'s table for 0..`most` drafts (row n: how many
    counts it tries, then them), as the compiled oracle reads them: a new array each call (the
    table's rows are built once, grown by doubling)."""
    global _table
    width = GRID + 2
    if len(_table) < (most + 1) * width:
        rows = max(most + 1, 2 * (len(_table) // width), 64)
        table = np.full((rows, width), -1, dtype=np.int64)
        for n in range(rows):
            grid = _grid(n)
            table[n, 0] = len(grid)
            table[n, 1:1 + len(grid)] = grid
        _table = table.ravel()
    knobs = np.empty(2 + (most + 1) * width, dtype=np.int64)
    knobs[0], knobs[1] = bound, width
    knobs[2:] = _table[:(most + 1) * width]
    return knobs


@lru_cache(maxsize=4096)
def _grid(n: int) -> tuple[int, ...]:
    """The draft counts `_calibrated` tries first at a depth with n drafts worth something: 0
    and GRID counts spaced geometrically up to n (the same for every step with n)."""
    return tuple(sorted({0, *np.geomspace(1, n or 1, GRID).round().astype(int).tolist()}
                        & set(range(n + 1))))


def _best_cap(sums, runs: list[int], contexts: list[int], top: int) -> int:
    """The cap in 0..top with the most tokens per second where the cost model prices a step
    from its verify pass's sums (`chain_sums_s`, the same floats as `step_s`), one Python
    float per cap (a few caps: cheaper than arrays)."""
    b, cached = len(runs), sum(contexts) - len(runs)
    best, best_rate = 0, -1.0
    for cap, (drafted, pairs) in enumerate(cap_sums(runs, contexts, top)):
        rate = (b + drafted) / sums(b, [drafted], cached, [pairs])[0]
        if rate > best_rate:
            best, best_rate = cap, rate
    return best


def _overruled_at(sums, asked: np.ndarray, contexts: np.ndarray) -> int:
    """The first step (a column of `asked`, requests x steps: each request's min(run, left,
    bound)) whose best cap is below its largest run, else how many steps. A cap above a
    step's largest run gives that run's floats again, so pricing caps up to the largest of
    any step leaves each step's first best as over 0..its own."""
    b, steps = asked.shape
    top = asked.max(axis=0)
    caps = int(top.max())
    if caps == 0:
        return steps  # nothing to accept anywhere: choose gives zeros, as the walks do
    drafted, times = _cap_times(sums, asked, contexts, caps)
    loops = compiled()
    if loops is not None:
        return loops.first_overruled(drafted, times, top, b)
    overruled = ((b + drafted) / times).argmax(axis=0) < top
    return int(overruled.argmax()) if overruled.any() else steps


def _cap_times(sums, asked: np.ndarray, contexts: np.ndarray, caps: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per cap 0..caps (rows) and step (columns), the drafts and the seconds of the step where
    each request drafts min(asked, cap): its verify pass's sums (`cap_sums`' integers: (k + 1)
    c + k (k + 1) / 2 causal pairs a request) priced in one call."""
    b = asked.shape[0]
    loops = compiled()
    if loops is not None:
        drafted, pairs = loops.cap_steps(asked, contexts, caps)
    else:
        drafted = np.empty((caps + 1, asked.shape[1]), dtype=np.int64)
        pairs = np.empty_like(drafted)
        for cap in range(caps + 1):
            k = np.minimum(asked, cap)
            drafted[cap] = k.sum(axis=0)
            pairs[cap] = ((k + 1) * contexts + k * (k + 1) // 2).sum(axis=0)
    cached = np.tile(contexts.sum(axis=0) - b, caps + 1)
    return drafted, np.asarray(sums(b, drafted.ravel(), cached, pairs.ravel())).reshape(
        drafted.shape)


class _OracleWalk:
    """`Oracle.choose` for one request where the batch cap does not bind (`Policy.walker`)."""

    __slots__ = ("_bound", "_last", "_run")

    def __init__(self, run: np.ndarray, bound: int) -> None:
        self._run, self._bound, self._last = run, bound, len(run) - 1

    def k(self, position: int) -> int:
        return min(int(self._run[position]), self._last - position, self._bound)

    def saw(self, drafted: int, accepted: int, emitted: int, position: int) -> None:
        pass  # it knows the outcomes already

    def walk_all(self, start: int, run: np.ndarray, cap: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """The whole walk at once, compiled where the simulator's loops run, else None."""
        loops = compiled()
        if loops is None:
            return None
        return loops.oracle_walk(run, loops.NO_CAP if cap is None else cap, cap is not None,
                                 self._bound)


def cap_sums(runs: list[int], contexts: list[int], top: int) -> list[tuple[int, int]]:
    """Per cap 0..top, the verify pass's drafts and causal pairs when each request drafts
    min(run, cap), each cap's grown from the last one's."""
    drafted, pairs = 0, sum(contexts)  # k = 0: c_r - 1 cached and 1 fed, so c_r pairs each
    out = [(drafted, pairs)]
    for cap in range(1, top + 1):  # drafting cap rather than cap - 1 adds c_r + cap pairs
        grown = [c for run, c in zip(runs, contexts) if run >= cap]
        drafted += len(grown)
        pairs += sum(grown) + len(grown) * cap
        out.append((drafted, pairs))
    return out

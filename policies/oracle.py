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

from policies.base import Policy, StepContext, SumsPricer, prefix_counts, price_steps
from policies.registry import register

KNOWS = ("outcomes", "probabilities")
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

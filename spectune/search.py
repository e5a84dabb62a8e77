"""Which parameter settings the tuner tries, and in what order it spends simulations on them.

A policy's searchable parameters come from its fields' metadata (`grid` or `bounds`,
policies/registry.py). Candidates are the product of the grids times a scrambled Sobol sample of
the bounded box. The search is successive halving (Jamieson & Talwalkar 2016; Li et al.'s
Hyperband builds on it): every candidate runs on the first seed, the best third goes on to all
seeds; then, for continuous parameters, a second, denser Sobol sample in a box a quarter as wide
around the winner gets all seeds too. `exhaustive_grid` is the reference a test and the benchmark
compare it with: a fine regular grid, every point on every seed. A grid that declares `extend`
values goes on past its top while the best sits there (`past_the_top`); `edge_notes` says where a
best value sits on an edge of the searched space, and `confidence_interval` gives the interval of
a mean over seeds that the tables print.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from policies import ParamInfo

#: objective values per candidate, one per seed it ran on (in seed order)
Scores = dict["Candidate", list[float]]
#: runs (candidate, seed) pairs (in parallel, from a cache, ...) and returns one value per pair
Evaluate = Callable[[list[tuple["Candidate", int]]], list[float]]
#: a search as steps: it yields the (candidate, seed) pairs it needs next, is sent their values
#: (one per pair, in order), and returns what it found. Several such searches can be run
#: together (`run_together`): each round of all of them goes to the workers as one batch (the
#: next starts when the batch's last simulation ends), not one search's round at a time
Steps = Generator[list[tuple["Candidate", int]], list[float], Any]


@dataclass(frozen=True, order=True)
class Candidate:
    """A policy with explicit parameter values (the rest at their defaults); hashable."""

    policy: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def label(self) -> str:
        inner = ", ".join(f"{k}={_short(v)}" for k, v in self.params)
        return f"{self.policy}({inner})"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def searched_parameters(policy: str, fixed: dict[str, Any] | None = None) -> list[ParamInfo]:
    """The parameters the tuner varies: those with a grid or bounds, minus those set by hand."""
    from policies import parameters, policy_class

    unused = policy_class(policy).unused_parameters(fixed or {})
    return [p for p in parameters(policy)
            if p.searched and p.name not in (fixed or {}) and p.name not in unused]


def _rounded(value: float) -> float:
    """Four significant digits: labels stay readable and a cache key stays stable."""
    return float(f"{value:.4g}")


def _box_points(params: Sequence[ParamInfo], n: int, seed: int,
                box: dict[str, tuple[float, float]] | None = None) -> list[dict[str, float]]:
    """n scrambled-Sobol points in the bounded box (or a sub-box), one dict per point."""
    from scipy.stats import qmc

    bounded = [p for p in params if p.bounds is not None]
    if not bounded or n < 1:
        return [{}]
    lo = np.array([(box or {}).get(p.name, p.bounds)[0] for p in bounded])
    hi = np.array([(box or {}).get(p.name, p.bounds)[1] for p in bounded])
    sampler = qmc.Sobol(d=len(bounded), scramble=True, seed=seed)
    unit = sampler.random(2 ** math.ceil(math.log2(n)))[:n]
    points = qmc.scale(unit, lo, hi)
    return [{p.name: _rounded(v) for p, v in zip(bounded, row)} for row in points]


def candidates(policy: str, fixed: dict[str, Any] | None = None, continuous_points: int = 8,
               seed: int = 0) -> list[Candidate]:
    """Grid product x Sobol points over the bounds; `fixed` parameters are pinned in every one."""
    params = searched_parameters(policy, fixed)
    grids = [p for p in params if p.grid is not None]
    pinned = tuple(sorted((fixed or {}).items()))
    out = []
    for values in itertools.product(*(p.grid for p in grids)):
        for point in _box_points(params, continuous_points, seed):
            chosen = {**dict(zip((p.name for p in grids), values)), **point}
            out.append(Candidate(policy, tuple(sorted({**dict(pinned), **chosen}.items()))))
    return sorted(set(out))


def exhaustive_grid(policy: str, fixed: dict[str, Any] | None = None,
                    points_per_bound: int = 7) -> list[Candidate]:
    """Every grid value x a regular grid of `points_per_bound` per bounded parameter."""
    params = searched_parameters(policy, fixed)
    axes = [p.grid if p.grid is not None else
            tuple(_rounded(v) for v in np.linspace(*p.bounds, points_per_bound)) for p in params]
    pinned = dict(fixed or {})
    return sorted({Candidate(policy, tuple(sorted({**pinned, **dict(zip(
        (p.name for p in params), values))}.items()))) for values in itertools.product(*axes)})


def mean_score(scores: Scores, candidate: Candidate) -> float:
    values = scores.get(candidate, [])
    return float(np.mean(values)) if values else math.inf


def run_together(
        searches: Sequence[Steps],
        evaluate: Callable[[list[tuple[int, list[tuple[Candidate, int]]]]], list[list[float]]],
        started: Callable[[int], None] | None = None) -> list[Any]:
    """Run searches side by side: every search's next pairs at once through `evaluate` (a
    list of (search index, pairs) in, one value list each out), each search sent its own
    values. Each search sees exactly what it would alone, so each finds what it would alone;
    only the order the simulations run in changes. `started(i)` is called before search i
    takes a step (what it says then, it says as search i). The results, in the searches'
    order."""
    # (`evaluate` is called outside the searches' StopIteration handler: its own is no result)
    results: list[Any] = [None] * len(searches)
    pending: dict[int, list[tuple[Candidate, int]]] = {}

    def step(i: int, values: list[float] | None) -> None:
        if started is not None:
            started(i)
        try:
            pending[i] = searches[i].send(values)  # type: ignore[arg-type]
        except StopIteration as done:
            results[i] = done.value

    for i in range(len(searches)):
        step(i, None)
    while pending:
        batch = list(pending.items())
        pending.clear()
        for (i, _), values in zip(batch, evaluate(batch), strict=True):
            step(i, values)
    return results


def run_alone(steps: Steps, evaluate: Evaluate) -> Any:
    """One search given as steps, each step's pairs through `evaluate`: its result."""
    return run_together([steps], lambda batch: [evaluate(batch[0][1])])[0]


def seeds_steps(scores: Scores, cands: Sequence[Candidate], seeds: Sequence[int]) -> Steps:
    """Each candidate on the seeds it has not run yet (seed order kept), as steps: one, or
    none where nothing is left to run."""
    todo = [(c, s) for c in cands for s in seeds[len(scores.get(c, [])):]]
    if not todo:
        return
    values = yield todo
    for (c, _), value in zip(todo, values):
        scores.setdefault(c, []).append(value)


def successive_halving(cands: Sequence[Candidate], seeds: Sequence[int], evaluate: Evaluate,
                       eta: int = 3, refine_points: int = 4, refine_seed: int = 1,
                       fixed: dict[str, Any] | None = None) -> Scores:
    """Scores of every candidate tried; the ones that survived ran on every seed.

    Lower is better. With one seed, or no more candidates than `eta`, every candidate runs on
    every seed (nothing to halve)."""
    return run_alone(halving_steps(cands, seeds, eta, refine_points, refine_seed, fixed),
                     evaluate)


def halving_steps(cands: Sequence[Candidate], seeds: Sequence[int], eta: int = 3,
                  refine_points: int = 4, refine_seed: int = 1,
                  fixed: dict[str, Any] | None = None) -> Steps:
    """`successive_halving` as steps."""
    scores: Scores = {}
    cands = list(dict.fromkeys(cands))
    if len(seeds) == 1 or len(cands) <= eta:
        yield from seeds_steps(scores, cands, seeds)
    else:
        yield from seeds_steps(scores, cands, seeds[:1])
        keep = sorted(cands, key=lambda c: mean_score(scores, c))[: math.ceil(len(cands) / eta)]
        yield from seeds_steps(scores, keep, seeds)
    best = best_candidate(scores, len(seeds))
    refined = _refinements(best, refine_points, refine_seed, fixed)
    if refined:
        yield from seeds_steps(scores, refined, seeds)
    return scores


def _refinements(best: Candidate, n: int, seed: int,
                 fixed: dict[str, Any] | None = None) -> list[Candidate]:
    """Sobol points in a box a quarter of each bounded range wide, centred on `best`."""
    chosen = best.params_dict
    bounded = [p for p in searched_parameters(best.policy, fixed)
               if p.bounds is not None and p.name in chosen]
    if not bounded or n < 1:
        return []
    box = {}
    for p in bounded:
        lo, hi = p.bounds
        half = (hi - lo) / 8
        centre = min(max(float(chosen[p.name]), lo + half), hi - half)
        box[p.name] = (centre - half, centre + half)
    near = (Candidate(best.policy, tuple(sorted({**chosen, **pt}.items())))
            for pt in _box_points(bounded, n, seed, box))
    return [c for c in dict.fromkeys(near) if c != best]


def past_the_top(best: Candidate, pinned: dict, scores: Scores) -> list[Candidate]:
    """`best` with each extendable parameter moved to its next value, for the parameters whose
    value in `best` is the largest tried."""
    out = []
    chosen = best.params_dict
    for p in searched_parameters(best.policy, pinned):
        value = chosen.get(p.name)
        if p.extend is None or value is None:
            continue
        tried = [c.params_dict.get(p.name) for c in scores if c.policy == best.policy]
        if value < max(v for v in tried if v is not None) or value < max(p.grid):
            continue
        above = [v for v in p.extend if v > value]
        if above:
            out.append(Candidate(best.policy, tuple(sorted({**chosen, p.name: above[0]}.items()))))
    return out


def edge_notes(best: Candidate, pinned: dict, search: Any) -> list[str]:
    """Where the best candidate sits on a bound of its search space that the user did not set:
    the top of a grid (past its hard cap, if it extends), or within 1/16 of a range's edge.
    `search` tells the scheduler's k_max, whether the user set it, and the longest k the
    acceptance can replay (`k_limit`)."""
    out = []
    chosen = best.params_dict
    for p in searched_parameters(best.policy, pinned):
        value = chosen.get(p.name)
        if value is None or isinstance(value, bool):
            continue
        if p.grid is not None:
            top = max((*p.grid, *(p.extend or ())))
            if best.policy == "fixed" and p.name == "k":
                if search.k_max_given and value >= search.scheduler.k_max:
                    continue  # the user's own --k-max
                if value >= search.k_limit:
                    out.append(f"fixed k={value} is the longest run the speculation trace "
                               "records: a larger k cannot be replayed, and may be better")
                    continue
            if value >= top:
                cap = "hard cap" if p.extend else "grid's top"
                out.append(f"{best.policy} {p.name}={value} is the {cap} of the search "
                           f"({top}); the optimum may lie beyond it")
        elif p.bounds is not None:
            lo, hi = p.bounds
            margin = (hi - lo) / 16
            side = "bottom" if value <= lo + margin else "top" if value >= hi - margin else None
            if side:
                out.append(f"{best.policy} {p.name}={value} is at the {side} of its searched "
                           f"range [{lo:g}, {hi:g}]; the optimum may lie beyond it (pin "
                           f"{best.policy}:{p.name}=VALUE in --policies to look)")
    return out


def best_candidate(scores: Scores, n_seeds: int) -> Candidate:
    """The lowest mean among candidates that ran on all `n_seeds` seeds."""
    full = [c for c, v in scores.items() if len(v) >= n_seeds]
    if not full:
        raise ValueError("no candidate ran on every seed")
    return min(full, key=lambda c: (mean_score(scores, c), c))


@dataclass(frozen=True)
class Interval:
    """A confidence interval of a mean over seeds; low/high are None where none can be given
    (one seed, or a seed with no finite value). `method` is what the output names."""

    low: float | None
    high: float | None
    method: str

    @property
    def given(self) -> bool:
        return self.low is not None and self.high is not None


def confidence_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """The interval of the mean of `values` (one per seed), never below zero.

    Latencies and throughputs are positive and right-skewed, and a tune has few seeds, so a
    Student-t interval (symmetric) can reach below zero. All values > 0: the modified Cox interval
    for the mean of a log-normal (Olsson 2005, J. Stat. Educ. 13(1)), exp(ybar + s^2/2 +- t sqrt(
    s^2/n + s^4/(2(n-1)))) over y = log x; it is positive by construction. A zero among them (a
    goodput where no request met the SLO): Student-t, clipped at zero. One seed: no interval.
    """
    from scipy.stats import t

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return Interval(None, None, f"no interval ({len(x)} seed)")
    if not np.all(np.isfinite(x)):
        return Interval(None, None, "no interval (a seed has no value)")
    quantile = float(t.ppf(0.5 + level / 2, len(x) - 1))
    if np.all(x > 0):
        y = np.log(x)
        var = float(y.var(ddof=1))
        centre = float(y.mean()) + var / 2
        half = quantile * math.sqrt(var / len(x) + var**2 / (2 * (len(x) - 1)))
        return Interval(math.exp(centre - half), math.exp(centre + half), LOG_NORMAL)
    mean = float(x.mean())
    half = quantile * float(x.std(ddof=1)) / math.sqrt(len(x))
    return Interval(max(mean - half, 0.0), mean + half, STUDENT_T)


#: how an interval was computed, as the output names it
LOG_NORMAL = "log-normal (modified Cox) over seeds"
STUDENT_T = "Student-t over seeds, clipped at 0"

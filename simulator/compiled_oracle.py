"""The oracle that knows probabilities (`knows=probabilities`), its `choose` compiled (numba), for
the engine steps that `simulator/compiled_walked.py` runs: each request's chance of acceptance
at each depth from its trace's per-position probabilities, the drafts of each depth ranked by
it, and the step with the most expected tokens per second over the draft counts tried (its
geometric grid, then every count between the best one's neighbours).

Why: in Python each step priced up to a few hundred alternatives, 200-240 us per simulated
iteration, so the policy matrix's calibrated column cost more than every other policy together.
Here it does `Oracle._calibrated`'s integer and float operations in its order (the products
along each request's chain, a stable ranking, the sums from 0, each alternative priced as
`steps_s` prices it, the first best on ties): the same ks to the bit
(tests/simulator/test_compiled_oracle.py).

Imported by simulator/compiled_walked.py, after `simulator.kernels` loaded the compiled loops.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simulator.compiled import alternatives_times
from simulator.compiled_steps import _step_s


@njit(cache=True)
def _ranked(survival, depth: int, rows, worths) -> int:
    """The drafts of depth below `depth` by their chance of acceptance, highest first, ties in
    order (request by request, then by depth: `ravel`'s), those with none left out: each one's
    request into `rows`, their running sum from 0 into `worths` (one longer). Returns how
    many."""
    b = survival.shape[0]
    worth = np.empty(b * depth)
    for i in range(b):
        for j in range(depth):
            worth[i * depth + j] = survival[i, j]
    order = np.argsort(-worth, kind="mergesort")  # (stable, as numpy's "stable")
    count = 0
    for t in range(worth.shape[0]):
        if worth[t] != 0.0:
            count += 1
    worths[0] = 0.0
    for t in range(count):
        rows[t] = order[t] // depth
        worths[t + 1] = worths[t] + worth[order[t]]
    return count


@njit(cache=True, error_model="numpy")
def _best_count(depth: int, lo: int, hi: int, grid, grid_size: int, ranked_rows, ranked_worths,
                held, cached_total: int, b: int, target, overhead: float, draft_model: bool,
                draft, best_rate: float, best: tuple) -> tuple:
    """`best_of`'s tries at one depth (the grid's `grid_size` counts, or every count lo..hi
    where `grid_size` < 0, in increasing order): each one's ks (each request's count among the
    first d ranked), priced as `steps_s` prices them; the first with more expected tokens per
    second than `best_rate` beats `best` ((depth, count)). The ks and causal pairs grow draft
    by draft from 0: a request's k + 1st draft adds c + k + 2 pairs ((k + 2)(k + 3) / 2 less
    (k + 1)(k + 2) / 2), the same integers as summing each try's."""
    tries = grid_size if grid_size >= 0 else hi - lo + 1
    rows = np.zeros((tries if draft_model else 0, b), dtype=np.int64)
    counts = np.empty(tries, dtype=np.int64)
    times = np.empty(tries)
    ks = np.zeros(b, dtype=np.int64)
    pairs = cached_total + b  # every k = 0: (0 + 1) c + 1 each
    d = 0
    for t in range(tries):
        want = grid[t] if grid_size >= 0 else lo + t
        while d < want:
            r = ranked_rows[d]
            pairs += held[r] + ks[r] + 2
            ks[r] += 1
            d += 1
        counts[t] = d
        if draft_model:
            rows[t] = ks
        else:
            times[t] = _step_s(cached_total, d, pairs, b, target, overhead)
    if draft_model:
        times = alternatives_times(rows, held, target, draft, overhead)
    for t in range(tries):
        rate = (b + ranked_worths[counts[t]]) / times[t]
        if rate > best_rate:
            best_rate, best = rate, (depth, counts[t])
    return best_rate, best


@njit(cache=True, error_model="numpy")
def calibrated_ks(ks, prompt, gen, output, at, chance, cap, capped: bool, knobs, target,
                  overhead: float, draft_model: bool, draft) -> None:
    """`Oracle._calibrated` (into `ks`): request r's chance at position g is chance[at[r] + g]
    (its trace's per-position probability), its reach the drafts before its last token, the
    bound and (`capped`) the drafter's cap there. `knobs`: the bound, a grid row's width, then
    the grid table (`Oracle.request_states`): row n how many counts `_grid(n)` tries, then
    them."""
    bound, width = knobs[0], knobs[1]
    grids = knobs[2:].reshape((-1, width))
    b = ks.shape[0]
    ks[:] = 0
    if b == 0 or bound == 0:
        return
    survival = np.zeros((b, bound))  # draft j accepted: positions g..g+j all match
    held = np.empty(b, dtype=np.int64)  # each request's KV before the verify pass
    cached_total = 0
    for i in range(b):
        held[i] = prompt[i] + gen[i] - 1
        cached_total += held[i]
        reach = output[i] - gen[i] - 1
        reach = reach if reach < bound else bound
        if capped:
            can = cap[at[i] + gen[i]]
            reach = reach if reach < can else can
        s = 0.0
        for j in range(bound):
            c = chance[at[i] + gen[i] + j] if j < reach else 0.0
            s = c if j == 0 else s * c
            survival[i, j] = s
    ranked_rows = np.empty((bound, b * bound), dtype=np.int64)
    ranked_worths = np.empty((bound, b * bound + 1))
    counts = np.empty(bound, dtype=np.int64)
    for depth in range(1, bound + 1):
        counts[depth - 1] = _ranked(survival, depth, ranked_rows[depth - 1],
                                    ranked_worths[depth - 1])
    best_rate, best = -np.inf, (1, 0)
    for depth in range(1, bound + 1):  # the grid of every depth
        n = counts[depth - 1]
        best_rate, best = _best_count(depth, 0, 0, grids[n, 1:], grids[n, 0],
                                      ranked_rows[depth - 1], ranked_worths[depth - 1], held,
                                      cached_total, b, target, overhead, draft_model, draft,
                                      best_rate, best)
    depth, d = best
    grid = grids[counts[depth - 1]]
    size = grid[0]
    place = 0
    while grid[1 + place] != d:
        place += 1
    lo = grid[1 + (place - 1 if place > 0 else 0)]
    hi = grid[1 + (place + 1 if place + 1 < size else size - 1)]
    _, best = _best_count(depth, lo, hi, grid[1:], -1, ranked_rows[depth - 1],
                          ranked_worths[depth - 1], held, cached_total, b, target, overhead,
                          draft_model, draft, -np.inf, (depth, lo))
    depth, d = best
    for x in range(d):
        ks[ranked_rows[depth - 1, x]] += 1

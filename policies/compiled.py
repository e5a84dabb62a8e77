"""`auto`'s per-step arithmetic, compiled (numba): its plan (each draft's worth, ranked), the
causal pairs or the ks of each draft total it prices, its pick (the total with the most tokens
per second, then each request's k), its draft stop and its fit of a step's outcomes
(`observe_step`, from their columns); `kld_variance`'s KL cleaning and variance ratio, which
it computes for every request every step; heuristic's, gammatune's, adaedl's and the oracle's
whole walks (their walkers' `walk_all`) and per-step rules, and the oracle's check of a
segment's caps; and a planner's alternatives as ks (the calibrated oracle's too).

Why compiled: `auto` decides every request's k every step, so the simulator runs it one step at
a time, and in numpy each step was some 40 small array operations: with its pricing, most of
the 100-230 us a step cost at batch 4-8, and the largest share of the default `spectune tune`
(docs/speed.md, "Compiled per-request loops"). As plain loops they cost a fraction. Each loop
does the numpy code's float operations in its order, with numpy's pairwise summation where the
numpy code sums a row (`_row_sum`), so `auto` decides the same ks to the bit;
tests/policies/test_auto_compiled.py and test_auto_columns.py compare them. (Its fit is compiled
since the simulator hands a step's outcomes as columns, `StepOutcomes`: from objects, gathering
each outcome's numbers cost what the loop saved.)

Loaded only with the simulator's compiled loops (`simulator.kernels`, which hands this module
to `policies.kernels`); without them `auto` runs its numpy code.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: numpy's pairwise summation sums a block of up to this many with eight accumulators
_BLOCK = 128
#: the caps a walk passes where its drafter has none (with capped False)
NO_CAP = np.zeros(0, dtype=np.int64)


@njit(cache=True)
def _row_sum(a, row: int, n: int) -> float:
    """np.add.reduce(a[row, :n], axis=1)'s row of a C-contiguous float matrix, to the bit: numpy
    adds to 0.0 the row's pairwise sum: fewer than 8 in order, up to _BLOCK with eight
    accumulators combined pairwise, the rest after them in order."""
    if n > a.shape[1] or not 0 <= row < a.shape[0]:
        raise IndexError("_row_sum: a row or a length past the matrix")
    if n < 8:
        total = -0.0
        for j in range(n):
            total += a[row, j]
        return 0.0 + total
    if n > _BLOCK:
        raise ValueError("_row_sum: rows longer than 128 are summed recursively by numpy")
    r0, r1, r2, r3 = a[row, 0], a[row, 1], a[row, 2], a[row, 3]
    r4, r5, r6, r7 = a[row, 4], a[row, 5], a[row, 6], a[row, 7]
    j = 8
    while j < n - n % 8:
        r0 += a[row, j]
        r1 += a[row, j + 1]
        r2 += a[row, j + 2]
        r3 += a[row, j + 3]
        r4 += a[row, j + 4]
        r5 += a[row, j + 5]
        r6 += a[row, j + 6]
        r7 += a[row, j + 7]
        j += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while j < n:
        total += a[row, j]
        j += 1
    return 0.0 + total


@njit(cache=True)
def _capped(x: float, cap: float) -> float:
    """np.minimum(x, cap): NaN stays NaN, and a tie gives the second (-0.0 and 0.0 tie)."""
    return x if x < cap or x != x else cap


@njit(cache=True)
def _floored(x: float) -> float:
    """np.maximum(x, 0.0): NaN stays NaN, and a tie gives the second (so -0.0 gives 0.0)."""
    return x if x > 0.0 or x != x else 0.0


@njit(cache=True)
def plan(a_pop, bin_table, rows, scales, depth: int, reach, price: float, discover: bool,
         streak_row: int, outside_below: int, alpha_max: float):
    """`Auto.choose`'s worths: each request's acceptance per depth (`alpha`, requests x
    depth: its bin's, times its scale, capped), the chance each draft is accepted (`survival`:
    alpha's running product; `discover`: the first draft of a request in a row up to
    `outside_below` also worth the streak it may find, `_discovery` at this draft `price`;
    zero from each request's `reach` on), and the nonzero worths ranked, largest first, ties
    in order (`order`, into survival.ravel(), and their worths)."""
    b = rows.shape[0]
    if scales.shape[0] != b or reach.shape[0] != b or depth > bin_table.shape[1]:
        raise IndexError("plan: rows, scales and reach of other lengths, or depth too large")
    for r in range(-1, b):  # (-1: the streak row) each row, and its bins, inside the tables
        row = streak_row if r < 0 else rows[r]
        if not 0 <= row < bin_table.shape[0]:
            raise IndexError("plan: a state outside the bin table")
        for j in range(depth):
            if not 0 <= bin_table[row, j] < a_pop.shape[0]:
                raise IndexError("plan: a bin outside the acceptance per bin")
    alpha = np.empty((b, depth))
    survival = np.empty((b, depth))
    for r in range(b):
        for j in range(depth):
            a = _capped(a_pop[bin_table[rows[r], j]] * scales[r], alpha_max)
            alpha[r, j] = a
            survival[r, j] = a if j == 0 else survival[r, j - 1] * a
    if discover:  # the worth of a chain as if in a streak of 1, less its worth now
        hot = np.empty((b, depth))
        over_hot = np.empty((b, depth))
        over_now = np.empty((b, depth))
        for r in range(b):
            for j in range(depth):
                a = _capped(a_pop[bin_table[streak_row, j]] * scales[r], alpha_max)
                hot[r, j] = a if j == 0 else hot[r, j - 1] * a
                over_hot[r, j] = _floored(hot[r, j] - price)
                over_now[r, j] = _floored(survival[r, j] - price)
        for r in range(b):
            gain = _row_sum(over_hot, r, depth) - _row_sum(over_now, r, depth)
            survival[r, 0] *= 1.0 + (_floored(gain) if rows[r] <= outside_below else 0.0)
    count = 0
    for r in range(b):
        for j in range(depth):
            if j >= reach[r]:
                survival[r, j] = 0.0
            elif survival[r, j] != 0.0:
                count += 1
    worth = survival.ravel()
    order = np.argsort(-worth, kind="mergesort")[:count]
    return alpha, survival, order, worth[order]


@njit(cache=True)
def verify_pairs(order, depth: int, contexts, before: int):
    """`Auto._price`'s causal pairs of each draft total D = 0, 1, ... (the D first drafts of
    `order`): `before` (the verify pass's pairs without drafts), then the j-th draft (from 1)
    of request r adds its c_r + j + 1, c_r its KV before the verify (context - 1)."""
    pairs = np.empty(order.shape[0] + 1, dtype=np.int64)
    pairs[0] = before
    for i in range(order.shape[0]):
        r, j = order[i] // depth, order[i] % depth
        if not 0 <= r < contexts.shape[0]:
            raise IndexError("verify_pairs: a draft of a request past the contexts")
        pairs[i + 1] = pairs[i] + contexts[r] - 1 + j + 2
    return pairs


@njit(cache=True)
def prefix_counts(rows, totals, b: int):
    """A planner's alternatives as ks (`policies.base.prefix_counts`): for each total D, each
    request's count among the first D entries of `rows` (totals x b)."""
    counts = np.zeros((totals.shape[0], b), dtype=np.int64)
    for t in range(totals.shape[0]):
        if not 0 <= totals[t] <= rows.shape[0]:
            raise IndexError("prefix_counts: a total past the ranked drafts")
        for i in range(totals[t]):
            if not 0 <= rows[i] < b:
                raise IndexError("prefix_counts: a draft of a request past the batch")
            counts[t, rows[i]] += 1
    return counts


@njit(cache=True, error_model="numpy")  # a zero time divides as numpy does (inf), no error
def pick(ranked, totals, times, b: int, k0_bonus: float, survival, slack: float):
    """`Auto.choose`'s pick: each draft total D's tokens per second (b plus the D best worths,
    over its step time; D = 0's times `k0_bonus`), the first best D, and where it drafts, its
    threshold (the D-th worth) and each request's k: its drafts worth at least the threshold
    times `slack`. Returns (D, threshold, ks)."""
    n = ranked.shape[0]
    if totals.shape[0] != times.shape[0] or totals.shape[0] == 0:
        raise IndexError("pick: totals and times of other lengths, or none")
    cum = np.empty(n + 1)
    cum[0] = 0.0
    for i in range(n):
        cum[i + 1] = ranked[i] if i == 0 else cum[i] + ranked[i]
    best, best_rate = 0, 0.0
    for i in range(totals.shape[0]):
        if totals[i] < 0 or totals[i] > n:
            raise IndexError("pick: a draft total outside the ranked drafts")
        rate = (b + cum[totals[i]]) / times[i]
        if i == 0:
            rate *= k0_bonus
        if i == 0 or rate > best_rate or (rate != rate and best_rate == best_rate):
            best, best_rate = i, rate
    drafts = totals[best]
    ks = np.zeros(survival.shape[0], dtype=np.int64)
    if drafts == 0:
        return 0, np.inf, ks
    threshold = ranked[drafts - 1]
    cut = threshold * slack
    for r in range(survival.shape[0]):
        for j in range(survival.shape[1]):
            if survival[r, j] >= cut:
                ks[r] += 1
    return drafts, threshold, ks


@njit(cache=True)
def _top1_bin(value: float, bins: int) -> int:
    """`auto._top1_bins` of one value (NaN and below 0: the lowest bin; 1 and above: the top)."""
    v = value * bins
    if not v >= 0.0:
        return 0
    return bins - 1 if v >= bins - 1 else int(v)


@njit(cache=True)
def stop_lengths(plan_alpha, confidence, top1, ks, threshold: float, alpha_max: float):
    """`Auto.stop_chains`: each chain's length, where it stops drafting (after the first draft
    whose chance of being right through it, its confidence known, times the next draft's
    planned acceptance falls below `threshold`), at most its k."""
    b, width = top1.shape[0], top1.shape[1]
    if plan_alpha.shape[0] != b or ks.shape[0] != b or width > plan_alpha.shape[1]:
        raise IndexError("stop_lengths: plan, signals and ks of other shapes")
    bins = confidence.shape[0]
    out = np.empty(b, dtype=np.int64)
    for r in range(b):
        length = width
        through = 1.0
        for j in range(width):
            a = _capped(plan_alpha[r, j] * confidence[_top1_bin(top1[r, j], bins)], alpha_max)
            through = a if j == 0 else through * a
            if j + 1 < width and through * plan_alpha[r, j + 1] < threshold:
                length = j + 1
                break
        out[r] = length if length <= ks[r] else ks[r]
    return out


@njit(cache=True)
def observe_step(seen_by_bin, accepted_by_bin, top1_observed, top1_expected, a_pop, lift,
                 bin_table, states, ratios, ks, hits, top1, known, new: int, fresh: int,
                 cold: int, max_streak: int):
    """`Auto.observe_columns`' fit of one step's outcomes: adds each verified position's
    exposure and hits to the four count arrays (in place, request after request and position
    after position, as the Python loop adds them) and returns each request's expected accepted
    drafts and its state after the step (rows that drafted nothing: 0.0 and their state).
    States as `auto` numbers them: new, cold, fresh, then streaks 1.. (bin_table's rows from
    `new` on, streaks of `max_streak` or more sharing the last)."""
    n, bins = ks.shape[0], top1_observed.shape[0]
    if not (states.shape[0] == n and ratios.shape[0] == n and hits.shape[0] == n
            and known.shape[0] == n and top1.shape[0] == n):
        raise IndexError("observe_step: columns of other lengths")
    expected_out = np.zeros(n)
    after = states.copy()
    for r in range(n):
        k = ks[r]
        if k == 0:
            continue
        h, state, ratio = hits[r], states[r], ratios[r]
        seen = h + 1 if h < k else k  # the accepted drafts and the first rejection
        read = known[r] if known[r] < seen else seen  # those whose confidence was read
        if seen > bin_table.shape[1] or read > top1.shape[1] or h < 0:
            raise IndexError("observe_step: a chain past the bins or its signals")
        row = (state if state < max_streak else max_streak) - new
        if not 0 <= row < bin_table.shape[0]:
            raise IndexError("observe_step: a state outside the bins")
        expected = 0.0
        for i in range(seen):
            b = bin_table[row, i]
            hit = 1.0 if i < h else 0.0
            if i >= read:  # no confidence read: a factor of 1 (the same floats)
                seen_by_bin[b] += ratio
                accepted_by_bin[b] += hit
                expected += a_pop[b]
                continue
            t = _top1_bin(top1[r, i], bins)
            confidence = lift[t]
            seen_by_bin[b] += ratio * confidence
            accepted_by_bin[b] += hit
            expected += a_pop[b] * confidence
            top1_observed[t] += hit
            top1_expected[t] += a_pop[b] * ratio
        expected_out[r] = expected
        if h == k:
            after[r] = (state if state > fresh else fresh) + h  # a streak goes on
        else:
            after[r] = fresh if h else cold
    return expected_out, after


@njit(cache=True)
def _sum(a, n: int) -> float:
    """np.add.reduce(a[:n]) of a contiguous float vector, to the bit (`_row_sum`'s rule)."""
    return _row_sum(a.reshape((1, a.shape[0])), 0, n)


@njit(cache=True, error_model="numpy")
def _weighted_variance(values, start: int, n: int, weights, total: float) -> float:
    """`kld_variance.weighted_variance` of values[start:start + n] with its `_weights`
    (weights, their sum): the weighted mean, then the weighted mean square deviation, each a
    numpy sum over their total."""
    terms = np.empty(n)
    for i in range(n):
        terms[i] = weights[i] * values[start + i]
    mean = _sum(terms, n) / total
    for i in range(n):
        deviation = values[start + i] - mean
        terms[i] = weights[i] * (deviation * deviation)
    return _sum(terms, n) / total


@njit(cache=True, error_model="numpy")
def variance_ratio(history, long_weights, long_total: float, short_weights,
                   short_total: float, if_flat: float) -> float:
    """`kld_variance.variance_ratio` of a history of 2 to 128 values: the weighted variance of
    its newest third (the short weights' length) over that of the whole, or `if_flat` where
    the whole's is below 1e-6."""
    n, short = history.shape[0], short_weights.shape[0]
    if n < 2 or n > _BLOCK or long_weights.shape[0] != n or not 1 <= short <= n:
        raise IndexError("variance_ratio: a history of 2..128 values and its weights")
    whole = _weighted_variance(history, 0, n, long_weights, long_total)
    if whole < 1e-6:
        return if_flat
    return _weighted_variance(history, n - short, short, short_weights, short_total) / whole


@njit(cache=True)
def clean_kl(values, ceiling: float):
    """`kld_variance.clean_kl`: NaN dropped, the rest clipped to [0, ceiling] (np.maximum,
    then np.minimum)."""
    out = np.empty(values.shape[0])
    n = 0
    for i in range(values.shape[0]):
        v = values[i]
        if v != v:
            continue
        out[n] = _capped(_floored(v), ceiling)
        n += 1
    return out[:n]


@njit(cache=True)
def _walk_arrays(run, cap, capped: bool, name: str):
    """A walk's arrays (`walk_alone`'s: tokens emitted before each step and after the last,
    from 0; each step's drafts), the caps checked against the acceptance run."""
    m = run.shape[0]
    if capped and cap.shape[0] < m:
        raise IndexError(name + ": caps shorter than the acceptance run")
    walk = np.empty(m + 1, dtype=np.int64)
    walk[0] = 0
    return walk, np.empty(m, dtype=np.int64)


@njit(cache=True)
def _walk_step(run, cap, capped: bool, p: int, k: int, name: str):
    """`walk_alone`'s step at position p of the walk: k cut to cap[p] (`capped`), min(k,
    run[p]) accepted and one more emitted, cut at the walk's end. Returns (k, emitted)."""
    if capped and cap[p] < k:
        k = cap[p]
    if k < 0 or run[p] < 0:  # it would not move forward
        raise ValueError(name + ": a negative cap or acceptance run")
    accepted = (run[p] if run[p] < k else k) if k else 0
    left = run.shape[0] - p
    return k, accepted + 1 if accepted < left else left


@njit(cache=True)
def heuristic_next(k: int, drafted: int, accepted: int, grow: int, shrink: int,
                   ceiling: int) -> int:
    """`Heuristic._next`: a request's k after a step that drafted (+grow where every draft
    was accepted, else -shrink but not below 1), at most `ceiling`."""
    k = k + grow if accepted >= drafted else max(1, k - shrink)
    return k if k < ceiling else ceiling


@njit(cache=True)
def gammatune_next(g: int, g_hat: float, drafted: int, accepted: int, delta: int, eta: float,
                   low: int, high: int, tolerance: float):
    """`GammaTune._next`: a request's (g, g_hat) after a step that drafted: +delta where every
    draft was accepted, else g_hat smoothed toward the accepted count and g its ceiling, each
    clamped to low..high."""
    if accepted >= drafted:
        return min(max(g + delta, low), high), g_hat
    g_hat = min(max((1.0 - eta) * g_hat + eta * accepted, float(low)), float(high))
    return min(max(math.ceil(g_hat - tolerance), low), high), g_hat


@njit(cache=True)
def adaedl_next(lam: float, rate: float, drafted: int, accepted: int, depth: int,
                beta1: float, beta2: float, epsilon: float, target: float):
    """`AdaEDL._observe_one`: a request's (lambda, acceptance rate) after a step that drafted
    (`depth`: its cap, min(max_k, the engine's k_max))."""
    rate = beta1 * rate + (1.0 - beta1) * (accepted / drafted)
    if rate < target:
        aim = lam + epsilon
    elif rate > target and accepted >= depth:
        aim = lam - epsilon
    else:
        aim = lam
    return beta2 * lam + (1.0 - beta2) * aim, rate


@njit(cache=True)
def heuristic_walk(run, cap, capped: bool, k_max: int, k: int, grow: int, shrink: int,
                   ceiling: int):
    """`walk_alone` of a heuristic request (its walker's k and saw, step after step): each step
    drafts d = min(k, k_max), cut to cap[p] (`capped`), accepts min(d, run[p]) and emits one
    more, cut at the end of `run`; a step that drafts moves k as `Heuristic._next` does.
    Returns the walk (tokens emitted before each step and after the last, from 0), each
    step's drafts, the last k, and whether any step drafted."""
    if k_max < 0:
        raise ValueError("heuristic_walk: k_max below 0")
    walk, drafts = _walk_arrays(run, cap, capped, "heuristic_walk")
    p = steps = 0
    drafted_any = False
    while p < run.shape[0]:
        d, emit = _walk_step(run, cap, capped, p, k if k < k_max else k_max, "heuristic_walk")
        if d > 0:  # the walker's saw(d, emit - 1, ...), as observe
            drafted_any = True
            k = heuristic_next(k, d, emit - 1, grow, shrink, ceiling)
        p += emit
        walk[steps + 1] = p
        drafts[steps] = d
        steps += 1
    return walk[: steps + 1], drafts[:steps], k, drafted_any


@njit(cache=True)
def gammatune_walk(run, cap, capped: bool, k_max: int, g: int, g_hat: float, delta: int,
                   eta: float, low: int, high: int, tolerance: float):
    """`walk_alone` of a gammatune request (its walker's k and saw, step after step): each step
    drafts d = min(g, k_max), cut to cap[p] (`capped`), accepts min(d, run[p]) and emits one
    more, cut at the end of `run`; a step that drafts moves g as `GammaTune._next` does (+delta
    where all were accepted, else g to the ceiling of the smoothed g_hat, clamped). Returns the
    walk (tokens emitted before each step and after the last, from 0), each step's drafts, the
    last g and g_hat, and whether any step drafted and any rejected."""
    if k_max < 0 or low < 1:
        raise ValueError("gammatune_walk: k_max below 0 or g_min below 1")
    walk, drafts = _walk_arrays(run, cap, capped, "gammatune_walk")
    p = steps = 0
    drafted_any = rejected_any = False
    while p < run.shape[0]:
        k, emit = _walk_step(run, cap, capped, p, g if g < k_max else k_max,  # g_min >= 1
                             "gammatune_walk")
        if k > 0:  # the walker's saw(k, emit - 1, ...), as observe
            drafted_any = True
            rejected_any = rejected_any or emit - 1 < k
            g, g_hat = gammatune_next(g, g_hat, k, emit - 1, delta, eta, low, high, tolerance)
        p += emit
        walk[steps + 1] = p
        drafts[steps] = k
        steps += 1
    return walk[: steps + 1], drafts[:steps], g, g_hat, drafted_any, rejected_any


@njit(cache=True)
def adaedl_walk(run, cap, capped: bool, start: int, bound, depth: int, lam: float, rate: float,
                beta1: float, beta2: float, epsilon: float, target: float):
    """`walk_alone` of an adaedl request from output position `start` (its walker's k and saw,
    step after step): each step drafts up to the first position from its own whose entropy
    bound is not at least lambda (`bound`: per output position; `depth` at most), cut to
    cap[p] (`capped`), accepts min(d, run[p]) and emits one more, cut at the end of `run`; a
    step that drafts moves the acceptance rate and lambda as `AdaEDL._observe_one` does.
    Returns the walk, each step's drafts, the last rate and lambda, and whether any drafted."""
    if start < 0 or depth < 0:
        raise ValueError("adaedl_walk: a negative start or depth")
    walk, drafts = _walk_arrays(run, cap, capped, "adaedl_walk")
    p = steps = 0
    drafted_any = False
    while p < run.shape[0]:
        k = depth  # the chain stops after its first bound below lambda (NaN: below), read
        # as the walker slices them (none past the last)
        for d in range(max(min(depth, bound.shape[0] - start - p), 0)):
            if not bound[start + p + d] >= lam:
                k = d + 1
                break
        k, emit = _walk_step(run, cap, capped, p, k, "adaedl_walk")
        if k > 0:  # the walker's saw(k, emit - 1, ...): `_observe_one`
            drafted_any = True
            lam, rate = adaedl_next(lam, rate, k, emit - 1, depth, beta1, beta2, epsilon,
                                    target)
        p += emit
        walk[steps + 1] = p
        drafts[steps] = k
        steps += 1
    return walk[: steps + 1], drafts[:steps], rate, lam, drafted_any


@njit(cache=True)
def oracle_walk(run, cap, capped: bool, bound: int):
    """`walk_alone` of an oracle request where its batch cap does not bind (its walker's k,
    step after step): each step asks k = min(run[p], the drafts before the walk's last token,
    bound), cut to cap[p] (`capped`), so every draft is accepted and one more token emitted.
    Returns the walk (tokens emitted before each step and after the last, from 0) and each
    step's drafts."""
    if bound < 0:
        raise ValueError("oracle_walk: a negative bound")
    walk, drafts = _walk_arrays(run, cap, capped, "oracle_walk")
    m = run.shape[0]
    p = steps = 0
    while p < m:
        k = run[p]  # (plain comparisons: min of three, once per step)
        if k > m - p - 1:
            k = m - p - 1
        if k > bound:
            k = bound
        k, emit = _walk_step(run, cap, capped, p, k, "oracle_walk")
        p += emit
        walk[steps + 1] = p
        drafts[steps] = k
        steps += 1
    return walk[: steps + 1], drafts[:steps]


@njit(cache=True)
def cap_steps(asked, contexts, caps: int):
    """The oracle's check of a segment (`oracle._overruled_at`): per cap 0..caps (rows) and
    step (columns), the drafts and causal pairs of the step where each request drafts
    min(asked, cap) (`asked`, `contexts`: requests x steps): (k + 1) c + k (k + 1) / 2 pairs a
    request, the integers `cap_sums` adds cap by cap."""
    b, steps = asked.shape
    drafted = np.zeros((caps + 1, steps), dtype=np.int64)
    pairs = np.zeros((caps + 1, steps), dtype=np.int64)
    for t in range(steps):
        for r in range(b):
            k, c = asked[r, t], contexts[r, t]
            for cap in range(caps + 1):
                d = k if k < cap else cap
                drafted[cap, t] += d
                pairs[cap, t] += (d + 1) * c + d * (d + 1) // 2
    return drafted, pairs


@njit(cache=True)
def first_overruled(drafted, times, top, b: int) -> int:
    """The first step whose best cap (the most tokens per second over caps 0..top[t], the
    first of equals, as `oracle._best_cap` picks it) is below top[t], else how many steps."""
    steps = top.shape[0]
    for t in range(steps):
        best, best_rate = 0, -1.0
        for cap in range(top[t] + 1):
            rate = (b + drafted[cap, t]) / times[cap, t]
            if rate > best_rate:
                best, best_rate = cap, rate
        if best < top[t]:
            return t
    return steps


def warm() -> None:
    """Call each loop once on the types `auto` gives them (numba's one-time load here, not
    inside a run)."""
    table = np.zeros((3, 4), dtype=np.int64)
    rows = np.zeros(2, dtype=np.int64)
    scales, a_pop = np.ones(2), np.full(3, 0.5)
    alpha, survival, order, ranked = plan(a_pop, table, rows, scales, 4, np.full(2, 4), 0.1,
                                          True, 1, 0, 0.98)
    verify_pairs(order, 4, np.full(2, 8, dtype=np.int64), 10)
    totals = np.arange(len(ranked) + 1)
    prefix_counts(order // 4, totals, 2)
    pick(ranked, totals, np.ones(len(totals)), 2, 1.0, survival, 0.5)
    stop_lengths(alpha, np.ones(10), np.full((2, 3), 0.5), np.full(2, 3), 0.1, 0.98)
    counts = np.ones(3)
    observe_step(counts, counts.copy(), np.zeros(10), np.zeros(10), a_pop, np.ones(10), table,
                 rows, scales, np.full(2, 2), np.ones(2, dtype=np.int64), np.full((2, 3), 0.5),
                 np.full(2, 3), -2, 0, -1, 1)
    weights = np.ones(6)
    weights.flags.writeable = False  # as kld_variance's cached weights are
    variance_ratio(np.arange(6.0), weights, 6.0, weights[:2], 2.0, 20.0)
    clean_kl(np.arange(3.0), 18.4)
    for capped in (True, False):
        gammatune_walk(np.ones(4, dtype=np.int64), np.ones(4, dtype=np.int64), capped, 10, 3,
                       3.0, 2, 0.3, 1, 10, 1e-9)
        heuristic_walk(np.ones(4, dtype=np.int64), np.ones(4, dtype=np.int64), capped, 10, 3,
                       2, 1, 10)
        adaedl_walk(np.ones(4, dtype=np.int64), np.ones(4, dtype=np.int64), capped, 1,
                    np.ones(6), 10, 0.5, 0.0, 0.5, 0.9, 0.01, 0.9)
        oracle_walk(np.ones(4, dtype=np.int64), np.ones(4, dtype=np.int64), capped, 10)
    asked = np.ones((2, 3), dtype=np.int64)
    drafted, _ = cap_steps(asked, asked + 5, 1)
    first_overruled(drafted, np.ones((2, 3)), asked[0], 2)

"""A fixed batch's decode steps under `auto`, run in one compiled loop (numba): each step its
plan, pricing and pick (`Auto.choose`), its draft stop (`Auto.stop_chains`), the drafter's cap,
the step's time on the roofline, the replay's verdicts and `Auto.observe_columns`' fit, until a
request finishes or the step that ends at or after the next arrival.

Why: `auto` learns from every step's outcomes, so no request can be walked ahead alone; one
step at a time through `Replica._mixed_iteration` cost 60-75 us of Python per step, against the
few us its arithmetic takes (docs/speed.md, "auto's steps in one compiled loop"). The loop calls
auto's own compiled pieces (policies/compiled.py) and the roofline's pass (`_pass_s`), with the
step path's numbers in its order, so a run's records are the same to the bit;
tests/simulator/test_compiled_steps.py compares them with the step path's.

Imported where a run takes these steps (simulator/stepped.py), after `simulator.kernels` loaded
the compiled loops.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from policies.compiled import _sum, observe_step, pick, plan, stop_lengths, verify_pairs
from simulator.compiled import _pass_s

#: why a run of steps ended (`auto_steps`' first result)
FINISHED, ARRIVAL, WINDOW, STEPS = 0, 1, 2, 3


@njit(cache=True)
def _step_s(cached: int, drafted: int, pairs: int, b: int, target, overhead: float) -> float:
    """One model-free verify step of b requests on the roofline (`StepCostModel._target_s`)."""
    m0, m1, f_q, f_pair, fixed, comm, c0, c1 = target
    return _pass_s(cached, drafted + b, pairs, m0, m1, f_q, f_pair, fixed, comm, c0, c1) + overhead


@njit(cache=True, error_model="numpy")  # a zero time divides as numpy does (inf), no error
def draft_price(contexts, cached_sum: int, target, overhead: float) -> float:
    """One more draft's price in tokens (`Auto._draft_price`): the tokens a step of these
    requests (`cached_sum`: their KV before the verify) would emit in the time the first
    request's draft adds, at the rate of a step without drafts."""
    b = contexts.shape[0]
    before = cached_sum + b  # the verify pass's causal pairs without drafts
    t0 = _step_s(cached_sum, 0, before, b, target, overhead)
    t1 = _step_s(cached_sum, 1, before + contexts[0] - 1 + 2, b, target, overhead)
    return b * (t1 - t0) / t0


@njit(cache=True, error_model="numpy")  # a zero time divides as numpy does (inf), no error
def auto_steps(prompt, output, generated, base, offsets, run, cap, top1, capped: bool,
               seen_bins, accepted_bins, top1_observed, top1_expected, states, observed,
               expected, weight: float, k0_bonus: float, stop_slack: float, depth: int,
               bin_table, target, overhead: float, start: float, horizon: float,
               max_steps: int, new: int, fresh: int, cold: int, max_streak: int,
               alpha_max: float):
    """Up to `max_steps` decode steps of the b requests (`prompt`, `output` tokens; `generated`
    so far), as the step path takes them. Request r's accepted runs, drafter caps (`capped`)
    and draft confidences at positions base[r] + i are run/cap/top1[offsets[r] + i], for i
    below its window (offsets[r + 1] - offsets[r]); a step whose positions pass a window
    (short of the request's end) is not taken. auto's counts (`seen_bins` .. `top1_expected`)
    and each request's state, accepted and expected drafts are updated in place.

    Returns (why it ended, steps taken, the clock before each step and after the last, each
    step's time, drafts, most drafts, accepted and emitted tokens, each request's tokens generated
    and drafts after the steps)."""
    b = prompt.shape[0]
    bins = top1_observed.shape[0]
    gen = generated.copy()
    drafted_by = np.zeros(b, dtype=np.int64)
    clock = np.empty(max_steps + 1)
    clock[0] = start
    durations = np.empty(max_steps)
    drafted_at = np.zeros(max_steps, dtype=np.int64)
    max_k_at = np.zeros(max_steps, dtype=np.int64)
    accepted_at = np.zeros(max_steps, dtype=np.int64)
    emitted_at = np.zeros(max_steps, dtype=np.int64)
    rows = np.empty(b, dtype=np.int64)
    ratios = np.empty(b)
    scales = np.empty(b)
    contexts = np.empty(b, dtype=np.int64)
    reach = np.empty(b, dtype=np.int64)
    lift = np.empty(bins)
    confidence = np.empty(bins)
    a_pop = np.empty(seen_bins.shape[0])
    hits = np.empty(b, dtype=np.int64)
    seen = np.empty(b, dtype=np.int64)
    top1_rows = np.full((b, depth), np.nan)
    why = STEPS
    n = 0
    while n < max_steps:
        for r in range(b):  # every position this step reads inside the request's window
            end = base[r] + offsets[r + 1] - offsets[r]
            if gen[r] < base[r] or (end < output[r] and gen[r] + depth > end):
                why = WINDOW
                break
        if why == WINDOW:
            break
        # -- choose: each request's state and ratio, the confidence lift ------------------
        mean_lift = (_sum(top1_observed, bins) + weight) / (_sum(top1_expected, bins) + weight)
        for t in range(bins):
            lift[t] = (top1_observed[t] + weight) / (top1_expected[t] + weight)
            confidence[t] = lift[t] / mean_lift
        outside = False
        cached_sum = 0
        for r in range(b):
            state = states[r]
            rows[r] = (state if state < max_streak else max_streak) - new
            ratios[r] = (observed[r] + weight) / (expected[r] + weight)
            scales[r] = ratios[r] * mean_lift
            outside = outside or state <= fresh
            g = gen[r]
            contexts[r] = prompt[r] + g
            cached_sum += contexts[r]
            left = output[r] - g - 1
            most = depth if depth < left else left
            if capped:
                can = cap[offsets[r] + g - base[r]]
                most = most if most < can else can
            reach[r] = most
        for i in range(a_pop.shape[0]):
            a_pop[i] = accepted_bins[i] / seen_bins[i]
        cached_sum -= b  # the requests' KV before the verify
        price = draft_price(contexts, cached_sum, target, overhead) if outside else 0.0
        alpha, survival, order, ranked = plan(a_pop, bin_table, rows, scales, depth, reach,
                                              price, outside, 1 - new, fresh - new, alpha_max)
        totals = np.arange(ranked.shape[0] + 1)
        pairs = verify_pairs(order, depth, contexts, cached_sum + b)
        times = np.empty(totals.shape[0])
        for i in range(totals.shape[0]):
            times[i] = _step_s(cached_sum, totals[i], pairs[i], b, target, overhead)
        _, threshold, ks = pick(ranked, totals, times, b, k0_bonus, survival, stop_slack)
        # -- the draft stop (`Auto.stop_chains`), then the drafter's cap -------------------
        width = 0
        for r in range(b):
            width = ks[r] if ks[r] > width else width
        if width > 1:
            rows_at = np.empty((b, width))
            for r in range(b):
                last = output[r] - 1
                for d in range(width):
                    p = gen[r] + d
                    p = p if p < last else last
                    rows_at[r, d] = top1[offsets[r] + p - base[r]]
            ks = stop_lengths(alpha, confidence, rows_at, ks, threshold, alpha_max)
        if capped:
            for r in range(b):
                can = cap[offsets[r] + gen[r] - base[r]]
                ks[r] = ks[r] if ks[r] <= can else can
        # -- the step's time (`StepCostModel.iteration_s` of a model-free chain) ------------
        step_drafts = 0
        step_pairs = 0
        most = 0
        for r in range(b):
            k, c = ks[r], contexts[r] - 1
            step_drafts += k
            step_pairs += (k + 1) * c + (k + 1) * (k + 2) // 2
            most = k if k > most else most
        durations[n] = _step_s(cached_sum, step_drafts, step_pairs, b, target, overhead)
        clock[n + 1] = clock[n] + durations[n]  # (as the clock adds each step's timeout)
        # -- verification (`Replica._apply_decode`) and auto's fit of it --------------------
        accepted_total = 0
        emitted_total = 0
        finished = False
        for r in range(b):
            g, k = gen[r], ks[r]
            at = offsets[r] + g - base[r]
            accepted = 0
            if k:
                accepted = k if k <= run[at] else run[at]
            left = output[r] - g
            emit = accepted + 1 if accepted < left else left
            hits[r] = emit - 1
            shown = emit if emit < k else k  # min(accepted + 1, k, left)
            seen[r] = shown
            for i in range(shown):
                top1_rows[r, i] = top1[at + i]
            gen[r] = g + emit
            drafted_by[r] += k
            accepted_total += emit - 1
            emitted_total += emit
            finished = finished or gen[r] >= output[r]
        expected_now, after = observe_step(seen_bins, accepted_bins, top1_observed,
                                           top1_expected, a_pop, lift, bin_table, states,
                                           ratios, ks, hits, top1_rows, seen, new, fresh, cold,
                                           max_streak)
        for r in range(b):
            if ks[r]:
                observed[r] += hits[r]
                expected[r] += expected_now[r]
                states[r] = after[r]
        drafted_at[n] = step_drafts
        max_k_at[n] = most
        accepted_at[n] = accepted_total
        emitted_at[n] = emitted_total
        n += 1
        if finished:
            why = FINISHED
            break
        if clock[n] >= horizon:
            why = ARRIVAL
            break
    return (why, n, clock[: n + 1], durations[:n], drafted_at[:n], max_k_at[:n],
            accepted_at[:n], emitted_at[:n], gen, drafted_by)


def warm() -> None:
    """Call the loop once on the types `simulator.stepped` gives it (numba's one-time load,
    from its cache, here and not inside a run)."""
    from policies.auto import ALPHA_MAX, BIN_TABLE, COLD, FRESH, MAX_STREAK, NEW

    ones = np.ones(2, dtype=np.int64)
    window = np.ones(8, dtype=np.int64)
    auto_steps(ones * 4, ones * 4, ones, ones, np.array([0, 4, 8], dtype=np.int64), window,
               window, np.full(8, 0.5), True, np.ones(19), np.ones(19), np.zeros(10),
               np.zeros(10), ones * NEW, np.zeros(2), np.zeros(2), 4.0, 1.0, 0.5, 2,
               BIN_TABLE, (1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0), 0.0, 0.0, np.inf, 4,
               NEW, FRESH, COLD, MAX_STREAK, ALPHA_MAX)
    draft_price(ones, 0, (1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0), 0.0)

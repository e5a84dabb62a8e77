"""A fixed batch's decode steps under a policy that learns from every step, run in one compiled
loop (numba). `auto_steps`: each step auto's plan, pricing and pick (`Auto.choose`), its draft
stop (`Auto.stop_chains`), the drafter's cap, the step's time on the roofline (with a draft
model's chain and catch-up), the replay's verdicts and `Auto.observe_columns`' fit.
`kld_steps`: kld_variance's ks, the step, and its fit (`KldVariance.observe`). Both run until a
request finishes or the step that ends at or after the next arrival; under vLLM's scheduler
(`planned`) their engine steps, each verifying the drafts proposed at the last one's end, also
up to a step its schedule() would trim or preempt (ROOM); and both take one engine step's
policy part alone (PROPOSE: a step with prompt chunks, after the scheduler committed it).

Why: such a policy cannot be walked one request at a time (each step's ks depend on what the
whole batch's last steps revealed), and one step at a time through `Replica._mixed_iteration`
cost 40-75 us of Python per step against the few us its arithmetic takes (docs/speed.md, "Runs
of steps: auto and kld_variance"). The loops call the policies' own compiled pieces
(policies/compiled.py) and the roofline's passes (simulator/compiled.py) with the step path's
numbers in its order, so a run's records are the same to the bit;
tests/simulator/test_compiled_steps.py compares them with the step path's.

Imported where a run takes these steps (simulator/stepped.py), after `simulator.kernels` loaded
the compiled loops.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from policies.compiled import (
    _sum,
    clean_kl,
    observe_step,
    pick,
    plan,
    prefix_counts,
    stop_lengths,
    variance_ratio,
    verify_pairs,
)
from simulator.compiled import _pass_s, alternatives_times, chain_step_time
from simulator.run_records import (
    ACCEPTED,
    CLOCK,
    DRAFTED,
    DURATION,
    EMITTED,
    KV,
    MAX_K,
    RECORDS,
)

#: why a run of steps ended (`auto_steps`' first result; ROOM: under vLLM's scheduler, before a
#: step whose proposals the budget would trim or the free blocks could not hold)
FINISHED, ARRIVAL, STEPS, ROOM = 0, 1, 2, 3
#: what `auto_steps` takes: runs of steps, or one step's choice alone, or one step's
#: verification and fit alone with the ks given (a step taken one at a time, with prompt chunks),
#: or under vLLM's scheduler one engine step's choice, fit and proposals, its outcomes given
RUNS, CHOOSE, VERIFY, PROPOSE = 0, 1, 2, 3


@njit(cache=True)
def _step_s(cached: int, drafted: int, pairs: int, b: int, target, overhead: float) -> float:
    """One model-free verify step of b requests on the roofline (`StepCostModel._target_s`)."""
    m0, m1, f_q, f_pair, fixed, comm, c0, c1 = target
    return _pass_s(cached, drafted + b, pairs, m0, m1, f_q, f_pair, fixed, comm, c0, c1) + overhead


@njit(cache=True)
def decode_step_s(verified, held, cached_sum: int, priced: bool, draft_model: bool, feeds,
                  target, draft, overhead: float):
    """A decode step of requests drafting `verified` over `held` tokens each before the verify
    (`cached_sum` their sum), as `StepCostModel.iteration_s` prices it (a model-free chain from
    its verify pass's sums, a draft model's its verify pass then its chain's passes, fed
    `feeds`): (seconds, drafts, most drafts); 0 seconds where not `priced` (a step whose time
    is the caller's)."""
    b = verified.shape[0]
    drafts = pairs = most = 0
    for r in range(b):
        k, c = verified[r], held[r]
        drafts += k
        pairs += (k + 1) * c + (k + 1) * (k + 2) // 2
        most = k if k > most else most
    if not priced:
        return 0.0, drafts, most
    if draft_model:  # (`_chain_step_s`)
        return chain_step_time(verified, held, feeds, True, target, draft, overhead), drafts, most
    return _step_s(cached_sum, drafts, pairs, b, target, overhead), drafts, most


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


@njit(cache=True)
def _records(records, drafted_by, b: int, steps: int, start: float):
    """A run's records in the caller's buffer (`records`: RECORDS rows of at least `steps` + 1),
    for up to `steps` steps: the clock before each step and after the last (from `start`), each
    step's time, drafts, most drafts, accepted and emitted tokens and KV tokens in allocated
    blocks (each written at every step taken, the counts as floats: exact); and each request's
    drafts (`drafted_by`, at least b, zeroed). (Buffers, not arrays made per run: numba hands
    each array it returns to Python at about 0.35 us.)"""
    if records.shape[0] != RECORDS or records.shape[1] < steps + 1 or drafted_by.shape[0] < b:
        raise IndexError("a run's record buffers are too small")
    records[CLOCK, 0] = start
    drafted_by[:b] = 0
    return (records[CLOCK], records[DURATION], records[DRAFTED], records[MAX_K],
            records[ACCEPTED], records[EMITTED], records[KV])


@njit(cache=True)
def step_emit(k: int, run, i: int, left: int) -> int:
    """The tokens a request's step emits drafting k at its trace position i (`Replica.
    _apply_decode`): min(k, run[i]) drafts accepted and one more, cut at the `left` it has to
    go."""
    accepted = 0
    if k:
        accepted = k if k <= run[i] else run[i]
    return accepted + 1 if accepted < left else left


@njit(cache=True)
def next_feeds(feeds, ks, emitted, rule: int) -> None:
    """`draft_feed.next_feed` of each request, in place (`rule`: simulator.compiled.RULES)."""
    for r in range(feeds.shape[0]):
        if rule == 2:  # one
            feeds[r] = 1
        elif ks[r] == 0:  # no chain: the committed tokens pile up for the next
            feeds[r] += emitted[r]
        elif rule == 1:  # committed
            feeds[r] = emitted[r]
        else:  # bonus
            feeds[r] = (1 if emitted[r] > ks[r] else 0) + 1


@njit(cache=True)
def _draft_totals(ranked, thresholds, geometric) -> np.ndarray:
    """`Auto._price`'s draft totals where a step is not priced from its sums (a draft model):
    0 and all, the drafts at or above each survival threshold, and the geometric totals of
    this many drafts (`geometric`: `geometric_totals`), each once, ascending."""
    n = ranked.shape[0]
    candidates = np.empty(2 + thresholds.shape[0] + geometric.shape[0], dtype=np.int64)
    candidates[0], candidates[1] = 0, n
    for t in range(thresholds.shape[0]):  # searchsorted(-ranked, -threshold, "right")
        above = 0
        while above < n and ranked[above] >= thresholds[t]:
            above += 1
        candidates[2 + t] = above
    for i in range(geometric.shape[0]):
        candidates[2 + thresholds.shape[0] + i] = geometric[i]
    totals = np.unique(candidates)
    return totals[totals <= n]


@njit(cache=True)
def _schedule(prompt, gen, spec, blocks, free: int, budget: int, block_size: int) -> int:
    """vLLM's schedule() of a steady batch's next step, where it runs every request's proposal
    (`spec`) whole: each request's blocks (`blocks`, in place) then hold its C + n = prompt +
    g + spec tokens. Returns the free blocks after, or -1 (nothing moved) where the budget
    would trim a proposal or the free blocks could not hold them (it would preempt)."""
    b = prompt.shape[0]
    allocated = 0
    tokens = b
    for r in range(b):
        need = -(-(prompt[r] + gen[r] + spec[r]) // block_size) - blocks[r]
        allocated += need if need > 0 else 0
        tokens += spec[r]
    if allocated > free or tokens > budget:
        return -1
    for r in range(b):
        need = -(-(prompt[r] + gen[r] + spec[r]) // block_size)
        blocks[r] = need if need > blocks[r] else blocks[r]
    return free - allocated


@njit(cache=True)
def _stop_and_cap(ks, alpha, confidence, threshold: float, alpha_max: float, output, gen, at,
                  top1, cap, capped: bool):
    """auto's draft stop of the chosen ks (`Auto.stop_chains`, reading each chain's draft
    confidences from the position `gen`), then the drafter's cap there."""
    b = ks.shape[0]
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
                rows_at[r, d] = top1[at[r] + p]
        ks = stop_lengths(alpha, confidence, rows_at, ks, threshold, alpha_max)
    if capped:
        for r in range(b):
            can = cap[at[r] + gen[r]]
            ks[r] = ks[r] if ks[r] <= can else can
    return ks


@njit(cache=True, error_model="numpy")  # a zero time divides as numpy does (inf), no error
def auto_steps(prompt, output, generated, at, run, cap, top1, capped: bool,
               seen_bins, accepted_bins, top1_observed, top1_expected, row_state, row_observed,
               row_expected, row_known, rows_of, weight: float, k0_bonus: float,
               stop_slack: float, depth: int,
               bin_table, target, overhead: float, start: float, horizon: float,
               max_steps: int, new: int, fresh: int, cold: int, max_streak: int,
               alpha_max: float, draft_model: bool, draft, feeds, rule: int, thresholds,
               geometric, mode: int, given_ks, planned: bool, spec, blocks, free: int,
               budget: int, total_blocks: int, block_size: int, records, drafted_by):
    """Up to `max_steps` decode steps of the b requests (`prompt`, `output` tokens; `generated`
    so far), as the step path takes them. Request r's accepted runs, drafter caps (`capped`)
    and draft confidences at its position g are run/cap/top1[at[r] + g] (`TraceStore`). auto's
    counts (`seen_bins` .. `top1_expected`) are updated in place, and each request's state,
    accepted and expected drafts in its row (`rows_of[r]` of `row_state` .. `row_known`,
    `auto.StateRows`) where it drafted.

    `draft_model`: the drafter is a model whose passes (`draft`'s numbers) each step pays,
    its chain's first pass feeding each request's `feeds` (updated in place by `rule`); auto
    then prices the draft totals of `thresholds` and `geometric` (row n: those of n drafts
    worth something) as each one's ks, not from the verify pass's sums.

    `mode`: RUNS; CHOOSE returns after the first step's choice, nothing moved; VERIFY takes one
    step with `given_ks` (its verification and fit; its time is not read); PROPOSE (with
    `planned`) one vLLM engine step taken one at a time (with prompt chunks): its choice, the
    fit of the drafts it verified (`spec`: 0 for a prompt chunk) and each request's tokens
    sampled (`given_ks`, as the scheduler committed them), and the drafts proposed at its end
    (in `spec`, read where the request sampled and goes on; its blocks and time not read).

    `planned`: vLLM V1's engine steps (`Replica._planned_iteration` of a steady batch): each
    step verifies the drafts proposed at the end of the last (`spec`, in place), and the ks
    chosen before it are proposed at its end, cut by the draft stop (where no request
    finished: the stop reads the plan of the same batch) and the drafter's cap at the new
    positions. Before each step the blocks schedule() allocates (`blocks`, each request's, in
    place; `free` in the pool) are taken; the run ends before a step the budget would trim or
    the free blocks could not hold.

    The records go in `records` (`_records`: the clock before each step and after the last, each
    step's time, drafts, most drafts, accepted and emitted tokens, and under `planned` its KV
    tokens in allocated blocks), each request's drafts in `drafted_by`, and its tokens
    generated move in `generated`. Returns (why it ended, steps taken, the last step's ks
    (`planned`: the proposals))."""
    b = prompt.shape[0]
    bins = top1_observed.shape[0]
    states = np.empty(b, dtype=np.int64)
    observed = np.empty(b)
    expected = np.empty(b)
    for r in range(b):  # (each request's row, written back where it drafted)
        states[r] = row_state[rows_of[r]]
        observed[r] = row_observed[rows_of[r]]
        expected[r] = row_expected[rows_of[r]]
    gen = generated  # (moved in place)
    clock, durations, drafted_at, max_k_at, accepted_at, emitted_at, kv_at = _records(
        records, drafted_by, b, max_steps, start)
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
    held = np.empty(b, dtype=np.int64)
    emits = np.empty(b, dtype=np.int64)
    two = np.zeros((2, b), dtype=np.int64)  # no drafts, and one for the first request
    ks = np.zeros(b, dtype=np.int64)
    # the drafts each step verifies: its ks, or under vLLM those proposed at the last's end
    verified = spec if planned else ks
    alpha = np.zeros((b, depth))  # (the plan's, where `planned` cuts the ks after the step)
    threshold = 0.0
    why = STEPS
    n = 0
    while n < max_steps:
        if planned and mode == RUNS:  # schedule(): every proposal whole, or the run ends
            free = _schedule(prompt, gen, spec, blocks, free, budget, block_size)
            if free < 0:
                why = ROOM
                break
            kv_at[n] = (total_blocks - free) * block_size
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
                can = cap[at[r] + g]
                most = most if most < can else can
            reach[r] = most
        for i in range(a_pop.shape[0]):
            a_pop[i] = accepted_bins[i] / seen_bins[i]
        cached_sum -= b  # the requests' KV before the verify
        for r in range(b):
            held[r] = contexts[r] - 1  # each request's KV before the verify
        if mode == VERIFY:  # (its ks given: one step taken one at a time)
            ks = given_ks.copy()
        else:
            price = 0.0
            if outside and draft_model:  # (`Auto._draft_price` of the draft model's steps)
                two[1, 0] = 1
                paid = alternatives_times(two, held, target, draft, overhead)
                price = b * (paid[1] - paid[0]) / paid[0]
            elif outside:
                price = draft_price(contexts, cached_sum, target, overhead)
            alpha, survival, order, ranked = plan(a_pop, bin_table, rows, scales, depth, reach,
                                                  price, outside, 1 - new, fresh - new, alpha_max)
            if draft_model:  # some totals, each priced as its ks
                totals = _draft_totals(ranked, thresholds, geometric[ranked.shape[0]])
                times = alternatives_times(prefix_counts(order // depth, totals, b), held, target,
                                           draft, overhead)
            else:  # every total, from the verify pass's sums
                totals = np.arange(ranked.shape[0] + 1)
                pairs = verify_pairs(order, depth, contexts, cached_sum + b)
                times = np.empty(totals.shape[0])
                for i in range(totals.shape[0]):
                    times[i] = _step_s(cached_sum, totals[i], pairs[i], b, target, overhead)
            _, threshold, ks = pick(ranked, totals, times, b, k0_bonus, survival, stop_slack)
            if not planned:  # (under vLLM, at the step's end)
                ks = _stop_and_cap(ks, alpha, confidence, threshold, alpha_max, output, gen,
                                   at, top1, cap, capped)
            if mode == CHOOSE:  # (nothing moved: the step's choice alone)
                return why, 0, ks
        if not planned:
            verified = ks
        # -- the step's time (PROPOSE: the caller's) ----------------------------------------
        durations[n], step_drafts, most = decode_step_s(verified, held, cached_sum,
                                                        mode != PROPOSE, draft_model, feeds,
                                                        target, draft, overhead)
        clock[n + 1] = clock[n] + durations[n]  # (as the clock adds each step's timeout)
        # -- verification (`Replica._apply_decode`) and auto's fit of it --------------------
        accepted_total = 0
        emitted_total = 0
        finished = False
        for r in range(b):
            g, k = gen[r], verified[r]
            i = at[r] + g  # the request's position g in the trace's arrays
            # (PROPOSE: the scheduler's, 0 for a chunk short of its prompt)
            emit = given_ks[r] if mode == PROPOSE else step_emit(k, run, i, output[r] - g)
            hits[r] = emit - 1
            shown = emit if emit < k else k  # min(accepted + 1, k, left)
            seen[r] = shown
            for j in range(shown):
                top1_rows[r, j] = top1[i + j]
            gen[r] = g + emit
            emits[r] = emit
            drafted_by[r] += k
            accepted_total += emit - 1
            emitted_total += emit
            finished = finished or gen[r] >= output[r]
        if draft_model:
            next_feeds(feeds, verified, emits, rule)
        expected_now, after = observe_step(seen_bins, accepted_bins, top1_observed,
                                           top1_expected, a_pop, lift, bin_table, states,
                                           ratios, verified, hits, top1_rows, seen, new, fresh,
                                           cold, max_streak)
        for r in range(b):
            if verified[r]:
                observed[r] += hits[r]
                expected[r] += expected_now[r]
                states[r] = after[r]
        drafted_at[n] = step_drafts
        max_k_at[n] = most
        accepted_at[n] = accepted_total
        emitted_at[n] = emitted_total
        n += 1
        if planned:  # the drafts proposed at the step's end, for the next (`Replica._propose`):
            # by each request that sampled and goes on; the stop reads the plan where that is
            # every request of the step (the plan's batch), else none
            every = True
            for r in range(b):
                every = every and emits[r] > 0 and gen[r] < output[r]
            if every:
                ks = _stop_and_cap(ks, alpha, confidence, threshold, alpha_max, output, gen,
                                   at, top1, cap, capped)
            elif capped:
                for r in range(b):
                    if emits[r] > 0 and gen[r] < output[r]:
                        can = cap[at[r] + gen[r]]
                        ks[r] = ks[r] if ks[r] <= can else can
            for r in range(b):
                spec[r] = ks[r]
        if finished:
            why = FINISHED
            break
        if clock[n] >= horizon:
            why = ARRIVAL
            break
    for r in range(b):
        if drafted_by[r]:
            row_state[rows_of[r]] = states[r]
            row_observed[rows_of[r]] = observed[r]
            row_expected[rows_of[r]] = expected[r]
            row_known[rows_of[r]] = True
    return why, n, ks


@njit(cache=True)
def _round_half_even(x: float) -> int:
    """Python's round(x) of a float to an int: halves to the even neighbour."""
    floor = math.floor(x)
    diff = x - floor  # (exact)
    if diff > 0.5 or (diff == 0.5 and floor % 2 == 1):
        return floor + 1
    return floor


@njit(cache=True)
def _warmup_bounds(count: int, most: int, warm_kl, n: int, k_min_cfg: int, k_max_cfg: int):
    """`kld_variance.warmup_bounds` of a warm-up's `count` accepted counts (`most` the
    largest) and its first n KL values in `warm_kl`."""
    if count == 0:
        return k_min_cfg, k_max_cfg
    mean_kl = _sum(warm_kl, n) / n if n else 0.0  # np.mean: the pairwise sum over the count
    max_kl = 1.0
    if n:
        max_kl = warm_kl[0]
        for i in range(1, n):
            max_kl = warm_kl[i] if warm_kl[i] > max_kl else max_kl
    if max_kl == 0.0:
        max_kl = 1.0
    k_max_r = min(k_max_cfg, max(k_min_cfg, _round_half_even(most * (1 + 0.5 * mean_kl / max_kl))))
    k_min_r = min(k_max_r, max(k_min_cfg, math.ceil(k_max_r * 0.1)))
    return k_min_r, k_max_r


@njit(cache=True)
def _dsl_step(ratio: float, mean_kl: float, k_min: int, k_max: int, alpha: float,
              temperature: float) -> int:
    """`kld_variance.dsl_step`."""
    d = mean_kl if abs(temperature) < 1e-8 else mean_kl / (temperature + 1e-8)
    x = alpha * d
    scale = math.exp(x) - 1.0 if x < 700.0 else math.inf
    product = 0.0 if ratio == 0.0 else ratio * scale
    if product <= 1.0:
        return max(k_min, math.ceil((k_max - k_min) * (1.0 - product) + k_min))
    return k_min


@njit(cache=True, error_model="numpy")
def kld_steps(prompt, output, generated, at, run, cap, kl, capped: bool, rows,
              k_state, ready, k_min, k_max, history, history_len, warm_kl, warm_kl_len,
              warm_count, warm_most, k_init: int, k_min_cfg: int, k_max_cfg: int,
              engine_k_max: int, weights, totals, alpha: float, temperature: float,
              batch_cap: bool, if_flat: float, ceiling: float, target, overhead: float,
              start: float, horizon: float, max_steps: int, records, drafted_by, mode: int,
              given_emits, decoding, planned: bool, spec, blocks, free: int, budget: int,
              total_blocks: int, block_size: int):
    """`auto_steps` for kld_variance: each step its ks (`KldVariance.choose`, the drafter's
    cap), time and verdicts, then its fit of each request's outcome (`KldVariance.observe`,
    request after request: the KL history, the warm-up, the bounds, the variance ratio and the
    next k, capped by the batch's mean). Request r's state is row rows[r] of the state arrays
    (`kld_variance.RequestRows`), updated in place; `weights` and `totals`: row n the weights
    of a history of n values and their sum. The same records and results as `auto_steps`' (no
    confidences: the KL windows in `kl`; no ks returned), `planned` and PROPOSE (`mode`) as
    there (a request's ks capped where proposed, at its new position; under PROPOSE,
    `decoding`: the request verified a step, the others prefilled a chunk and are not
    observed)."""
    b = prompt.shape[0]
    width = history.shape[1]
    gen = generated  # (moved in place)
    clock, durations, drafted_at, max_k_at, accepted_at, emitted_at, kv_at = _records(
        records, drafted_by, b, max_steps, start)
    emits_of = np.empty(b, dtype=np.int64)
    ks = np.empty(b, dtype=np.int64)
    # the drafts each step verifies: its ks, or under vLLM those proposed at the last's end
    verified = spec if planned else ks
    proposed = np.empty(b, dtype=np.int64)
    cached = np.empty(b, dtype=np.int64)  # each request's KV before the verify
    kept = np.empty(width)
    why = STEPS
    n = 0
    while n < max_steps:
        if planned and mode == RUNS:  # schedule(): every proposal whole, or the run ends
            free = _schedule(prompt, gen, spec, blocks, free, budget, block_size)
            if free < 0:
                why = ROOM
                break
            kv_at[n] = (total_blocks - free) * block_size
        # -- ks: each request's k within the bounds, then the drafter's cap (under vLLM where
        # it proposes them, at the step's end) ---------------------------------------------
        cached_sum = 0
        for r in range(b):
            k = k_state[rows[r]]
            k = k if k < k_max_cfg else k_max_cfg
            k = k if k < engine_k_max else engine_k_max
            k = k if k > 0 else 0
            g = gen[r]
            if capped and not planned:
                can = cap[at[r] + g]
                k = k if k <= can else can
            ks[r] = k
            cached[r] = prompt[r] + g - 1
            cached_sum += cached[r]
        durations[n], step_drafts, most = decode_step_s(verified, cached, cached_sum,
                                                        mode != PROPOSE, False, cached, target,
                                                        target, overhead)
        clock[n + 1] = clock[n] + durations[n]
        # -- verification, then each request's fit ------------------------------------------
        accepted_total = 0
        emitted_total = 0
        finished = False
        pool_sum = 0
        pool_n = 0
        for r in range(b):
            g, k, row = gen[r], verified[r], rows[r]
            i = at[r] + g  # the request's position g in the trace's arrays
            proposed[r] = -1
            if mode == PROPOSE:  # (the scheduler's: 0 for a chunk short of its prompt)
                emit = given_emits[r]
                if not decoding[r]:  # a prompt chunk: sampled (or not), not observed
                    gen[r] = g + emit
                    emits_of[r] = emit
                    continue
            else:
                emit = step_emit(k, run, i, output[r] - g)
            emits_of[r] = emit
            hits = emit - 1
            shown = emit if emit < k else k  # min(accepted + 1, k, left)
            gen[r] = g + emit
            drafted_by[r] += k
            accepted_total += hits
            emitted_total += emit
            finished = finished or gen[r] >= output[r]
            kls = clean_kl(kl[i: i + shown], ceiling)
            m = kls.shape[0]
            was_ready = ready[row]
            held = history_len[row]  # the history, extended and cut to its newest `width`
            keep = held + m if held + m < width else width
            first = held + m - keep
            for i in range(keep):
                j = first + i
                kept[i] = history[row, j] if j < held else kls[j - held]
            history[row, :keep] = kept[:keep]
            history_len[row] = keep
            if not was_ready:
                if keep < width:  # still warming up
                    warm_most[row] = hits if warm_count[row] == 0 or hits > warm_most[row] \
                        else warm_most[row]
                    warm_count[row] += 1
                    w = warm_kl_len[row]
                    if w + m > width:
                        raise IndexError("kld_steps: a warm-up past its history's length")
                    warm_kl[row, w: w + m] = kls
                    warm_kl_len[row] = w + m
                    if hits >= k_state[row]:
                        doubled = k_state[row] * 2 if k_state[row] > 0 else 1
                        k_state[row] = doubled if doubled < k_max_cfg else k_max_cfg
                    elif k_state[row] < k_min_cfg:
                        k_state[row] = k_min_cfg
                    continue
                k_min[row], k_max[row] = _warmup_bounds(warm_count[row], warm_most[row],
                                                        warm_kl[row], warm_kl_len[row],
                                                        k_min_cfg, k_max_cfg)
                ready[row] = True
                warm_count[row] = 0
                warm_most[row] = 0
                warm_kl_len[row] = 0
            if m == 0:
                continue  # nothing usable observed: keep k
            ratio = 0.0
            if keep >= 2:
                short = keep // 3 if keep // 3 > 1 else 1
                ratio = variance_ratio(history[row, :keep], weights[keep, :keep], totals[keep],
                                       weights[short, :short], totals[short], if_flat)
            mean_kl = _sum(kls, m) / m
            proposed[r] = _dsl_step(ratio, mean_kl, k_min[row], k_max[row], alpha,
                                    temperature)
            if was_ready and k > 0:
                pool_sum += proposed[r]
                pool_n += 1
        if batch_cap and pool_n:  # no k above the mean of those past warm-up that drafted
            ceiling_k = math.ceil(pool_sum / pool_n)
            for r in range(b):
                if proposed[r] >= 0 and proposed[r] > ceiling_k:
                    proposed[r] = ceiling_k
        for r in range(b):
            if proposed[r] >= 0:
                k_state[rows[r]] = proposed[r]
        drafted_at[n] = step_drafts
        max_k_at[n] = most
        accepted_at[n] = accepted_total
        emitted_at[n] = emitted_total
        n += 1
        if planned:  # the drafts proposed at the step's end (by each request that sampled and
            # goes on: the others' are not read), cut by the drafter's cap there
            for r in range(b):
                k = ks[r]
                if capped and emits_of[r] > 0 and gen[r] < output[r]:
                    can = cap[at[r] + gen[r]]
                    k = k if k <= can else can
                spec[r] = k
        if finished:
            why = FINISHED
            break
        if clock[n] >= horizon:
            why = ARRIVAL
            break
    return why, n


def warm() -> None:
    """Call the loops once on the types `simulator.stepped` gives them (numba's one-time load,
    from its cache, here and not inside a run)."""
    from policies.auto import ALPHA_MAX, BIN_TABLE, COLD, FRESH, MAX_STREAK, NEW

    ones = np.ones(2, dtype=np.int64)
    trace = np.ones(8, dtype=np.int64)
    numbers = (1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0)
    for draft_model in (False, True):
        auto_steps(ones * 4, ones * 4, ones.copy(), ones * 0, trace, trace, np.full(8, 0.5), True,
                   np.ones(19), np.ones(19), np.zeros(10), np.zeros(10), ones * NEW,
                   np.zeros(2), np.zeros(2), np.zeros(2, dtype=np.bool_), ones * 0, 4.0, 1.0,
                   0.5, 2, BIN_TABLE, numbers, 0.0, 0.0,
                   np.inf, 4, NEW, FRESH, COLD, MAX_STREAK, ALPHA_MAX, draft_model, numbers,
                   ones.copy(), 0, np.array([0.5]), np.zeros((9, 12), dtype=np.int64), RUNS,
                   ones, draft_model, ones.copy(), ones.copy(), 8, 64, 8, 16,
                   np.zeros((RECORDS, 5)), ones.copy())
    draft_price(ones, 0, numbers, 0.0)
    rows = np.zeros(4, dtype=np.int64)
    history = np.zeros((4, 3))
    kld_steps(ones * 4, ones * 4, ones.copy(), ones * 0, trace, trace, np.full(8, 0.5), True, ones,
              rows.copy(), np.zeros(4, dtype=np.bool_),
              rows.copy(), rows.copy(), history, rows.copy(), history.copy(), rows.copy(),
              rows.copy(), rows.copy(), 2, 1, 4, 4, np.ones((4, 3)), np.ones(4), 2.0, 0.0,
              True, 20.0, 18.4, numbers, 0.0, 0.0, np.inf, 4, np.zeros((RECORDS, 5)),
              ones.copy(), RUNS, ones.copy(), np.ones(2, dtype=np.bool_), False, ones.copy(),
              ones.copy(), 8, 64, 8, 16)

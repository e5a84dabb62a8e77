"""vLLM's engine steps of a steady batch under a policy that the plain scheduler walks a request
at a time (heuristic, gammatune, gammatune_plus, adaedl: each request's k from its own outcomes;
the oracle, knows=outcomes, on a model-free chain: each request's accepted run, cut at the
batch's best cap), under the oracle that knows probabilities (simulator/compiled_oracle.py) or
under goodput (its batch plan and censored estimate, or each request's:
simulator/compiled_goodput.py), run in one compiled loop (numba): each step's schedule()
check, the policy's `choose` before it, the step's time on the roofline (with a draft model's
chain), the replay's verdicts, the policy's `observe`, and the drafts proposed at the step's
end (adaedl's stop at its new lambda, the drafter's cap). goodput's and the oracle's decode
steps under the plain scheduler (whole prompts, or chunked prefill's steps with no prompt to
chunk) run in it too, each verifying the ks chosen before it.

Why: under the plain scheduler these policies are walked a request at a time
(`request.walk_alone`), but under vLLM's a step verifies the drafts chosen a step earlier and
its budget and blocks may trim, skip or preempt a request's step, so the replica stepped them
one engine step at a time, at 35-57 us of Python per step; goodput's held segments and the
oracle's checked walks cost two to five times these runs (docs/speed.md, "The walked policies
and goodput in runs of engine steps"). A run here ends where auto's does
(simulator/compiled_steps.py: a finish, the step that ends at or after the next arrival, or
before a step its schedule() would plan otherwise), so each step is the step path's, and a
run's records are the same to the bit (tests/simulator/test_compiled_walked.py).

Imported where a run takes these steps (simulator/stepped.py), after `simulator.kernels` loaded
the compiled loops.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from policies.compiled import adaedl_next, gammatune_next, heuristic_next
from simulator.compiled_goodput import (
    _goodput_ks,
    _goodput_observe,
    per_request_ks,
    per_request_observe,
)
from simulator.compiled_oracle import calibrated_ks
from simulator.compiled_steps import (
    ARRIVAL,
    FINISHED,
    ROOM,
    STEPS,
    _records,
    _schedule,
    _step_s,
    decode_step_s,
    next_feeds,
    step_emit,
)

#: the policies these steps stand for (`walked_steps`' `kind`)
HEURISTIC, GAMMATUNE, ADAEDL, ORACLE, GOODPUT, GOODPUT_PER_REQUEST, ORACLE_CALIBRATED = range(7)
#: ... by the names their `RequestStates` give
KINDS = {"heuristic": HEURISTIC, "gammatune": GAMMATUNE, "adaedl": ADAEDL, "oracle": ORACLE,
         "goodput": GOODPUT, "goodput_per_request": GOODPUT_PER_REQUEST,
         "oracle_calibrated": ORACLE_CALIBRATED}


@njit(cache=True)
def _adaedl_stop(k: int, lam: float, gamma: float, entropy, at: int, g: int, last: int) -> int:
    """adaedl's draft stop (`AdaEDL.stop_chains`) of a chain of k drafts from output position
    g: after its first draft whose entropy bound 1 - sqrt(max(gamma entropy, 0)) is not at
    least lambda (NaN: not), the last position read past the request's end."""
    for d in range(k):
        p = g + d
        p = p if p < last else last
        x = gamma * entropy[at + p]
        bound = 1.0 - math.sqrt(x if not x < 0.0 else 0.0)  # (NaN stays NaN: a stop)
        if not bound >= lam:
            return d + 1
    return k


@njit(cache=True, error_model="numpy")
def _oracle_ks(ks, prompt, gen, output, run, at, bound: int, target, overhead: float) -> None:
    """The oracle's `choose` (knows=outcomes, a model-free chain priced from its sums): each
    request's run min(accepted run, the drafts before its last token, bound), cut at the cap
    with the most tokens per second (`oracle._best_cap`: the first best, each cap's sums grown
    from the last's, `cap_sums`)."""
    b = ks.shape[0]
    top = 0
    contexts = 0
    for r in range(b):
        k = run[at[r] + gen[r]]
        left = output[r] - gen[r] - 1
        k = k if k < left else left
        k = k if k < bound else bound
        ks[r] = k
        top = k if k > top else top
        contexts += prompt[r] + gen[r]
    if top == 0:  # nothing to accept: no draft pays
        ks[:] = 0
        return
    cached = contexts - b
    best, best_rate = 0, -1.0
    drafted, pairs = 0, contexts  # k = 0: c_r pairs each
    for cap in range(top + 1):
        if cap:  # drafting cap rather than cap - 1 adds c_r + cap pairs
            for r in range(b):
                if ks[r] >= cap:
                    drafted += 1
                    pairs += prompt[r] + gen[r] + cap
        rate = (b + drafted) / _step_s(cached, drafted, pairs, b, target, overhead)
        if rate > best_rate:
            best, best_rate = cap, rate
    for r in range(b):
        ks[r] = ks[r] if ks[r] < best else best


@njit(cache=True)
def _choose(kind: int, ks, state, level, knobs, weights, k_max: int, prompt, gen, output, run,
            at, cap, capped: bool, values, kv_capacity: int, target, overhead: float,
            draft_model: bool, draft) -> None:
    """Each request's k as the policy's `choose` gives it (in `ks`; goodput's state moved)."""
    if kind == ORACLE:
        _oracle_ks(ks, prompt, gen, output, run, at, knobs[0], target, overhead)
        return
    if kind == ORACLE_CALIBRATED:  # (`values`: each position's chance of acceptance)
        calibrated_ks(ks, prompt, gen, output, at, values, cap, capped, knobs, target, overhead,
                      draft_model, draft)
        return
    if kind == GOODPUT:
        _goodput_ks(ks, state, level, knobs, weights, k_max, prompt, gen, kv_capacity, target,
                    overhead, draft_model, draft)
        return
    if kind == GOODPUT_PER_REQUEST:
        per_request_ks(ks, state, level, knobs, weights, k_max, prompt, gen, kv_capacity,
                       target, overhead, draft_model, draft)
        return
    for r in range(ks.shape[0]):
        if kind == ADAEDL:  # its depth for all: its stop cuts each chain
            ks[r] = knobs[0]
        else:
            ks[r] = state[r] if state[r] < k_max else k_max


@njit(cache=True)
def _observe(kind: int, r: int, k: int, seen: int, state, level, rate, knobs, weights,
             touched) -> None:
    """The policy's `observe` of request r's step that drafted k and accepted `seen`."""
    touched[r] |= 1 if seen >= k else 3
    if kind == HEURISTIC:
        state[r] = heuristic_next(state[r], k, seen, knobs[0], knobs[1], knobs[2])
    elif kind == GAMMATUNE:
        state[r], level[r] = gammatune_next(state[r], level[r], k, seen, knobs[0], weights[0],
                                            knobs[1], knobs[2], weights[1])
    elif kind == ADAEDL:  # (the oracle learns nothing)
        level[r], rate[r] = adaedl_next(level[r], rate[r], k, seen, knobs[0], weights[1],
                                        weights[2], weights[3], weights[4])
    elif kind == GOODPUT_PER_REQUEST:  # (the batch's goodput reads the step's sums: after)
        per_request_observe(r, k, seen, state, level, weights[0])


@njit(cache=True)
def _propose(kind: int, ks, spec, gen, output, emits, at, cap, capped: bool, entropy, level,
             gamma: float) -> None:
    """The drafts proposed at a step's end (`Replica._propose`, into `spec`): the k chosen
    before it, by each request that sampled and goes on, cut by adaedl's stop and the
    drafter's cap at its new position (the others' are unread)."""
    for r in range(ks.shape[0]):
        k = ks[r]
        g = gen[r]
        if emits[r] > 0 and g < output[r]:
            if kind == ADAEDL:
                k = _adaedl_stop(k, level[r], gamma, entropy, at[r], g, output[r] - 1)
            if capped:
                can = cap[at[r] + g]
                k = k if k <= can else can
        spec[r] = k


@njit(cache=True, error_model="numpy")  # a zero time divides as numpy does (inf), no error
def walked_steps(kind: int, prompt, output, generated, at, run, cap, values, capped: bool,
                 state, level, rate, knobs, weights, k_max: int, kv_capacity: int, target,
                 overhead: float, start: float, horizon: float, max_steps: int,
                 draft_model: bool, draft, feeds, rule: int, planned: bool, spec, blocks,
                 free: int, budget: int, total_blocks: int, block_size: int, records,
                 drafted_by, touched):
    """Up to `max_steps` engine steps of the b requests (`prompt`, `output` tokens; `generated`
    so far, moved in place) under `kind`'s policy, as `Replica._planned_iteration` takes a
    steady batch's. Request r's accepted runs, drafter caps (`capped`) and the policy's signal
    at its position g (adaedl: the draft's entropy; the oracle knowing probabilities: the
    chance of acceptance) are run/cap/values[at[r] + g] (`TraceStore`).

    Each request's state moves in place: heuristic's k (`state`); gammatune's g (`state`) and
    g_hat (`level`); adaedl's lambda (`level`) and acceptance rate (`rate`); the oracle has none;
    goodput's is the batch's (`state`: G_ACCEPTED .. G_PROBING, `level`: G_ALPHA), or per
    request the batch's and each request's (`state`: R_CALLS .. R_REPLANNED, then R_FIELDS per
    request; `level`: each request's estimate). The policy's
    integer parameters are `knobs` (heuristic: grow, shrink, ceiling; gammatune: delta, g_min,
    g_max; adaedl: its depth, which is min(max_k, k_max); the oracle: its bound, and knowing
    probabilities its grids after it (`Oracle.request_states`); goodput:
    replan_every, its k cap, faithful) and its others `weights` (gammatune: eta, the ceiling's
    tolerance; adaedl: gamma, beta1, beta2, epsilon, target acceptance; goodput: ema_keep,
    k0_bonus, kv_headroom). `touched[r]` gains 1 where request r drafted and 2 where a draft
    was rejected (what `observe` writes).

    `planned` (vLLM's engine steps): each step verifies the drafts proposed at the end of the
    last (`spec`, in place); schedule() first takes the blocks (`blocks`, in place; `free` in
    the pool), and the run ends before a step the budget would trim or the free blocks could
    not hold. The k chosen before the step (from the state after the last) is proposed at its
    end, by each request that goes on, cut by adaedl's stop and the drafter's cap at its new
    position. Else (the plain scheduler's `_mixed_iteration`, no prompt to chunk) each step
    verifies the ks chosen before it, cut so at its positions (into `spec`, scratch).
    `kv_capacity`: the KV cache the policy's context reads (goodput's plan). `draft_model`:
    the chain's passes (`draft`'s numbers) are paid, fed `feeds` (moved by `rule`).

    The records go in `records` (`compiled_steps._records`), each request's drafts in
    `drafted_by`. Returns (why it ended, steps taken)."""
    b = prompt.shape[0]
    gen = generated  # (moved in place)
    clock, durations, drafted_at, max_k_at, accepted_at, emitted_at, kv_at = _records(
        records, drafted_by, b, max_steps, start)
    ks = np.empty(b, dtype=np.int64)
    everyone = np.ones(b, dtype=np.bool_)  # (every request of a run's step decodes)
    going = np.ones(b, dtype=np.int64)  # (... and goes on before it)
    held = np.empty(b, dtype=np.int64)
    emits = np.empty(b, dtype=np.int64)
    why = STEPS
    n = 0
    while n < max_steps:
        if planned:
            free = _schedule(prompt, gen, spec, blocks, free, budget, block_size)
            if free < 0:  # schedule() would trim a proposal or preempt: the step path's
                why = ROOM
                break
            kv_at[n] = (total_blocks - free) * block_size
        # choose (the state after the last step), then the step's time
        _choose(kind, ks, state, level, knobs, weights, k_max, prompt, gen, output, run, at,
                cap, capped, values, kv_capacity, target, overhead, draft_model, draft)
        if not planned:  # (the plain scheduler's step verifies them, cut at its positions)
            _propose(kind, ks, spec, gen, output, going, at, cap, capped, values, level,
                     weights[0] if kind == ADAEDL else 0.0)
        cached_sum = 0
        for r in range(b):
            held[r] = prompt[r] + gen[r] - 1  # its KV before the verify
            cached_sum += held[r]
        durations[n], step_drafts, most = decode_step_s(spec, held, cached_sum, True,
                                                        draft_model, feeds, target, draft,
                                                        overhead)
        clock[n + 1] = clock[n] + durations[n]  # (as the clock adds each step's timeout)
        # verification (`Replica._planned_iteration`) and the policy's observe
        accepted_total = 0
        emitted_total = 0
        finished = False
        for r in range(b):
            g, k = gen[r], spec[r]
            emit = step_emit(k, run, at[r] + g, output[r] - g)
            gen[r] = g + emit
            emits[r] = emit
            drafted_by[r] += k
            accepted_total += emit - 1
            emitted_total += emit
            finished = finished or gen[r] >= output[r]
            if k > 0:  # observe: a step that drafted nothing teaches nothing
                _observe(kind, r, k, emit - 1, state, level, rate, knobs, weights, touched)
        if kind == GOODPUT:  # (its fit reads the step's sums)
            _goodput_observe(spec, emits, everyone, state, level, weights[0])
        if draft_model:
            next_feeds(feeds, spec, emits, rule)
        drafted_at[n] = step_drafts
        max_k_at[n] = most
        accepted_at[n] = accepted_total
        emitted_at[n] = emitted_total
        n += 1
        if planned:  # the drafts proposed at its end, for the next step
            _propose(kind, ks, spec, gen, output, emits, at, cap, capped, values, level,
                     weights[0] if kind == ADAEDL else 0.0)
        if finished:
            why = FINISHED
            break
        if clock[n] >= horizon:
            why = ARRIVAL
            break
    return why, n


@njit(cache=True)
def walked_propose(kind: int, prompt, output, generated, at, run, cap, values, capped: bool,
                   state, level, rate, knobs, weights, k_max: int, kv_capacity: int, target,
                   overhead: float, draft_model: bool, draft, spec, emitted, decoding,
                   touched) -> None:
    """One engine step taken one at a time (with prompt chunks), after the scheduler committed
    it: the policy's choice from its state before the step, its `observe` of the drafts each
    decode verified (`spec`: 0 for a prompt chunk; `decoding`: which requests decoded), and
    the drafts proposed at the step's end, into `spec` (each request's tokens generated before
    the step `generated` and sampled in it `emitted` given; states and `touched` as
    `walked_steps`')."""
    b = output.shape[0]
    ks = np.empty(b, dtype=np.int64)
    gen = generated  # (moved in place)
    _choose(kind, ks, state, level, knobs, weights, k_max, prompt, gen, output, run, at, cap,
            capped, values, kv_capacity, target, overhead, draft_model, draft)
    for r in range(b):
        k = spec[r]
        if decoding[r] and k > 0:
            _observe(kind, r, k, emitted[r] - 1, state, level, rate, knobs, weights, touched)
        gen[r] += emitted[r]
    if kind == GOODPUT:
        _goodput_observe(spec, emitted, decoding, state, level, weights[0])
    _propose(kind, ks, spec, gen, output, emitted, at, cap, capped, values, level,
             weights[0] if kind == ADAEDL else 0.0)


@njit(cache=True)
def walked_choose(kind: int, prompt, output, generated, at, run, cap, values, capped: bool,
                  state, level, knobs, weights, k_max: int, kv_capacity: int, target,
                  overhead: float, draft_model: bool, draft, spec) -> None:
    """A step taken one at a time (with prompt chunks) under the plain scheduler: the policy's
    `choose` (its state moved), cut by the drafter's cap at each request's position, into
    `spec` (as `Replica._choose`)."""
    b = output.shape[0]
    ks = np.empty(b, dtype=np.int64)
    _choose(kind, ks, state, level, knobs, weights, k_max, prompt, generated, output, run, at,
            cap, capped, values, kv_capacity, target, overhead, draft_model, draft)
    _propose(kind, ks, spec, generated, output, np.ones(b, dtype=np.int64), at, cap, capped,
             values, level, weights[0] if kind == ADAEDL else 0.0)


@njit(cache=True)
def walked_verify(kind: int, output, generated, at, run, spec, state, level, rate, knobs,
                  weights, emits, touched) -> None:
    """That step's verification and the policy's `observe` of it (`Replica._apply_decode`):
    each request's tokens emitted into `emits`, `generated` moved in place (states and
    `touched` as `walked_steps`')."""
    b = output.shape[0]
    for r in range(b):
        g, k = generated[r], spec[r]
        emit = step_emit(k, run, at[r] + g, output[r] - g)
        generated[r] = g + emit
        emits[r] = emit
        if k > 0:
            _observe(kind, r, k, emit - 1, state, level, rate, knobs, weights, touched)
    if kind == GOODPUT:
        _goodput_observe(spec, emits, np.ones(b, dtype=np.bool_), state, level, weights[0])


def warm() -> None:
    """Call the loops once on the types the runners give them (numba's one-time load)."""
    from policies.oracle import _grid_knobs
    from simulator.run_records import RECORDS

    ints = np.ones(2, dtype=np.int64)
    target = (1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0)  # (a role's pass numbers, as given)
    weights = np.array([0.3, 1e-9, 0.5, 0.9, 0.01])
    trace = np.ones(16, dtype=np.int64)
    grids = _grid_knobs(2, 8)  # (the calibrated oracle's bound and grids)
    for kind in KINDS.values():
        # (as long as goodput's state, and each request's for two)
        state, level, rate = np.full(16, 3, dtype=np.int64), np.full(6, 0.5), np.zeros(6)
        knobs = grids if kind == ORACLE_CALIBRATED else np.array([2, 1, 1], dtype=np.int64)
        for draft_model in (False, True):
            for planned in (True, False):
                walked_steps(kind, ints * 4, ints * 8, ints.copy(), ints * 0, trace, trace,
                             np.ones(16), True, state, level, rate, knobs, weights, 4, 1000,
                             target, 0.0, 0.0, np.inf, 1, draft_model, target, ints.copy(), 0,
                             planned, ints.copy(), ints.copy(), 100, 1000, 100, 16,
                             np.zeros((RECORDS, 2)), ints * 0, ints * 0)
            walked_propose(kind, ints * 4, ints * 8, ints.copy(), ints * 0, trace, trace,
                           np.ones(16), True, state, level, rate, knobs, weights, 4, 1000,
                           target, 0.0, draft_model, target, ints.copy(), ints.copy(),
                           np.ones(2, dtype=np.bool_), ints * 0)
            walked_choose(kind, ints * 4, ints * 8, ints.copy(), ints * 0, trace, trace,
                          np.ones(16), True, state, level, knobs, weights, 4, 1000, target,
                          0.0, draft_model, target, ints.copy())
        walked_verify(kind, ints * 8, ints.copy(), ints * 0, trace, ints.copy(), state, level,
                      rate, knobs, weights, ints.copy(), ints * 0)

"""A whole run under the plain scheduler, compiled (numba): arrivals, the router, FCFS admission
with KV reservations, whole-prompt prefills or chunked prefill's steps, fast-path decode
segments and finishes on every replica, for a policy that drafts one k for every request at
every step (`Policy.constant_k`: fixed, confidence), or one k by the running batch's size
(`Policy.k_by_batch`: batch_adaptive), or walks each request apart from the others
(`Policy.walks_apart`: heuristic, gammatune, adaedl), with a chain on the roofline (model-free,
or a draft model's with whole prompts), to the SimPy processes' records (`Replica.serve`) to the
bit.

Why: under load a segment lasts a step or two, so what a simulated iteration costs is each
request's arrival, admission, prefill, walk and finish in Python, tens of us spread over a
dozen functions (docs/speed.md, "A whole run compiled"). Here they are a few array writes each.

What it follows, event by event (simulator/engine.py, simulator/replica.py):
- an arrival fires at the arrival process's clock plus its delay (`_Arrival`, URGENT: before
  any iteration ending at the same time resumes its replica), routed to the least loaded
  replica or by turn; an idle replica starts at the arrival that woke it;
- whole prompts: `admit_whole`, then a prefill iteration (`cost.prefill_s`), its record, first
  tokens and the requests of one token finished at its end;
- chunked prefill: while a prompt is pending (`prefill_pending`), a step with the decodes'
  share and the prompt chunks the budget leaves (`plan_chunks`, `chain_mixed_s`);
- else a decode segment: the kept sums' next steps priced (`verify_times`'s passes, a draft
  model's from the sums' rows by drafts), up to the first walk's end or the first step that
  ends at or after the next arrival that could reach the replica, on the clock the replica
  keeps (`_decode_segment`: an uncapped stretch's summed delays, else step by step); its
  records; the walks that end with it finished.
Each request is walked once (`walk` at the policy's k; a walked policy's walks are made by its
walkers ahead, `WALKS`) and its share of its replica's sums added once (`add_shares`), from the
decode step it starts at; by batch size (`BY_BATCH`), at its first pricing, and every running
request walked anew from where it is wherever the batch's k moves (`_walk_at`).

Resumable: the loop returns at an iteration's start when the step records' buffer may not hold
it (`FLUSH`), or when it needs a request's acceptance run that is not in the window it was
given (`NEED_RUNS`); the caller (simulator/whole_run.py) flushes or loads and calls it again
with the same state.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simulator.compiled import _pass_s, add_shares, walk
from simulator.compiled import feeds as chain_feeds

#: `ints` slots: the next request to arrive, step records in the buffer
NEXT, USED = range(2)
INTS = 2
#: `floats` slots: the arrival process's clock
ARRIVED = 0
FLOATS = 1
#: per replica (`state` rows' slots): its step index, KV tokens reserved, decode steps
#: committed (its sums' `now`), its sums' first column's step, running requests (decoding),
#: waiting, being prefilled, where its first waiting request is searched from, its phase,
#: what its iteration is, whether its segment ends where walks do
STEP, KV, CNOW, ORIGIN, RUNNING, WAITING, PREFILLING, HEAD, PHASE, KIND, ENDS_WALKS = range(11)
WALKED_K = 11  # by batch size: the k its running requests were last walked at (-1: none yet)
STATE = 12
#: phases: waiting for a request; in an iteration (until `times[r]`); at its next iteration's
#: start (at `times[r]`)
IDLE, BUSY, READY = range(3)
#: iterations: whole prompts prefilled, a decode segment, a step with prompt chunks
PREFILL, SEGMENT, CHUNKED = range(3)
#: `config` slots
K, K_MAX, CAPPED, ROWS, KV_CAPACITY, MAX_SEQS, BUDGET, DRAFT, RULE, FIRST_FEED, ROUTER = range(11)
CHUNKS = 11  # chunked prefill (`BUDGET` the token budget of every step)
WALKS = 12  # each request's walk given (a walked policy's), not walked here at k
BY_BATCH = 13  # k by the running batch's size (`ktable`): walks made, and remade, at pricing
CONFIG = 14
#: `totals` channels per running request: its steps, drafts and accepted tokens at its end;
#: (by batch size) where its walk starts, at which k, from which decode step, with which feed
T_STEPS, T_DRAFTED, T_ACCEPTED, T_G0, T_K, T_FROM, T_FEED = range(7)
TOTALS = 7
#: `ends` of a request not walked yet (by batch size: until its first pricing)
UNWALKED = 1 << 62
#: routers (simulator/engine.py's `_Cluster.route`)
LEAST_LOADED, ROUND_ROBIN = range(2)
#: `numbers`: the target's pass numbers (8: its all-reduces' flag as 0 or 1), the host's
#: seconds per step and per running request, the draft model's pass numbers (8)
TARGET, STEP_S, SEQ_S, DRAFT_NUMBERS = 0, 8, 9, 10
NUMBERS = 18
#: what the loop returns
DONE, FLUSH, NEED_RUNS, STUCK = range(4)
#: the step records' columns (simulator/logs.py's STEP_COLUMNS)
_ROWS = 13
#: the kept sums' rows (simulator/batch_columns.py's COLUMNS)
_FIRST = 4


@njit(cache=True)
def _pass(numbers, at: int, held, tokens, pairs) -> float:
    """One pass of the target (`at` = TARGET) or the draft model (DRAFT_NUMBERS)."""
    return _pass_s(held, tokens, pairs, numbers[at], numbers[at + 1], numbers[at + 2],
                   numbers[at + 3], numbers[at + 4], numbers[at + 5] != 0.0, numbers[at + 6],
                   numbers[at + 7])


@njit(cache=True)
def _room(sums, state, r: int, length: int):
    """Replica r's sums' column of its step `now`, with `length` columns from it
    (BatchColumns._room: its past dropped, or every replica's arrays grown)."""
    at = state[r, CNOW] - state[r, ORIGIN]
    capacity = sums.shape[2]
    if at + length <= capacity:
        return sums, at
    live = capacity - at
    grown = sums
    if 2 * length > capacity:
        grown = np.zeros((sums.shape[0], sums.shape[1], 2 * length), np.int64)
        grown[:, :, :capacity] = sums
    for row in range(sums.shape[1]):
        keep = sums[r, row, at:].copy()
        grown[r, row, :] = 0
        grown[r, row, :live] = keep
    state[r, ORIGIN] = state[r, CNOW]
    return grown, 0


@njit(cache=True)
def _route(state, config, i: int) -> int:
    """The replica request i goes to: the least loaded (then the lowest index), or i's turn."""
    replicas = state.shape[0]
    if config[ROUTER] == ROUND_ROBIN:
        return i % replicas
    best, least = 0, -1
    for r in range(replicas):
        load = state[r, WAITING] + state[r, PREFILLING] + state[r, RUNNING]
        if least < 0 or load < least:
            best, least = r, load
    return best


@njit(cache=True)
def _next_arrival(arrival, config, replicas: int, r: int, i: int) -> float:
    """When the next request that could change replica r's state arrives (`_Cluster.
    next_arrival_s`): the next of all under least-loaded routing, its own under round-robin."""
    if config[ROUTER] == ROUND_ROBIN:
        i += (r - i) % replicas
    return arrival[i] if i < arrival.shape[0] else np.inf


@njit(cache=True)
def serve(ints, floats, state, times, config, ktable, numbers, arrival, prompt, output, runs,
          run_at, caps, lo: int, hi: int, sums, running, ends, totals, pending, prefilled,
          records, log_replica, log_arrival, log_admitted, log_first, log_finish, log_steps,
          log_drafted, log_accepted):
    """Run until the workload is served (`DONE`), or until the caller must flush the step
    records (`FLUSH`) or give the acceptance runs of waiting requests (`NEED_RUNS`).

    Events in SimPy's order: an arrival at or before the earliest replica event (URGENT, as
    `_Arrival`); then that replica's (replicas at one time touch nothing of each other's, so
    their order there changes nothing). A replica's iteration is decided at its start (its
    records then too: each is fixed by then) and its end applied at its end.

    Requests lo..hi-1 have their run (and capped: their caps) at runs[run_at[i - lo]:
    run_at[i - lo + 1]]. Per replica r: `running[r]` its decoding requests, `ends[r]` the step
    each one's walk ends at, `totals[r]` its walk's steps, drafts and accepted tokens;
    `pending[r]` the requests its prefill admitted (their walks' lengths and totals in
    `totals[r]` past its running ones); under chunked prefill the requests it is prefilling,
    oldest first, and `prefilled[r]` their prompt tokens done. `ktable[b]`: the k of a running
    batch of b (`BY_BATCH`). Returns (status, sums): the sums may have grown."""
    n_requests = arrival.shape[0]
    replicas = state.shape[0]
    draft = config[DRAFT] != 0
    passes = np.zeros(config[K_MAX] + 2)  # a step's draft passes' seconds, j = 1..k_max
    chunk_n = np.zeros(pending.shape[1], np.int64)  # a chunked step's chunks' tokens
    while True:
        best, t_best = -1, np.inf
        for r in range(replicas):
            if state[r, PHASE] != IDLE and (best < 0 or times[r] < t_best):
                best, t_best = r, times[r]
        i = ints[NEXT]
        if i < n_requests:  # the next arrival fires first, even at the same time
            clock = floats[ARRIVED]
            delay = arrival[i] - clock
            at = clock + delay if delay > 0 else clock
            if best < 0 or at <= t_best:
                floats[ARRIVED] = at
                r = _route(state, config, i)
                log_replica[i] = r
                log_arrival[i] = at
                if not state[r, WAITING]:  # (its first waiting: searched from here)
                    state[r, HEAD] = i
                state[r, WAITING] += 1
                ints[NEXT] = i + 1
                if state[r, PHASE] == IDLE:  # woken: its next iteration starts now
                    state[r, PHASE] = READY
                    times[r] = at
                continue
        if best < 0:
            return DONE, sums
        r, now = best, t_best
        if state[r, PHASE] == BUSY:  # its iteration's end
            if state[r, KIND] == PREFILL:
                _start_decoding(r, now, state, config, prompt, output, running, ends, totals,
                                pending, log_first, log_finish, log_steps, log_drafted,
                                log_accepted)
            elif state[r, KIND] == CHUNKED:
                _end_chunks(r, now, state, config, prompt, output, running, ends, totals,
                            pending, prefilled, log_first, log_finish, log_steps, log_drafted,
                            log_accepted)
            if state[r, KIND] != PREFILL and state[r, ENDS_WALKS]:
                _finish_walks(r, now, state, config, prompt, output, sums, running, ends,
                              totals, log_finish, log_steps, log_drafted, log_accepted)
            state[r, PHASE] = READY
            continue
        # its next iteration
        if state[r, WAITING] + state[r, PREFILLING] + state[r, RUNNING] == 0:
            state[r, PHASE] = IDLE
            continue
        k = config[K]
        if config[BY_BATCH] and state[r, RUNNING]:  # (its walks at this batch's k first)
            k = ktable[min(state[r, RUNNING], ktable.shape[0] - 1)]
            status, sums = _walk_at(r, k, state, config, prompt, output, runs, run_at, caps,
                                    lo, hi, sums, running, ends, totals)
            if status != DONE:
                return status, sums
        if config[CHUNKS] and (state[r, RUNNING] == 0 or _prefill_pending(
                r, state, config, prompt, output, log_replica)):
            status = _chunk_step(r, now, k, state, config, numbers, prompt, output, log_replica,
                                 ints, lo, hi, sums, pending, prefilled, log_admitted, records,
                                 chunk_n)
            if status != DONE:
                return status, sums
            for a in range(state[r, PREFILLING]):  # the prompts whole after this step
                i = pending[r, a]
                if prefilled[r, a] < prompt[i] or config[BY_BATCH]:  # (by batch: at pricing)
                    break
                if output[i] > 1:  # (walked from the step after this one)
                    sums = _walk_in(r, a, i, lo, state, config, prompt, output, runs, run_at,
                                    caps, sums, totals, state[r, CNOW] + (state[r, RUNNING] > 0))
            state[r, ENDS_WALKS] = state[r, RUNNING] > 0
            state[r, CNOW] += state[r, RUNNING] > 0
            state[r, STEP] += 1
            state[r, PHASE], state[r, KIND] = BUSY, CHUNKED
            times[r] = now + records[2, ints[USED] - 1]
            continue
        admitted, used, kv, head = _admit(r, state, config, prompt, output, log_replica,
                                          pending)
        if admitted:
            for a in range(admitted):
                i = pending[r, a]
                if output[i] > 1 and (i < lo or i >= hi) and not config[BY_BATCH]:
                    return NEED_RUNS, sums
            if ints[USED] + 1 > records.shape[1]:
                return FLUSH, sums
            state[r, KV], state[r, HEAD] = kv, head
            state[r, WAITING] -= admitted
            state[r, PREFILLING] = admitted
            pairs = 0
            for a in range(admitted):
                i = pending[r, a]
                log_admitted[i] = now
                pairs += prompt[i] * (prompt[i] + 1) // 2
            duration = _pass(numbers, TARGET, 0, used, pairs) + (
                numbers[STEP_S] + numbers[SEQ_S] * admitted)
            if draft:  # (the draft model prefills the prompts too)
                duration += _pass(numbers, DRAFT_NUMBERS, 0, used, pairs)
            row = ints[USED]
            _record(records, row, r, now, duration, 0, admitted, used, 0, 0, 0, 0,
                    state[r, WAITING], state[r, WAITING] + admitted + state[r, RUNNING], kv)
            ints[USED] = row + 1
            for a in range(admitted):  # walked now: nothing reads the sums before its end
                i = pending[r, a]
                if output[i] > 1 and not config[BY_BATCH]:  # (by batch: at pricing)
                    sums = _walk_in(r, a, i, lo, state, config, prompt, output, runs, run_at,
                                    caps, sums, totals, state[r, CNOW])
            state[r, STEP] += 1
            state[r, PHASE], state[r, KIND] = BUSY, PREFILL
            times[r] = now + duration
            continue
        batch = state[r, RUNNING]
        if batch == 0:
            return STUCK, sums
        steps = ends[r, 0]
        for s in range(1, batch):
            steps = min(steps, ends[r, s])
        steps -= state[r, CNOW]
        if ints[USED] + steps > records.shape[1]:
            return FLUSH, sums
        taken, end = _segment(r, now, steps, _next_arrival(arrival, config, replicas, r,
                                                           ints[NEXT]),
                              k, state, config, numbers, sums, records, ints[USED], passes)
        ints[USED] += taken
        state[r, STEP] += taken
        state[r, CNOW] += taken
        state[r, ENDS_WALKS] = taken == steps
        state[r, PHASE], state[r, KIND] = BUSY, SEGMENT
        times[r] = end


@njit(cache=True)
def _admit(r: int, state, config, prompt, output, route, pending):
    """`admit_whole` of replica r: its waiting requests in arrival order while its batch cap,
    KV cache and token budget allow (into `pending[r]`). Returns how many, their prompt
    tokens, the KV reserved after them, and where its next waiting one is searched from."""
    admitted, used, kv = 0, 0, state[r, KV]
    i = state[r, HEAD]
    left = state[r, WAITING]
    budget = config[BUDGET]
    while left:
        while route[i] != r:  # (requests of other replicas)
            i += 1
        need = prompt[i] + output[i] + config[K_MAX]
        if (state[r, RUNNING] + admitted >= config[MAX_SEQS]
                or kv + need > config[KV_CAPACITY]
                or (budget >= 0 and used + prompt[i] > budget)):
            break
        used += prompt[i]
        kv += need
        pending[r, admitted] = i
        admitted += 1
        left -= 1
        i += 1
    return admitted, used, kv, i


@njit(cache=True)
def _walk_in(r: int, a: int, i: int, lo: int, state, config, prompt, output, runs, run_at,
             caps, sums, totals, step: int):
    """Request i's walk from its first token (`walk_chain`), its shares added to replica r's
    sums from its decode step `step` (its walk's `add_shares`, with its draft feeds where a
    draft model drafts), its length and totals kept as the a-th past replica r's running
    requests."""
    k, capped, draft = config[K], config[CAPPED] != 0, config[DRAFT] != 0
    first, last = run_at[i - lo], run_at[i - lo + 1]
    if config[WALKS]:  # (its walk, and its drafts, in place of its run and caps)
        chain, drafts = runs[first:last], caps[first: last - 1]
    else:
        run = runs[first:last]
        chain, drafts = walk(run, caps[first:last] if capped else run, capped, 1, 1,
                             output[i], k)
    m = chain.shape[0] - 1
    sums, col = _room(sums, state, r, step - state[r, CNOW] + m + 1)
    col += step - state[r, CNOW]
    walk_feeds = (chain_feeds(chain, drafts, capped, k, config[FIRST_FEED], config[RULE])
                  if draft else drafts)
    add_shares(sums[r], col, chain, prompt[i] - 1, drafts, capped, k, 1, _FIRST, config[ROWS],
               draft, walk_feeds)
    drafted = 0
    for d in range(m):
        drafted += drafts[d] if capped else k
    slot = state[r, RUNNING] + a
    totals[r, 0, slot] = m
    totals[r, 1, slot] = drafted
    totals[r, 2, slot] = output[i] - 1 - m
    return sums


@njit(cache=True)
def _start(r: int, slot: int, walked: int, state, config, ends, totals) -> None:
    """A request starts decoding in replica r's running slot `slot`: along the walk kept at
    `walked` (its end from the step now), or (by batch size) not walked yet."""
    if config[BY_BATCH]:
        ends[r, slot] = UNWALKED
        totals[r, T_G0, slot] = -1
    else:
        ends[r, slot] = state[r, CNOW] + totals[r, T_STEPS, walked]
        for c in range(3):
            totals[r, c, slot] = totals[r, c, walked]
    state[r, RUNNING] = slot + 1


@njit(cache=True)
def _walk_at(r: int, k: int, state, config, prompt, output, runs, run_at, caps, lo: int,
             hi: int, sums, running, ends, totals):
    """By batch size, at a pricing (`_take_walks_to_check`, `_chunked_head`): where the
    batch's k is not the one replica r's requests were walked at, each is walked anew at it
    from where it is (`_sync`, the walk's rest out of the sums, `walk_chain`, `_add_walk`);
    the requests not walked yet are walked from their first token. Returns (DONE or, nothing
    changed, NEED_RUNS, sums)."""
    every = k != state[r, WALKED_K]
    for s in range(state[r, RUNNING]):  # (their runs first)
        i = running[r, s]
        if (every or totals[r, T_G0, s] < 0) and (i < lo or i >= hi):
            return NEED_RUNS, sums
    capped, draft = config[CAPPED] != 0, config[DRAFT] != 0
    for s in range(state[r, RUNNING]):
        fresh = totals[r, T_G0, s] < 0
        if not (every or fresh):
            continue
        i = running[r, s]
        first, last = run_at[i - lo], run_at[i - lo + 1]
        run = runs[first:last]
        cap = caps[first:last] if capped else run
        base = prompt[i] - 1
        g, feed, steps, drafted = 1, config[FIRST_FEED], 0, 0
        if not fresh:  # its walk so far: where it is, and its rest out of the sums
            g0, k0 = totals[r, T_G0, s], totals[r, T_K, s]
            chain, drafts = walk(run, cap, capped, g0, g0, output[i], k0)
            at = state[r, CNOW] - totals[r, T_FROM, s]
            feeds_now = (chain_feeds(chain, drafts, capped, k0, totals[r, T_FEED, s],
                                     config[RULE]) if draft else drafts)
            sums, col = _room(sums, state, r, chain.shape[0] - at)
            add_shares(sums[r], col, chain[at:], base, drafts[at:], capped, k0, -1, _FIRST,
                       config[ROWS], draft, feeds_now[at:])
            g = chain[at]
            if draft:
                feed = feeds_now[at]
            steps = totals[r, T_STEPS, s] - (chain.shape[0] - 1) + at
            drafted = totals[r, T_DRAFTED, s]
            for d in range(at, chain.shape[0] - 1):  # (its drafts past where it is, taken out)
                drafted -= drafts[d] if capped else k0
        chain, drafts = walk(run, cap, capped, g, g, output[i], k)
        m = chain.shape[0] - 1
        sums, col = _room(sums, state, r, m + 1)
        walk_feeds = (chain_feeds(chain, drafts, capped, k, feed, config[RULE]) if draft
                      else drafts)
        add_shares(sums[r], col, chain, base, drafts, capped, k, 1, _FIRST, config[ROWS], draft,
                   walk_feeds)
        for d in range(m):
            drafted += drafts[d] if capped else k
        steps += m
        totals[r, T_STEPS, s] = steps
        totals[r, T_DRAFTED, s] = drafted
        totals[r, T_ACCEPTED, s] = output[i] - 1 - steps
        totals[r, T_G0, s], totals[r, T_K, s] = g, k
        totals[r, T_FROM, s], totals[r, T_FEED, s] = state[r, CNOW], feed
        ends[r, s] = state[r, CNOW] + m
    state[r, WALKED_K] = k
    return DONE, sums


@njit(cache=True)
def _start_decoding(r: int, now: float, state, config, prompt, output, running, ends, totals,
                    pending, log_first, log_finish, log_steps, log_drafted, log_accepted):
    """Replica r's prefill ends: its prompts' first tokens now; a request of one token
    finishes (`start_decoding`, `finish_done`), the others decode along their walks."""
    walked = state[r, RUNNING]  # (the a-th admitted's walk kept at walked + a)
    for a in range(state[r, PREFILLING]):
        _prompt_whole(r, pending[r, a], walked + a, now, state, config, prompt, output, running,
                      ends, totals, log_first, log_finish, log_steps, log_drafted, log_accepted)
    state[r, PREFILLING] = 0


@njit(cache=True)
def _prompt_whole(r: int, i: int, walked: int, now: float, state, config, prompt, output,
                  running, ends, totals, log_first, log_finish, log_steps, log_drafted,
                  log_accepted) -> None:
    """Request i's prompt is whole on replica r: its first token now; of one token, it
    finishes; else it decodes along the walk kept at `walked` (`start_decoding`,
    `finish_done`). Its slot is at or before `walked`: nothing later is overwritten."""
    log_first[i] = now
    if output[i] <= 1:
        log_finish[i] = now
        log_steps[i] = 0
        log_drafted[i] = 0
        log_accepted[i] = 0
        state[r, KV] -= prompt[i] + output[i] + config[K_MAX]
        return
    slot = state[r, RUNNING]
    running[r, slot] = i
    _start(r, slot, walked, state, config, ends, totals)


@njit(cache=True)
def _next_waiting(r: int, state, route) -> int:
    """Replica r's first waiting request (it has one)."""
    i = state[r, HEAD]
    while route[i] != r:  # (requests of other replicas)
        i += 1
    return i


@njit(cache=True)
def _prefill_pending(r: int, state, config, prompt, output, route) -> bool:
    """`prefill_pending`: a prompt being prefilled, or a waiting one that fits now."""
    if state[r, PREFILLING]:
        return True
    if not state[r, WAITING]:
        return False
    i = _next_waiting(r, state, route)
    return (state[r, RUNNING] + state[r, PREFILLING] < config[MAX_SEQS]
            and state[r, KV] + prompt[i] + output[i] + config[K_MAX] <= config[KV_CAPACITY])


@njit(cache=True)
def _chunk_step(r: int, now: float, k: int, state, config, numbers, prompt, output, route,
                ints, lo: int, hi: int, sums, pending, prefilled, log_admitted, records,
                chunk_n) -> int:
    """Replica r's step with prompt chunks (`_chunked_step`, or `_mixed_iteration` with no
    decode): its decodes' share from its sums, the token budget left to the prompts being
    prefilled (oldest first), then to waiting ones admitted while they fit (`plan_chunks`),
    priced as one pass (`chain_mixed_s`) and recorded; the chunks' progress kept (`chunk_n`:
    each one's tokens). Returns DONE, or (nothing changed) NEED_RUNS or FLUSH."""
    size = state[r, RUNNING]
    col = state[r, CNOW] - state[r, ORIGIN]
    drafted = cached = pairs = emitted = max_k = 0
    if size:
        drafted, cached, pairs = sums[r, 1, col], sums[r, 0, col], sums[r, 2, col]
        emitted = sums[r, 0, col + 1] - sums[r, 0, col]
        max_k = k
        if config[ROWS]:  # the most drafts of any (rows d = 0..k_max)
            max_k = config[ROWS] - 1
            while max_k > 0 and sums[r, _FIRST + max_k, col] == 0:
                max_k -= 1
        elif config[CAPPED]:
            max_k = 0
    budget = max(0, config[BUDGET] - (size + drafted))
    held = state[r, PREFILLING]
    for a in range(held):  # the prompts being prefilled, oldest first
        n = 0
        if budget > 0:
            n = min(prompt[pending[r, a]] - prefilled[r, a], budget)
            budget -= n
        chunk_n[a] = n
    kv, i, new = state[r, KV], state[r, HEAD], 0
    left = state[r, WAITING]
    while left and budget > 0:  # then waiting ones, while they fit
        while route[i] != r:
            i += 1
        need = prompt[i] + output[i] + config[K_MAX]
        if size + held + new >= config[MAX_SEQS] or kv + need > config[KV_CAPACITY]:
            break
        kv += need
        pending[r, held + new] = i
        prefilled[r, held + new] = 0
        chunk_n[held + new] = min(prompt[i], budget)
        budget -= chunk_n[held + new]
        new += 1
        left -= 1
        i += 1
    for a in range(held + new):  # the prompts whole after it are walked: their runs
        j = pending[r, a]
        if prefilled[r, a] + chunk_n[a] < prompt[j]:
            break
        if output[j] > 1 and (j < lo or j >= hi):
            return NEED_RUNS
    if ints[USED] + 1 > records.shape[1]:
        return FLUSH
    state[r, KV], state[r, HEAD] = kv, i
    state[r, WAITING] -= new
    state[r, PREFILLING] = held + new
    seqs = tokens = done = chunk_pairs = 0
    for a in range(held + new):
        n = chunk_n[a]
        if n == 0:
            continue
        c = prefilled[r, a]
        seqs += 1
        tokens += n
        done += c
        chunk_pairs += n * c + n * (n + 1) // 2
        prefilled[r, a] = c + n
        if a >= held:
            log_admitted[pending[r, a]] = now
    everyone = size + seqs
    query = drafted + size + tokens
    duration = 0.0
    if everyone > 0 and query > 0:
        duration = _pass(numbers, TARGET, cached + done, query, pairs + chunk_pairs)
    duration = duration + (numbers[STEP_S] + numbers[SEQ_S] * everyone if everyone > 0 else 0.0)
    row = ints[USED]
    _record(records, row, r, now, duration, size, seqs, tokens, drafted, max_k, emitted - size,
            emitted, state[r, WAITING], state[r, WAITING] + held + new + size, kv)
    ints[USED] = row + 1
    return DONE


@njit(cache=True)
def _end_chunks(r: int, now: float, state, config, prompt, output, running, ends, totals,
                pending, prefilled, log_first, log_finish, log_steps, log_drafted,
                log_accepted) -> None:
    """Replica r's step with prompt chunks ends: the prompts now whole (the first ones
    being prefilled) start decoding along their walks, or (one token) finish
    (`_start_whole`, `start_decoding`, `finish_done`)."""
    walked = state[r, RUNNING]  # (the a-th one's walk kept at walked + a)
    whole = 0
    for a in range(state[r, PREFILLING]):
        i = pending[r, a]
        if prefilled[r, a] < prompt[i]:
            break
        whole += 1
        _prompt_whole(r, i, walked + a, now, state, config, prompt, output, running, ends,
                      totals, log_first, log_finish, log_steps, log_drafted, log_accepted)
    for a in range(whole, state[r, PREFILLING]):  # the rest move up
        pending[r, a - whole] = pending[r, a]
        prefilled[r, a - whole] = prefilled[r, a]
    state[r, PREFILLING] -= whole


@njit(cache=True)
def _finish_walks(r: int, now: float, state, config, prompt, output, sums, running, ends,
                  totals, log_finish, log_steps, log_drafted, log_accepted) -> None:
    """Replica r's requests whose walks end at its step `now` finish (`finish_done`): their
    records, their KV, their walk's last entry out of the sums."""
    col = state[r, CNOW] - state[r, ORIGIN]
    s = 0
    while s < state[r, RUNNING]:
        if ends[r, s] > state[r, CNOW]:
            s += 1
            continue
        i = running[r, s]
        log_finish[i] = now
        log_steps[i] = totals[r, 0, s]
        log_drafted[i] = totals[r, 1, s]
        log_accepted[i] = totals[r, 2, s]
        state[r, KV] -= prompt[i] + output[i] + config[K_MAX]
        sums[r, 0, col] -= output[i] + prompt[i] - 1
        last = state[r, RUNNING] - 1
        running[r, s] = running[r, last]
        ends[r, s] = ends[r, last]
        for c in range(TOTALS):
            totals[r, c, s] = totals[r, c, last]
        state[r, RUNNING] = last


@njit(cache=True)
def _record(records, row: int, r: int, start: float, duration: float, decode: int,
            prefill: int, prefill_tokens: int, drafted: int, max_k: int, accepted: int,
            emitted: int, waiting: int, held: int, kv: int) -> None:
    """One step record (simulator/logs.py's STEP_COLUMNS, in their order)."""
    records[0, row] = r
    records[1, row] = start
    records[2, row] = duration
    records[3, row] = decode
    records[4, row] = prefill
    records[5, row] = prefill_tokens
    records[6, row] = drafted
    records[7, row] = max_k
    records[8, row] = accepted
    records[9, row] = emitted
    records[10, row] = waiting
    records[11, row] = held
    records[12, row] = kv


@njit(cache=True)
def _segment(r: int, start: float, steps: int, horizon: float, k: int, state, config, numbers,
             sums, records, row: int, passes):
    """Replica r's decode segment (`_decode_segment`): its steps priced from its sums, up to
    its first walk's end or the first step that ends at or after `horizon` (the next
    arrival), on the clock the replica keeps: an uncapped stretch's delays summed from its
    start, a capped one's (or any under chunked prefill) clock step by step. Writes its
    records; returns how many steps and when the segment ends."""
    capped, rows = config[CAPPED] != 0, config[ROWS]
    clocked = capped or config[CHUNKS] != 0
    draft = config[DRAFT] != 0
    batch = state[r, RUNNING]
    at = state[r, CNOW] - state[r, ORIGIN]
    overhead = numbers[STEP_S] + numbers[SEQ_S] * batch
    waiting = state[r, WAITING]
    held = waiting + batch
    kv = state[r, KV]
    clock = start  # clocked: the clock; else the delays summed, from the first
    if not clocked:
        horizon = horizon - start
    taken = 0
    sums_r = sums[r]
    while taken < steps:
        col = at + taken
        duration = _pass(numbers, TARGET, sums_r[0, col], sums_r[1, col] + batch,
                         sums_r[2, col]) + overhead
        if draft:  # (a one-step window's passes are one contiguous row to numpy: `single`)
            duration = duration + _draft_passes(sums_r, col, rows, capped, steps == 1, passes,
                                                numbers)
        begins = start if not taken else (clock + start if not clocked else clock)
        clock = clock + duration if taken or clocked else duration
        emitted = sums_r[0, col + 1] - sums_r[0, col]
        if capped:
            deepest = rows - 1
            while deepest > 0 and sums_r[_FIRST + deepest, col] == 0:
                deepest -= 1
            drafted, max_k = sums_r[1, col], deepest
        else:
            drafted, max_k = k * batch, k
        _record(records, row + taken, r, begins, duration, batch, 0, 0, drafted, max_k,
                emitted - batch, emitted, waiting, held, kv)
        taken += 1
        if clock >= horizon:
            break
    return taken, (clock if clocked else start + clock)


@njit(cache=True)
def _draft_passes(sums, col: int, rows: int, in_step_order: bool, single: bool, passes,
                  numbers) -> float:
    """A step's draft passes j = 1..P from the sums' rows by drafts (`chain_pass_times` of
    `BatchColumns.draft_passes`): pass j over the requests drafting at least j, pass 1 with
    the catch-up; summed from the last pass to the first (`in_step_order`: a capped chain's
    step, as the step path adds them) or as numpy sums the passes' rows (`times.sum(axis=0)`):
    one after another, or pairwise where the segment has this one step (`single`: a (P, 1)
    array is one contiguous run to numpy, summed pairwise from 8 entries on). Passes past the
    step's deepest cost 0 there, and adding 0 changes no sum."""
    cached_row = _FIRST + rows
    extra_row = sums.shape[0] - 2
    deepest = 0
    n = 0
    cached = 0
    for j in range(rows - 1, 0, -1):  # (at least j: summed from the top)
        n += sums[_FIRST + j, col]
        cached += sums[cached_row + j, col]
        t = 0.0
        if n > 0:
            if deepest == 0:
                deepest = j
            held = cached + n * (j - 1)
            pairs = cached + n * j
            tokens = n
            if j == 1:
                tokens += sums[extra_row, col]
                held -= sums[extra_row, col]
                pairs += sums[extra_row + 1, col]
            if tokens > 0:
                t = _pass(numbers, DRAFT_NUMBERS, held, tokens, pairs)
        passes[j] = t
    if deepest == 0:
        return 0.0
    if in_step_order:
        total = passes[deepest]
        for j in range(deepest - 1, 0, -1):
            total += passes[j]
        return total
    if single and deepest >= 8:
        return _pairwise(passes[1: deepest + 1])
    total = passes[1]
    for j in range(2, deepest + 1):
        total += passes[j]
    return total


@njit(cache=True)
def _pairwise(values) -> float:
    """numpy's pairwise sum of a contiguous float64 run of 8 to 128 entries: eight running
    sums, combined pairwise, then the rest one by one."""
    n = values.shape[0]
    r = values[:8].copy()
    i = 8
    while i < n - n % 8:
        for j in range(8):
            r[j] += values[i + j]
        i += 8
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        total += values[i]
        i += 1
    return total


def warm() -> None:
    """Run the loop once on the types `run_whole` gives it (numba's one-time load)."""
    numbers = np.full(NUMBERS, 1e-6)
    arrival, lengths = np.array([0.0, 0.5]), np.array([4, 3], dtype=np.int64)
    runs, run_at = np.ones(7, dtype=np.int64), np.array([0, 4, 7], dtype=np.int64)
    for capped, chunks in ((0, 0), (1, 0), (0, 1)):
        rows = 3 if capped else 0
        config = np.array([2, 2, capped, rows, 1000, 8, 64 if chunks else -1, 0, 0, 1, 0,
                           chunks, 0, chunks], dtype=np.int64)
        logs = [np.zeros(2, dtype=np.int64), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2)]
        logs += [np.zeros(2, dtype=np.int64) for _ in range(3)]
        serve(np.zeros(INTS, dtype=np.int64), np.zeros(FLOATS),
              np.zeros((1, STATE), dtype=np.int64), np.zeros(1), config,
              np.full(3, 2, dtype=np.int64), numbers, arrival,
              lengths, lengths, runs, run_at, runs, 0, 2,
              np.zeros((1, _FIRST + rows, 16), dtype=np.int64), np.zeros((1, 2), dtype=np.int64),
              np.zeros((1, 2), dtype=np.int64), np.zeros((1, TOTALS, 2), dtype=np.int64),
              np.zeros((1, 2), dtype=np.int64), np.zeros((1, 2), dtype=np.int64),
              np.empty((_ROWS, 64)), *logs)

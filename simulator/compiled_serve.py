"""A whole run of one replica under the plain scheduler, compiled (numba): arrivals, FCFS
admission with KV reservations, whole-prompt prefill iterations and fast-path decode segments,
for a policy that drafts the same k for every request (`fixed`) with a model-free chain on the
roofline, to the records of the SimPy process (`Replica.serve`) to the bit.

Why: under load a segment lasts a step or two, so what a simulated iteration costs is each
request's arrival, admission, prefill, walk and finish in Python, tens of us spread over a
dozen functions (docs/speed.md, "A whole run compiled"). Here they are a few array writes each.

What it follows, event by event (simulator/engine.py, simulator/replica.py):
- an arrival fires at the arrival process's clock plus its delay (`_Arrival`, URGENT: before
  an iteration ending at the same time resumes the replica);
- an idle replica starts at the arrival that woke it;
- `admit_whole`, then a prefill iteration (`cost.prefill_s`), its record, first tokens and
  the requests of one token finished at its end;
- else a decode segment: the kept sums' next steps priced (`verify_times`'s passes), up to the
  first walk's end or the first step that ends at or after the next arrival, on the clock the
  replica keeps (`_decode_segment`: an uncapped stretch's summed delays, a capped one's step
  by step clock); its records; the walks that end with it finished.
Each request is walked when its prompt is whole (the Python path walks it at the next
pricing: no decode step comes between) and its share of the sums added once (`add_shares`).

Resumable: the loop returns at its top when the step records' buffer may not hold the next
segment (`FLUSH`), or when the next admission needs a request whose acceptance run is not in
the window it was given (`NEED_RUNS`); the caller (simulator/whole_run.py) flushes or loads
and calls it again with the same state.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simulator.compiled import _pass_s, add_shares, walk
from simulator.compiled import feeds as chain_feeds

#: `ints` slots: the next request to arrive, the first waiting, the replica's step index, KV
#: tokens reserved, decode steps committed (the sums' `now`), the sums' first column's step,
#: running requests, step records in the buffer
NEXT, WAIT, STEP, KV, CNOW, ORIGIN, RUNNING, USED = range(8)
INTS = 8
#: `floats` slots: the clock, the arrival process's clock
NOW, ARRIVED = range(2)
FLOATS = 2
#: what the loop returns
DONE, FLUSH, NEED_RUNS, STUCK = range(4)
#: the step records' columns (simulator/logs.py's STEP_COLUMNS)
_ROWS = 13
#: the kept sums' rows (simulator/batch_columns.py's COLUMNS)
_FIRST = 4


@njit(cache=True)
def _arrive(ints, floats, arrival, limit: float, log_replica, log_arrival) -> None:
    """Every arrival that fires at or before `limit`: the arrival process's clock plus its
    delay (a delay of 0 or less: at that clock, submitted in the same step)."""
    n = arrival.shape[0]
    while ints[NEXT] < n:
        i = ints[NEXT]
        clock = floats[ARRIVED]
        delay = arrival[i] - clock
        at = clock + delay if delay > 0 else clock
        if at > limit:
            return
        floats[ARRIVED] = at
        log_replica[i] = 0
        log_arrival[i] = at
        ints[NEXT] = i + 1


@njit(cache=True)
def _room(sums, ints, length: int):
    """The sums' column of step `now` with `length` columns from it (BatchColumns._room: the
    past dropped, or the arrays grown)."""
    at = ints[CNOW] - ints[ORIGIN]
    capacity = sums.shape[1]
    if at + length <= capacity:
        return sums, at
    live = capacity - at
    grown = np.zeros((sums.shape[0], max(capacity, 2 * length)), np.int64)
    grown[:, :live] = sums[:, at:]
    ints[ORIGIN] = ints[CNOW]
    return grown, 0


@njit(cache=True)
def serve(ints, floats, arrival, prompt, output, k: int, k_max: int, capped: bool, rows: int,
          kv_capacity: int, max_seqs: int, budget: int, runs, run_at, caps, lo: int, hi: int,
          m0: float, m1: float, f_q: float, f_pair: float, fixed: float, comm: bool, c0: float,
          c1: float, step_s: float, seq_s: float, draft: bool, d0: float, d1: float,
          df_q: float, df_pair: float, dfixed: float, dcomm: bool, dc0: float, dc1: float,
          rule: int, first_feed: int, sums, running, ends, totals, records, log_replica,
          log_arrival, log_admitted, log_first, log_finish, log_steps, log_drafted,
          log_accepted):
    """Run until the workload is served (`DONE`), or until the caller must flush the step
    records (`FLUSH`) or give the acceptance runs of requests from `ints[WAIT]` (`NEED_RUNS`).

    Requests lo..hi-1 have their run (and `capped`: their caps) at runs[run_at[i - lo]:
    run_at[i - lo + 1]]. `running` holds the running requests (slots 0..RUNNING-1), `ends`
    the step each one's walk ends at, `totals` its walk's steps, drafts and accepted tokens.
    `budget` < 0: no token budget. `draft`: a draft model's passes too (its numbers d0..dc1,
    its catch-up `rule` and first feed), priced from the sums' rows by drafts. Returns
    (status, sums): the sums may have grown."""
    n_requests = arrival.shape[0]
    reserve_extra = k_max
    passes = np.zeros(k_max + 2)  # a step's draft passes' seconds, j = 1..k_max
    while True:
        now = floats[NOW]
        held = ints[NEXT] - ints[WAIT] + ints[RUNNING]
        if held == 0:  # idle: woken by the next arrival
            if ints[NEXT] >= n_requests:
                return DONE, sums
            i = ints[NEXT]
            clock = floats[ARRIVED]
            delay = arrival[i] - clock
            wake = clock + delay if delay > 0 else clock
            _arrive(ints, floats, arrival, wake, log_replica, log_arrival)
            floats[NOW] = wake
            continue
        # admit_whole: FCFS while the batch cap, the KV cache and the token budget allow
        first = ints[WAIT]
        last = first
        used = 0
        kv = ints[KV]
        while last < ints[NEXT]:
            need = prompt[last] + output[last] + reserve_extra
            if ints[RUNNING] + (last - first) >= max_seqs or kv + need > kv_capacity:
                break
            if budget >= 0 and used + prompt[last] > budget:
                break
            used += prompt[last]
            kv += need
            last += 1
        if last > first:
            if last > hi or first < lo:
                return NEED_RUNS, sums
            if ints[USED] + 1 > records.shape[1]:
                return FLUSH, sums
            ints[KV] = kv
            ints[WAIT] = last
            seqs = last - first
            pairs = 0
            for i in range(first, last):
                log_admitted[i] = now
                pairs += prompt[i] * (prompt[i] + 1) // 2
            duration = _pass_s(0, used, pairs, m0, m1, f_q, f_pair, fixed, comm, c0,
                               c1) + (step_s + seq_s * seqs)
            if draft:  # (the draft model prefills the prompts too)
                duration += _pass_s(0, used, pairs, d0, d1, df_q, df_pair, dfixed, dcomm, dc0,
                                    dc1)
            waiting = ints[NEXT] - ints[WAIT]
            held = waiting + seqs + ints[RUNNING]
            end = now + duration
            _arrive(ints, floats, arrival, end, log_replica, log_arrival)
            floats[NOW] = end
            ints[STEP] += 1
            r = ints[USED]
            records[0, r] = 0.0
            records[1, r] = now
            records[2, r] = duration
            records[3, r] = 0.0
            records[4, r] = seqs
            records[5, r] = used
            for c in range(6, 10):
                records[c, r] = 0.0
            records[10, r] = waiting
            records[11, r] = held
            records[12, r] = kv
            ints[USED] = r + 1
            for i in range(first, last):
                log_first[i] = end
                if output[i] <= 1:  # its prompt's token was its last
                    log_finish[i] = end
                    log_steps[i] = 0
                    log_drafted[i] = 0
                    log_accepted[i] = 0
                    ints[KV] -= prompt[i] + output[i] + reserve_extra
                    continue
                at = run_at[i - lo]
                run = runs[at: run_at[i - lo + 1]]
                chain, drafts = walk(run, caps[at: run_at[i - lo + 1]] if capped else run,
                                     capped, 1, 1, output[i], k)
                m = chain.shape[0] - 1
                sums, col = _room(sums, ints, m + 1)
                walk_feeds = (chain_feeds(chain, drafts, capped, k, first_feed, rule) if draft
                              else drafts)
                add_shares(sums, col, chain, prompt[i] - 1, drafts, capped, k, 1, _FIRST,
                           rows, draft, walk_feeds)
                slot = ints[RUNNING]
                running[slot] = i
                ends[slot] = ints[CNOW] + m
                drafted = 0
                for d in range(m):
                    drafted += drafts[d] if capped else k
                totals[0, slot] = m
                totals[1, slot] = drafted
                totals[2, slot] = output[i] - 1 - m
                ints[RUNNING] = slot + 1
            continue
        if ints[RUNNING] == 0:
            return STUCK, sums
        # a decode segment
        batch = ints[RUNNING]
        steps = ends[0]
        for s in range(1, batch):
            if ends[s] < steps:
                steps = ends[s]
        steps -= ints[CNOW]
        if ints[USED] + steps > records.shape[1]:
            return FLUSH, sums
        at = ints[CNOW] - ints[ORIGIN]
        overhead = step_s + seq_s * batch
        horizon = arrival[ints[NEXT]] if ints[NEXT] < n_requests else np.inf
        waiting = ints[NEXT] - ints[WAIT]
        held = waiting + batch
        kv = ints[KV]
        r0 = ints[USED]
        start = now
        clock = 0.0 if not capped else now  # uncapped: the delays summed, from the start
        if not capped:
            horizon = horizon - start
        taken = 0
        while taken < steps:
            col = at + taken
            duration = _pass_s(sums[0, col], sums[1, col] + batch, sums[2, col], m0, m1, f_q,
                               f_pair, fixed, comm, c0, c1) + overhead
            if draft:
                duration = duration + _draft_passes(sums, col, rows, capped, passes, d0, d1,
                                                    df_q, df_pair, dfixed, dcomm, dc0, dc1)
            r = r0 + taken
            records[1, r] = (clock + start if not capped else clock) if taken else start
            clock = clock + duration if taken or capped else duration
            records[0, r] = 0.0
            records[2, r] = duration
            records[3, r] = batch
            records[4, r] = 0.0
            records[5, r] = 0.0
            emitted = sums[0, col + 1] - sums[0, col]
            if capped:
                records[6, r] = sums[1, col]
                deepest = rows - 1
                while deepest > 0 and sums[_FIRST + deepest, col] == 0:
                    deepest -= 1
                records[7, r] = deepest
            else:
                records[6, r] = k * batch
                records[7, r] = k
            records[8, r] = emitted - batch
            records[9, r] = emitted
            records[10, r] = waiting
            records[11, r] = held
            records[12, r] = kv
            taken += 1
            if clock >= horizon:
                break
        end = clock if capped else start + clock
        ints[USED] = r0 + taken
        _arrive(ints, floats, arrival, end, log_replica, log_arrival)
        floats[NOW] = end
        ints[STEP] += taken
        ints[CNOW] += taken
        if taken < steps:
            continue
        # the walks that end here: finished (their last entry out of the sums)
        now_col = ints[CNOW] - ints[ORIGIN]
        s = 0
        while s < ints[RUNNING]:
            if ends[s] > ints[CNOW]:
                s += 1
                continue
            i = running[s]
            log_finish[i] = end
            log_steps[i] = totals[0, s]
            log_drafted[i] = totals[1, s]
            log_accepted[i] = totals[2, s]
            ints[KV] -= prompt[i] + output[i] + reserve_extra
            sums[0, now_col] -= output[i] + prompt[i] - 1
            last = ints[RUNNING] - 1
            running[s] = running[last]
            ends[s] = ends[last]
            totals[:, s] = totals[:, last]
            ints[RUNNING] = last



@njit(cache=True)
def _draft_passes(sums, col: int, rows: int, in_step_order: bool, passes, m0: float, m1: float,
                  f_q: float, f_pair: float, fixed: float, comm: bool, c0: float,
                  c1: float) -> float:
    """A step's draft passes j = 1..P from the sums' rows by drafts (`chain_pass_times` of
    `BatchColumns.draft_passes`): pass j over the requests drafting at least j, pass 1 with
    the catch-up; summed from the last pass to the first (`in_step_order`: a capped chain's
    step, as the step path adds them) or from the first (the passes' sum over their rows).
    Passes past the step's deepest cost 0 there, and adding 0 changes no sum."""
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
                t = _pass_s(held, tokens, pairs, m0, m1, f_q, f_pair, fixed, comm, c0, c1)
        passes[j] = t
    if deepest == 0:
        return 0.0
    if in_step_order:
        total = passes[deepest]
        for j in range(deepest - 1, 0, -1):
            total += passes[j]
        return total
    total = passes[1]
    for j in range(2, deepest + 1):
        total += passes[j]
    return total


def warm() -> None:
    """Run the loop once on the types `run_whole` gives it (numba's one-time load)."""
    target = (1e-3, 1e-6, 1e-6, 1e-9, 1e-4, False, 0.0, 0.0)  # (a role's pass numbers)
    arrival, lengths = np.array([0.0, 0.5]), np.array([4, 3], dtype=np.int64)
    runs, run_at = np.ones(7, dtype=np.int64), np.array([0, 4, 7], dtype=np.int64)
    for capped in (False, True):
        rows = 3 if capped else 0
        floats = np.zeros(2)
        logs = [np.zeros(2, dtype=np.int64), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2)]
        logs += [np.zeros(2, dtype=np.int64) for _ in range(3)]
        serve(np.zeros(INTS, dtype=np.int64), floats, arrival, lengths, lengths, 2, 2, capped,
              rows, 1000, 8, -1, runs, run_at, runs, 0, 2, *target, 1e-4, 1e-6, False, *target,
              0, 1, np.zeros((_FIRST + rows, 16), dtype=np.int64), np.zeros(2, dtype=np.int64),
              np.zeros(2, dtype=np.int64), np.zeros((3, 2), dtype=np.int64),
              np.empty((_ROWS, 64)), *logs)

"""goodput's rules, compiled (numba), for the engine steps that `simulator/compiled_walked.py`
runs: its batch-uniform plan, re-planned every `replan_every` calls, with its probe of a plan
of 0, and its censored estimate (the batch's); and, `per_request`, each request's own estimate
and its plan, the ascent of policies/goodput.py's `_Ascent` over allocations that keep k
nonincreasing along the requests ranked by their estimate.

Why: per request, goodput's plan (two climbs of group moves and transfers, each round priced
in one call) was over half of its 33-46 us per simulated iteration in Python, where its held
segments stepped; here a plan is a loop over a few hundred alternatives. Each function does
the Python code's integer and float operations in its order (sums from 0 in the same order,
powers by C's pow, the first best on ties), so the same plans to the bit
(tests/simulator/test_compiled_goodput.py compares them on many batches).

Imported by simulator/compiled_walked.py, after `simulator.kernels` loaded the compiled loops.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from policies.goodput import (
    MIN_GAIN,
    NO_PLAN,
    R_ACCEPTED,
    R_CALLS,
    R_DRAFTED,
    R_FIELDS,
    R_HEAD,
    R_ID,
    R_NEW,
    R_PLAN,
    R_PROBING,
    R_REJECTED,
    R_REPLANNED,
)
from simulator.compiled import alternatives_times
from simulator.compiled_steps import _step_s

#: goodput's state (the batch's, not a request's): its `state` entries (its censored sums:
#: accepted drafts, drafts, first rejections; its calls, its last plan, whether the last call
#: probed) and its `level` entry (its acceptance estimate)
G_ACCEPTED, G_DRAFTED, G_REJECTED, G_CALLS, G_PLAN, G_PROBING = range(6)
G_ALPHA = 0


@njit(cache=True)
def _expected_emitted(alpha: float, k: int) -> float:
    """`vocabulary.expected_emitted` (Python's float power: C's pow, as math.pow)."""
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - math.pow(alpha, float(k + 1))) / (1.0 - alpha)


@njit(cache=True, error_model="numpy")
def _goodput_plan(prompt, gen, alpha: float, k_cap: int, k0_bonus: float, headroom: float,
                  kv_capacity: int, target, overhead: float, draft_model: bool, draft) -> int:
    """goodput's `_plan_batch`: the batch's goodput at k = 0, 1, ... (its expected tokens over
    the step's time, 0 where the KV cache with the headroom would not hold it; k = 0's times
    the bonus), to the first drop. A model-free chain's step priced from its verify pass's sums
    (`_uniform_goodputs`), a draft model's as `StepCostModel.steps_s` prices the fitting ks at
    once (`alternatives_times`)."""
    b = prompt.shape[0]
    total = 0
    for r in range(b):
        total += prompt[r] + gen[r]
    cached = total - b  # each request's KV before the verify pass
    base = total // b * b + b  # the need but for the drafts
    times = np.zeros(0)
    if draft_model:  # (every fitting k at once: they fit from 0 up to the first that does not)
        fits = 0
        while fits <= k_cap and (base + b * fits) * headroom <= kv_capacity:
            fits += 1
        rows = np.empty((fits, b), dtype=np.int64)
        held = np.empty(b, dtype=np.int64)
        for r in range(b):
            held[r] = prompt[r] + gen[r] - 1
            for k in range(fits):
                rows[k, r] = k
        if fits:
            times = alternatives_times(rows, held, target, draft, overhead)
    best_goodput, best_k = -1.0, 0
    for k in range(k_cap + 1):
        goodput = 0.0
        if (base + b * k) * headroom <= kv_capacity:
            if draft_model:
                seconds = times[k]
            else:
                pairs = (k + 1) * cached + b * ((k + 1) * (k + 2) // 2)
                seconds = _step_s(cached, b * k, pairs, b, target, overhead)
            goodput = b * _expected_emitted(alpha, k) / seconds
        if k == 0:
            goodput *= k0_bonus
        if goodput > best_goodput:
            best_goodput, best_k = goodput, k
        else:
            break
    return best_k


@njit(cache=True)
def _goodput_ks(ks, state, level, knobs, weights, k_max: int, prompt, gen, kv_capacity: int,
                target, overhead: float, draft_model: bool, draft) -> None:
    """goodput's `choose` (one k for the batch, re-planned every `replan_every` calls; a
    re-plan to k = 0 probes with k = 1 unless `faithful`), its state moved in place."""
    state[G_CALLS] += 1
    replan_every, k_cap, faithful = knobs[0], knobs[1], knobs[2]
    replan = state[G_CALLS] % replan_every == 0
    if replan:
        state[G_PLAN] = _goodput_plan(prompt, gen, level[G_ALPHA], k_cap, weights[1], weights[2],
                                      kv_capacity, target, overhead, draft_model, draft)
    k = state[G_PLAN] if state[G_PLAN] < k_max else k_max
    probing = replan and not faithful and k_cap >= 1 and k == 0
    state[G_PROBING] = probing
    ks[:] = 1 if probing else k


@njit(cache=True)
def _goodput_observe(spec, emits, decoding, state, level, keep: float) -> None:
    """goodput's `observe_columns` of a step: its censored estimate's step from the sums of the
    requests that drafted (`decoding` ones: a prompt chunk verifies none)."""
    accepted = drafted = rejected = 0
    for r in range(spec.shape[0]):
        k = spec[r]
        if decoding[r] and k > 0:
            seen = emits[r] - 1
            accepted += seen
            drafted += k
            rejected += 1 if seen < k else 0
    if not drafted:  # (its ratio would be NaN: skipped, as the prototype skips it)
        return
    state[G_ACCEPTED] += accepted
    state[G_DRAFTED] += drafted
    state[G_REJECTED] += rejected
    seen, cut = state[G_ACCEPTED], state[G_REJECTED]
    x = seen / (seen + cut) if seen + cut else 1.0
    alpha = keep * level[G_ALPHA] + (1.0 - keep) * x
    alpha = alpha if alpha > 0.0 else 0.0  # min(1.0, max(0.0, a)), as `_ema_of` clamps
    level[G_ALPHA] = alpha if alpha < 1.0 else 1.0


@njit(cache=True)
def _ranked(ids, alphas, contexts):
    """The requests by their estimate, highest first (ties: shorter context, then lower id:
    `_plan_per_request`'s order, one since the ids differ)."""
    b = ids.shape[0]
    order = np.arange(b)
    for p in range(1, b):
        i = order[p]
        q = p
        while q > 0:
            j = order[q - 1]
            if not (alphas[i] > alphas[j] or (alphas[i] == alphas[j] and (
                    contexts[i] < contexts[j]
                    or (contexts[i] == contexts[j] and ids[i] < ids[j])))):
                break
            order[q] = j
            q -= 1
        order[q] = i
    return order


@njit(cache=True)
def _levels(ks, order, members, starts, ends, levels) -> int:
    """`_Ascent._levels`: each level of `ks` in the order it first appears along `order`, its
    requests in that order (`members[starts[L]:ends[L]]`, level `levels[L]`). Returns how
    many levels."""
    count = 0
    slot = np.full(ks.max() + 1, -1)
    sizes = np.zeros(order.shape[0], dtype=np.int64)
    for p in range(order.shape[0]):
        level = ks[order[p]]
        if slot[level] < 0:
            slot[level] = count
            levels[count] = level
            count += 1
        sizes[slot[level]] += 1
    at = 0
    for L in range(count):
        starts[L] = ends[L] = at
        at += sizes[L]
    for p in range(order.shape[0]):
        L = slot[ks[order[p]]]
        members[ends[L]] = order[p]
        ends[L] += 1
    return count


@njit(cache=True)
def _size_after(s: int, n: int) -> int:
    """`_sizes(n)`: 1, 2, 4, ... below n, then n; the one after s (0 after n)."""
    if s >= n:
        return 0
    return s * 2 if s * 2 < n else n


#: A climb's moves are columns that `_group_moves` and `_transfers` fill: whether a transfer;
#: a group move's requests `members[lo:hi]` and their new level `new`, or a transfer's u
#: (`lo`) raised to `new` and d (`hi`) lowered by one; its token gain, change of drafts and
#: of causal pairs.


@njit(cache=True)
def _group_moves(ks, held, powers, own, k_cap: int, members, starts, ends, levels, count,
                 transfer, lo, hi, new, gain, d_drafts, d_pairs) -> int:
    """`_Ascent._group_moves`: per level, raise its first s requests by one, then lower its
    last s (s = 1, 2, 4, ..., all), into the move columns. Returns how many."""
    m = 0
    for L in range(count):
        level, first, n = levels[L], starts[L], ends[L] - starts[L]
        before = np.zeros(n + 1, dtype=np.int64)
        for t in range(n):
            before[t + 1] = before[t] + held[members[first + t]]
        if level < k_cap:
            step = own[level + 1] - own[level]
            s = 1 if n > 1 else n
            while s:
                total = 0.0  # (sum(up[:s]): from 0, in order)
                for t in range(s):
                    total += powers[members[first + t], level + 1]
                transfer[m], lo[m], hi[m], new[m] = False, first, first + s, level + 1
                gain[m], d_drafts[m], d_pairs[m] = total, s, before[s] + s * step
                m += 1
                s = _size_after(s, n)
        if level > 0:
            step = own[level - 1] - own[level]
            s = 1 if n > 1 else n
            while s:
                total = 0.0  # (sum(down[-s:]))
                for t in range(n - s, n):
                    total += -powers[members[first + t], level]
                transfer[m], lo[m], hi[m], new[m] = False, first + n - s, first + n, level - 1
                gain[m], d_drafts[m], d_pairs[m] = total, -s, before[n - s] - before[n] + s * step
                m += 1
                s = _size_after(s, n)
    return m


@njit(cache=True)
def _transfers(ks, held, powers, own, k_cap: int, rank, members, starts, ends, levels, count,
               transfer, lo, hi, new, gain, d_drafts, d_pairs) -> int:
    """`_Ascent._transfers`: one draft from the last request of a level to the first of
    another (`lo`: u, `hi`: d, `new`: u's new level; d's is one below its own), where k stays
    nonincreasing along the order. Returns how many."""
    m = 0
    for up in range(count):
        for down in range(count):
            u, d = members[starts[up]], members[ends[down] - 1]
            up_level, down_level = levels[up], levels[down]
            if (up_level < k_cap and down_level > 0 and u != d
                    and not (rank[u] == rank[d] + 1 and ks[d] - 1 < ks[u] + 1)):
                transfer[m], lo[m], hi[m], new[m] = True, u, d, up_level + 1
                gain[m] = (0.0 + powers[u, up_level + 1]) + -powers[d, down_level]
                d_drafts[m] = 0
                d_pairs[m] = (held[u] + own[up_level + 1] - own[up_level] - held[d]
                              + own[down_level - 1] - own[down_level])
                m += 1
    return m


@njit(cache=True)
def _moved(ks, members, transfer: bool, lo: int, hi: int, new: int, out) -> None:
    """`ks` with a move made, into `out` (`_changed`)."""
    out[:] = ks
    if transfer:
        out[lo] = new
        out[hi] = ks[hi] - 1
    else:
        for p in range(lo, hi):
            out[members[p]] = new


@njit(cache=True, error_model="numpy")
def _best_move(moves: int, ks, members, tokens: float, drafted: int, pairs: int,
               current: float, transfer, lo, hi, new, gain, d_drafts, d_pairs, b: int,
               base: int, headroom: float, kv_capacity: int, cached_total: int, held, target,
               overhead: float, draft_model: bool, draft, rows) -> tuple:
    """`_Ascent._best`: the move with the most predicted goodput, above `current` by
    MIN_GAIN, the first on ties (its index, its goodput; -1 where none): each move's step
    priced from its verify pass's sums (a model-free chain), or its ks priced as `steps_s`
    prices the fitting ones at once (a draft model's chain); 0 where the KV cache with the
    headroom would not hold it."""
    goodputs = np.zeros(moves)
    fitting = np.empty(moves, dtype=np.int64)
    fits = 0
    for m in range(moves):
        if (base + drafted + d_drafts[m]) * headroom <= kv_capacity:
            fitting[fits] = m
            fits += 1
    if draft_model and fits:
        for f in range(fits):
            m = fitting[f]
            _moved(ks, members, transfer[m], lo[m], hi[m], new[m], rows[f])
        times = alternatives_times(rows[:fits], held, target, draft, overhead)
        for f in range(fits):
            m = fitting[f]
            goodputs[m] = (tokens + gain[m]) / times[f]
    else:
        for f in range(fits):
            m = fitting[f]
            goodputs[m] = (tokens + gain[m]) / _step_s(
                cached_total, drafted + d_drafts[m], pairs + d_pairs[m], b, target, overhead)
    best, best_goodput = -1, 0.0
    for m in range(moves):
        g = goodputs[m]
        if g > current * (1.0 + MIN_GAIN) and (best < 0 or g > best_goodput):
            best, best_goodput = m, g
    return best, best_goodput


@njit(cache=True, error_model="numpy")
def _ascend(k0: int, ks, order, rank, alphas, held, powers, own, k_cap: int, b: int,
            base: int, headroom: float, kv_capacity: int, cached_total: int, target,
            overhead: float, draft_model: bool, draft) -> float:
    """`_Ascent.run`: the climb from every k = k0 (its allocation left in `ks`); returns its
    predicted goodput."""
    ks[:] = k0
    tokens = 0.0
    for r in range(b):
        tokens += _expected_emitted(alphas[r], k0)
    drafted, pairs = k0 * b, 0
    for r in range(b):
        pairs += (k0 + 1) * held[r] + own[k0]
    current = 0.0
    if (base + drafted) * headroom <= kv_capacity:
        if draft_model:
            current = tokens / alternatives_times(ks.reshape((1, b)), held, target, draft,
                                                  overhead)[0]
        else:
            current = tokens / _step_s(cached_total, drafted, pairs, b, target, overhead)
    sizes = 1
    while (1 << (sizes - 1)) < b:
        sizes += 1
    room = (k_cap + 1) * 2 * sizes + (k_cap + 1) * (k_cap + 1)
    transfer = np.zeros(room, dtype=np.bool_)
    lo, hi, new = (np.zeros(room, dtype=np.int64), np.zeros(room, dtype=np.int64),
                   np.zeros(room, dtype=np.int64))
    gain, d_drafts, d_pairs = (np.zeros(room), np.zeros(room, dtype=np.int64),
                               np.zeros(room, dtype=np.int64))
    rows = np.zeros((room if draft_model else 0, b), dtype=np.int64)
    members, starts, ends, levels = (np.empty(b, dtype=np.int64), np.empty(b, dtype=np.int64),
                                     np.empty(b, dtype=np.int64), np.empty(b, dtype=np.int64))
    while True:
        count = _levels(ks, order, members, starts, ends, levels)
        best = -1
        for kind in range(2):
            if kind == 0:
                moves = _group_moves(ks, held, powers, own, k_cap, members, starts, ends,
                                     levels, count, transfer, lo, hi, new, gain, d_drafts,
                                     d_pairs)
            else:
                moves = _transfers(ks, held, powers, own, k_cap, rank, members, starts, ends,
                                   levels, count, transfer, lo, hi, new, gain, d_drafts,
                                   d_pairs)
            best, goodput = _best_move(moves, ks, members, tokens, drafted, pairs, current,
                                       transfer, lo, hi, new, gain, d_drafts, d_pairs, b,
                                       base, headroom, kv_capacity, cached_total, held,
                                       target, overhead, draft_model, draft, rows)
            if best >= 0:
                break
        if best < 0:
            return current
        _moved(ks.copy(), members, transfer[best], lo[best], hi[best], new[best], ks)
        current = goodput
        drafted += d_drafts[best]
        pairs += d_pairs[best]
        tokens += gain[best]


@njit(cache=True, error_model="numpy")
def per_request_plan(prompt, gen, ids, alphas, k_cap: int, k0_bonus: float, headroom: float,
                     kv_capacity: int, target, overhead: float, draft_model: bool, draft, plan
                     ) -> None:
    """goodput's `_plan_per_request`, into `plan`: the best of all k = 0 (its goodput times
    the bonus) and the climbs from all k = 0 and from the best batch-uniform k (the first
    best on ties, in that order)."""
    b = prompt.shape[0]
    contexts = np.empty(b, dtype=np.int64)
    held = np.empty(b, dtype=np.int64)  # each request's KV before the verify pass
    total = 0
    for r in range(b):
        contexts[r] = prompt[r] + gen[r]
        held[r] = contexts[r] - 1
        total += contexts[r]
    cached_total = total - b
    base = total // b * b + b  # the need but for the drafts
    order = _ranked(ids, alphas, contexts)
    rank = np.empty(b, dtype=np.int64)
    for p in range(b):
        rank[order[p]] = p
    powers = np.empty((b, k_cap + 1))  # a_i^j: what request i's j-th draft adds
    for i in range(b):
        for j in range(k_cap + 1):
            powers[i, j] = math.pow(alphas[i], float(j))  # (Python's a ** j: C's pow)
    own = np.empty(k_cap + 1, dtype=np.int64)  # a verify's own causal pairs at k
    for k in range(k_cap + 1):
        own[k] = (k + 1) * (k + 2) // 2
    # every uniform k priced (`_uniform_goodputs`), the first best
    goodputs = np.zeros(k_cap + 1)
    fits = 0
    while fits <= k_cap and (base + b * fits) * headroom <= kv_capacity:
        fits += 1
    times = np.zeros(0)
    if draft_model and fits:
        rows = np.empty((fits, b), dtype=np.int64)
        for k in range(fits):
            rows[k, :] = k
        times = alternatives_times(rows, held, target, draft, overhead)
    for k in range(fits):
        tokens = 0.0
        for r in range(b):
            tokens += _expected_emitted(alphas[r], k)
        if draft_model:
            seconds = times[k]
        else:
            seconds = _step_s(cached_total, b * k,
                              (k + 1) * cached_total + b * ((k + 1) * (k + 2) // 2), b, target,
                              overhead)
        goodputs[k] = tokens / seconds
    uniform = 0
    for k in range(1, k_cap + 1):
        if goodputs[k] > goodputs[uniform]:
            uniform = k
    plan[:] = 0
    best = goodputs[0] * k0_bonus
    ks = np.empty(b, dtype=np.int64)
    for start in range(2 if uniform else 1):
        goodput = _ascend(uniform if start else 0, ks, order, rank, alphas, held, powers, own,
                          k_cap, b, base, headroom, kv_capacity, cached_total, target,
                          overhead, draft_model, draft)
        if goodput > best:
            best = goodput
            plan[:] = ks


@njit(cache=True)
def per_request_ks(ks, state, level, knobs, weights, k_max: int, prompt, gen,
                   kv_capacity: int, target, overhead: float, draft_model: bool, draft) -> None:
    """goodput's `choose`, per request (each request's k its plan's, or the plan's low median
    where it arrived after it; re-planned every `replan_every` calls; a re-plan that leaves a
    k = 0 probes with k = 1 there unless `faithful`), its state moved in place."""
    state[R_CALLS] += 1
    replan_every, k_cap, faithful = knobs[0], knobs[1], knobs[2]
    replan = state[R_CALLS] % replan_every == 0
    b = ks.shape[0]
    if replan:
        ids = np.empty(b, dtype=np.int64)
        for r in range(b):
            ids[r] = state[R_HEAD + r * R_FIELDS + R_ID]
        plan = np.empty(b, dtype=np.int64)
        per_request_plan(prompt, gen, ids, level, k_cap, weights[1], weights[2], kv_capacity,
                         target, overhead, draft_model, draft, plan)
        for r in range(b):
            state[R_HEAD + r * R_FIELDS + R_PLAN] = plan[r]
        state[R_NEW] = np.sort(plan)[(b - 1) // 2]  # (statistics.median_low)
        state[R_REPLANNED] = 1
    zero = False
    for r in range(b):
        k = state[R_HEAD + r * R_FIELDS + R_PLAN]
        k = state[R_NEW] if k == NO_PLAN else k
        ks[r] = k if k < k_max else k_max
        zero = zero or ks[r] == 0
    probing = replan and not faithful and k_cap >= 1 and zero
    state[R_PROBING] = probing
    if probing:
        for r in range(b):
            ks[r] = ks[r] if ks[r] else 1


@njit(cache=True)
def per_request_observe(r: int, k: int, seen: int, state, level, keep: float) -> None:
    """goodput's `observe_columns` of request r's step that drafted k > 0 and accepted
    `seen`: its censored sums and estimate's step (`_ema_of`)."""
    at = R_HEAD + r * R_FIELDS
    state[at + R_ACCEPTED] += seen
    state[at + R_DRAFTED] += k
    state[at + R_REJECTED] += 1 if seen < k else 0
    accepted, cut = state[at + R_ACCEPTED], state[at + R_REJECTED]
    x = accepted / (accepted + cut) if accepted + cut else 1.0
    alpha = keep * level[r] + (1.0 - keep) * x
    alpha = alpha if alpha > 0.0 else 0.0  # min(1.0, max(0.0, a)), as `_ema_of` clamps
    level[r] = alpha if alpha < 1.0 else 1.0

"""The fast path's per-request loops, compiled (numba): a walk, its draft feeds, its shares of
the kept sums; and on the roofline, a chain's draft passes and verify steps from those sums,
a draft model's step taken one at a time, and a planner's alternatives from their sums (with a
draft model and no idle proposer, priced in the same call: `alternatives_times`).

Why compiled: each running request's walk is built once and its shares added to (and taken out
of) the batch's kept sums once, but in numpy that is some 30 small array operations per request,
about 50 us, and a draft model's passes some 20 more per segment; under load a request lives
only a few segments, so this was most of what an iteration cost (docs/speed.md, "Compiled
per-request loops"). As plain loops they cost about a tenth. The walks and sums are integers,
exact in any order; the prices are floats, computed with the numpy code's operations in its
order (numba contracts no multiply-add unless asked), so the loops give the numpy code's numbers
to the bit. `simulator/kernels.py` chooses between the two per run, and
tests/simulator/test_compiled.py compares them.

Imported only by `simulator.kernels` when a run takes the loops: numba's import and first call
cost a process about 0.3 s, and the simulator runs without numba (the numpy code).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: catch-up rules as the loops take them (simulator/draft_feed.py's names)
RULES = {"bonus": 0, "committed": 1, "one": 2}


@njit(cache=True)
def walk(run, cap, capped: bool, cap_g0: int, g0: int, n: int, k: int):
    """`walk_chain`'s loop: from g0, each step at g drafts d = min(k, cap[g - g0 + cap_g0])
    (`capped`; else k), accepts min(d, run[g]) and emits one more, cut at n. Returns the tokens
    generated before each step and after the last, and each step's d."""
    m = n - g0
    if g0 < 0 or m < 0 or k < 0 or run.shape[0] < n or (capped and cap.shape[0] < cap_g0 + m):
        raise IndexError("walk: positions past the request's acceptance run or caps")
    chain = np.empty(m + 1, np.int64)
    drafts = np.empty(m, np.int64)
    chain[0] = g0
    p = 0
    i = 0
    while p < m:
        d = k
        if capped and cap[cap_g0 + p] < d:
            d = cap[cap_g0 + p]
        accepted = run[g0 + p]
        if d < 0 or accepted < 0:  # a walk must move forward (and stay inside its arrays)
            raise ValueError("walk: a negative cap or acceptance run")
        if accepted > d:
            accepted = d
        drafts[i] = d
        p += accepted + 1
        if p > m:
            p = m
        i += 1
        chain[i] = g0 + p
    return chain[: i + 1], drafts[:i]


@njit(cache=True)
def feeds(chain, drafts, varied: bool, k: int, feed: int, rule: int):
    """`next_feed` along a walk: a draft model's first-pass feed before each step and after the
    last, from `feed` before the first (`drafts`: each step's d where `varied`, else k)."""
    m = chain.shape[0] - 1
    if varied and drafts.shape[0] < m:
        raise IndexError("feeds: a walk longer than its drafts")
    out = np.empty(m + 1, np.int64)
    out[0] = feed
    for i in range(m):
        d = drafts[i] if varied else k
        if d < 0:
            raise ValueError("feeds: a step with negative drafts")
        emitted = chain[i + 1] - chain[i]
        if rule == 2:  # one token, whatever happened
            feed = 1
        elif d == 0:  # no chain: the committed tokens pile up for the next
            feed += emitted
        elif rule == 1:  # committed: re-feeds what the step committed
            feed = emitted
        else:  # bonus: the bonus token, and the last draft too where all were accepted
            feed = 2 if emitted > d else 1
        out[i + 1] = feed
    return out


@njit(cache=True)
def add_shares(sums, at: int, gen, base: int, drafts, varied: bool, k: int, sign: int,
               first: int, rows: int, draft: bool, walk_feeds):
    """A walk's shares of the kept sums (`BatchColumns._apply`), times `sign`, from column
    `at`: per step its cached tokens (base + g), drafts d (`drafts` where `varied`, else k), verify
    pairs (d + 1) c + (d + 1)(d + 2) / 2, first rejection, and where kept (`rows` > 0) its
    (d, step) count, and with a draft model (`draft`) its cached tokens by d and, where it drafts,
    the catch-up's extra tokens and pairs from `walk_feeds`; the cached tokens after its last."""
    m = gen.shape[0] - 1
    extra_row = sums.shape[0] - 2
    if (at < 0 or at + m >= sums.shape[1] or (varied and drafts.shape[0] < m) or first < 4
            or sums.shape[0] < 4 or (rows and first + (2 * rows + 2 if draft else rows)
                                     > sums.shape[0])):
        raise IndexError("add_shares: a walk longer than the kept sums, drafts or feeds")
    for i in range(m):
        col = at + i
        c = gen[i] + base
        d = drafts[i] if varied else k
        sums[0, col] += sign * c
        sums[1, col] += sign * d
        sums[2, col] += sign * ((d + 1) * c + (d + 1) * (d + 2) // 2)
        if gen[i + 1] - gen[i] <= d:
            sums[3, col] += sign
        if rows:
            if d < 0 or d >= rows:
                raise IndexError("add_shares: a step's drafts outside the kept sums' rows")
            sums[first + d, col] += sign
            if draft:
                sums[first + rows + d, col] += sign * c
                if d > 0:  # (a walk at k = 0 drafts nothing: no chain, no catch-up)
                    if i >= walk_feeds.shape[0]:
                        raise IndexError("add_shares: a step that drafts without its feed")
                    extra = walk_feeds[i] - 1
                    sums[extra_row, col] += sign * extra
                    sums[extra_row + 1, col] += sign * (extra * (c + 1) - extra * (extra + 1) // 2)
    sums[0, at + m] += sign * (gen[m] + base)


@njit(cache=True)
def _pass_s(held, tokens, pairs, m0: float, m1: float, f_q: float, f_pair: float, fixed: float,
            comm: bool, c0: float, c1: float) -> float:
    """One pass on the roofline (`RooflineLatency.forward_s`, its operations in its order):
    `tokens` fed over `held` cached entries, `pairs` causal pairs."""
    memory = m0 + m1 * (held + tokens)
    compute = f_q * tokens + f_pair * pairs
    pass_fixed = fixed + c0 + c1 * tokens if comm else fixed
    return (memory if memory >= compute else compute) + pass_fixed


@njit(cache=True)
def chain_step_time(ks, cached, feeds, fed: bool, target, draft, overhead: float) -> float:
    """One decode step of a draft model's chain on the roofline (`StepCostModel.iteration_s`
    of one step without prompt chunks: its verify pass plus the step's `overhead`, then its
    draft passes added from the last to the first): request r drafts ks[r] over cached[r]
    tokens, and (`fed`) its chain's first pass feeds feeds[r] where it drafts (its catch-up).
    `target` and `draft`: each role's pass numbers (`_pass_s`)."""
    b = ks.shape[0]
    if cached.shape[0] != b or (fed and feeds.shape[0] != b):
        raise IndexError("chain_step_time: ks, cached and feeds of other lengths")
    if b == 0:
        return 0.0  # (a pass of no request costs nothing)
    step = np.empty((1, b), dtype=np.int64)
    step[0, :] = ks
    feed_tokens = np.zeros(1, dtype=np.int64)
    feed_pairs = np.zeros(1, dtype=np.int64)
    if fed:  # g = f - 1 more tokens over g fewer cached, where a request drafts
        for r in range(b):
            if ks[r] > 0 and feeds[r] != 1:
                extra = feeds[r] - 1
                feed_tokens[0] += extra
                feed_pairs[0] += extra * (cached[r] + 1) - extra * feeds[r] // 2
    # one alternative: this step
    return _chain_steps(step, cached, feed_tokens, feed_pairs, target, draft, overhead)[0]


@njit(cache=True)
def alternatives_times(ks, cached, target, draft, overhead: float):
    """A planner's alternatives for one batch with a draft model's chain on the roofline
    (`StepCostModel.steps_s`; `ks`: alternatives x requests, `cached`: each request's KV before
    the verify; each chain's first pass feeds one token): each one's step as
    `chain_step_time` prices it, in one call."""
    none = np.zeros(ks.shape[0], dtype=np.int64)
    return _chain_steps(ks, cached, none, none, target, draft, overhead)


@njit(cache=True)
def _chain_steps(ks, cached, feed_tokens, feed_pairs, target, draft, overhead: float):
    """Each row of `ks` as a step of a draft model's chain (pass 1 of row a also feeding
    feed_tokens[a] more tokens, with feed_pairs[a] more pairs): its verify pass plus
    `overhead`, then its draft passes added from the last to the first."""
    if cached.shape[0] != ks.shape[1] or cached.shape[0] == 0:
        raise IndexError("_chain_steps: ks and cached of other requests, or none")
    drafted, pairs, seqs, held = alternative_sums(ks, cached)
    b, held_sum = cached.shape[0], cached.sum()
    t_m0, t_m1, t_q, t_pair, t_fixed, t_comm, t_c0, t_c1 = target
    out = np.empty(ks.shape[0])
    for a in range(ks.shape[0]):
        out[a] = _pass_s(held_sum, drafted[a] + b, pairs[a], t_m0, t_m1, t_q, t_pair, t_fixed,
                         t_comm, t_c0, t_c1) + overhead
    if seqs.shape[0] == 0:
        return out
    d_m0, d_m1, d_q, d_pair, d_fixed, d_comm, d_c0, d_c1 = draft
    passes = chain_pass_times(seqs, held, feed_tokens, feed_pairs, d_m0, d_m1, d_q, d_pair,
                              d_fixed, d_comm, d_c0, d_c1, True)
    for a in range(ks.shape[0]):
        out[a] = out[a] + passes[0, a]
    return out


@njit(cache=True)
def alternative_sums(ks, cached):
    """A planner's alternatives for one batch (`StepCostModel.steps_s`; `ks`: alternatives x
    requests, `cached`: each request's KV before the verify) as the sums they are priced from:
    per alternative its drafts and its verify pass's causal pairs, (k + 1) c + (k + 1)(k + 2)
    / 2 a request; per draft pass j = 1..P (P the most drafts of any), the requests drafting
    at least j and their cached tokens (P x alternatives). Integers: exact in any order."""
    alternatives, requests = ks.shape
    if cached.shape[0] != requests:
        raise IndexError("alternative_sums: ks and cached of other requests")
    passes = 0
    for a in range(alternatives):
        for r in range(requests):
            if ks[a, r] < 0:
                raise ValueError("alternative_sums: a negative k")
            passes = max(passes, ks[a, r])
    drafted = np.zeros(alternatives, dtype=np.int64)
    pairs = np.zeros(alternatives, dtype=np.int64)
    seqs = np.zeros((passes, alternatives), dtype=np.int64)
    held = np.zeros((passes, alternatives), dtype=np.int64)
    for a in range(alternatives):
        for r in range(requests):
            k, c = ks[a, r], cached[r]
            drafted[a] += k
            pairs[a] += (k + 1) * c + (k + 1) * (k + 2) // 2
            for j in range(k):
                seqs[j, a] += 1
                held[j, a] += c
    return drafted, pairs, seqs, held


@njit(cache=True)
def stop_lengths(stops, uncapped: int):
    """`acceptance.stop_lengths`: per position g, the drafts a chain from g takes through the
    first stop at or after g, `uncapped` where none comes (one pass from the end)."""
    n = stops.shape[0]
    out = np.empty(n, dtype=np.int64)
    first = uncapped
    for g in range(n - 1, -1, -1):
        if stops[g]:
            first = g
        out[g] = first - g + 1 if first < uncapped else uncapped
    return out


def warm() -> None:
    """Call each loop once on the types the simulator gives them, so their one-time load (from
    numba's cache, or compiling where it has none) is paid here and not inside a run."""
    none = np.zeros(0, dtype=np.int64)
    chain, drafts = walk(np.zeros(4, dtype=np.int64), none, False, 0, 0, 4, 2)
    walk(np.zeros(4, dtype=np.int64), np.ones(4, dtype=np.int64), True, 0, 0, 4, 2)
    walk_feeds = feeds(chain, drafts, True, 2, 1, RULES["bonus"])
    feeds(chain, none, False, 2, 1, RULES["bonus"])
    for varied in (True, False):
        add_shares(np.zeros((16, 8), dtype=np.int64), 0, chain, 0, drafts, varied, 2, 1, 4, 3,
                   True, walk_feeds)
    sums = np.ones((4, 6), dtype=np.int64)  # the kept sums' rows, and their cumsums reversed
    passes = sums[::-1].cumsum(axis=0)[::-1]
    for layout in (passes, sums):  # reversed cumsums (the kept sums'), fresh arrays (steps_s's)
        chain_pass_times(layout, layout, sums[0], sums[1], 1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0,
                         0.0, True)
    verify_times(2, sums[0], sums[1], sums[2], 1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0, 0.0)
    alternative_sums(sums, sums[0])
    numbers = (1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0)
    for fed in (True, False):
        chain_step_time(sums[0], sums[1], sums[2], fed, numbers, numbers, 0.0)
    alternatives_times(sums, sums[0], numbers, numbers, 0.0)
    stop_lengths(np.zeros(3, dtype=np.bool_), 1 << 30)


@njit(cache=True)
def chain_pass_times(seqs, cached, feed_tokens, feed_pairs, m0: float, m1: float, f_q: float,
                     f_pair: float, fixed: float, comm: bool, c0: float, c1: float,
                     in_step_order: bool):
    """A draft model's chain passes j = 1..P of many steps on the roofline
    (`StepCostModel._passes_s` with `RooflineLatency.forward_s`, the same float operations in
    the same order): pass j feeds one token to each of its `seqs[j - 1]` requests, over their
    `cached[j - 1]` tokens before the chain plus j - 1 (pairs: those plus j per request); pass 1
    also feeds the catch-up's extra tokens and pairs, over as many fewer cached. A pass with no
    request or no token costs 0. Returns each pass's seconds (P x steps), or `in_step_order`
    each step's sum from the last pass to the first (1 x steps), as a step adds them."""
    passes, steps = cached.shape
    if (seqs.shape[0] != passes or seqs.shape[1] != steps or feed_tokens.shape[0] != steps
            or feed_pairs.shape[0] != steps):
        raise IndexError("chain_pass_times: passes of other shapes than their cached tokens")
    out = np.zeros((1 if in_step_order else passes, steps))
    for s in range(steps):
        total = 0.0
        for i in range(passes):
            j = passes - i if in_step_order else i + 1
            n = seqs[j - 1, s]
            pairs = cached[j - 1, s] + n * j
            held = cached[j - 1, s] + n * (j - 1)
            tokens = n
            if j == 1:
                tokens += feed_tokens[s]
                held -= feed_tokens[s]
                pairs += feed_pairs[s]
            t = 0.0
            if n > 0 and tokens > 0:
                t = _pass_s(held, tokens, pairs, m0, m1, f_q, f_pair, fixed, comm, c0, c1)
            if not in_step_order:
                out[j - 1, s] = t
            elif i == 0:
                total = t
            else:
                total += t
        if in_step_order:
            out[0, s] = total
    return out


@njit(cache=True)
def verify_times(seqs: int, drafted, cached, pairs, m0: float, m1: float, f_q: float,
                 f_pair: float, fixed: float, comm: bool, c0: float, c1: float,
                 overhead: float):
    """A model-free chain's steps on the roofline (`StepCostModel.chain_steps_s` with
    `RooflineLatency.forward_s`, the same float operations in the same order): each step's
    verify pass feeds its `seqs` requests' drafts and one more token each, over `cached`
    tokens with `pairs` causal pairs; plus the host's `overhead` per step."""
    steps = drafted.shape[0]
    if cached.shape[0] != steps or pairs.shape[0] != steps:
        raise IndexError("verify_times: steps of other lengths")
    out = np.empty(steps)
    for s in range(steps):
        out[s] = _pass_s(cached[s], drafted[s] + seqs, pairs[s], m0, m1, f_q, f_pair, fixed, comm,
                         c0, c1) + overhead
    return out

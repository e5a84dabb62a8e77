"""`auto`, spectune's own policy: its survival model, its pricing and its draft stop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.engine import LinearLatency, workload
from support.policy_fakes import FakeRequest, LinearCost, context, outcome

from policies import make_policy
from policies.auto import STREAK_BINS
from simulator import SchedulerConfig, simulate
from traces import RequestSpeculation, SpeculationTrace


def test_counts_only_what_verification_saw_accepted_drafts_and_the_first_rejection():
    policy = make_policy("auto", {"prior_weight": 1.0, "prior_alpha": 0.5})
    req = FakeRequest(0)
    policy.choose(context([req]))
    policy.observe(context([req]), [outcome(0, k=5, accepted=2)])
    # bins: new, cold, fresh, streak 1, 2, 3, ...: the new request's first draft accepted, its
    # second (streak 1) accepted, its third (streak 2) rejected; streaks 3 and 4 never seen
    assert policy._seen.tolist()[:7] == [2.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0]
    assert policy._accepted.tolist()[:7] == [1.5, 0.5, 0.5, 1.5, 0.5, 0.5, 0.5]
    assert policy._streak[0] == -1 + 1  # fresh: accepted some, then a rejection


def test_the_streak_grows_across_fully_accepted_steps_and_resets_on_a_rejection():
    policy = make_policy("auto")
    req = FakeRequest(0)
    policy.observe(context([req]), [outcome(0, k=3, accepted=3)])
    policy.observe(context([req]), [outcome(0, k=2, accepted=2)])
    assert policy._streak[0] == 5
    policy.observe(context([req]), [outcome(0, k=4, accepted=1)])
    assert policy._streak[0] == 0  # fresh
    policy.observe(context([req]), [outcome(0, k=4, accepted=0)])
    assert policy._streak[0] == -1  # cold
    policy.finish(0)
    assert 0 not in policy._streak


def test_a_long_streak_raises_acceptance_where_the_population_showed_it_does():
    """Copying text: after long streaks drafts are accepted; after a rejection they are not."""
    policy = make_policy("auto")
    hot, cold = FakeRequest(0), FakeRequest(1)
    for _ in range(30):
        policy.observe(context([hot]), [outcome(0, k=8, accepted=8)])
        policy.observe(context([cold]), [outcome(1, k=8, accepted=0)])
    assert policy._streak[0] == 240 and policy._streak[1] == -1  # cold
    rows = policy.acceptance([hot, cold], 4)
    assert rows[0].min() > 0.9 and rows[1][0] < 0.1  # the next draft of each


def test_free_drafts_are_all_taken_and_costly_ones_none():
    reqs = [FakeRequest(i) for i in range(4)]
    free = LinearCost(target_s=10e-3, draft_s=0.0, per_token_s=0.0)
    assert list(make_policy("auto").choose(context(reqs, cost=free))) == [10] * 4
    dear = LinearCost(target_s=10e-3, draft_s=20e-3)
    assert list(make_policy("auto").choose(context(reqs, cost=dear))) == [0] * 4


def test_k_stops_at_the_requests_end_and_at_what_the_drafter_can_propose():
    free = LinearCost(target_s=10e-3, draft_s=0.0, per_token_s=0.0)
    ending = FakeRequest(0, output_tokens=10, generated=7)  # 3 tokens left: 2 drafts + 1
    lookup = FakeRequest(1)
    lookup.draftable = 3
    nothing = FakeRequest(2)
    nothing.draftable = 0
    ks = make_policy("auto").choose(context([ending, lookup, nothing], cost=free))
    assert list(ks) == [2, 3, 0]


def test_a_cold_request_still_drafts_its_first_token_where_finding_a_streak_pays():
    """Copying text: rarely a first draft is accepted, but then the streak is long. A request
    that never drafts never finds it: the first draft is worth the chain it may open."""
    policy = make_policy("auto")
    probe, other = FakeRequest(0), FakeRequest(1)
    for _ in range(10):
        for _ in range(4):  # cold: its first draft rejected
            policy.observe(context([other]), [outcome(1, k=8, accepted=0)])
        for _ in range(3):  # then one is accepted, and the streak holds
            policy.observe(context([other]), [outcome(1, k=8, accepted=8)])
    policy.observe(context([probe]), [outcome(0, k=8, accepted=0)])
    assert policy._streak[0] == -1  # cold
    first = policy.acceptance([probe], 1)[0, 0]
    dear = LinearCost(target_s=10e-3, draft_s=1.3 * first * 10e-3)  # more than its chance
    assert list(policy.choose(context([probe], cost=dear))) == [1]
    hopeless = LinearCost(target_s=10e-3, draft_s=20e-3)  # every draft costs 2 tokens' time
    assert list(policy.choose(context([probe], cost=hopeless))) == [0]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_stop_chains_decides_as_stop_drafting_token_by_token(data):
    policy = make_policy("auto")
    b = data.draw(st.integers(1, 6))
    reqs = [FakeRequest(i) for i in range(b)]
    for i in range(b):  # some history: streaks, ratios and confidence bins
        for _ in range(data.draw(st.integers(0, 4))):
            k = data.draw(st.integers(1, 8))
            acc = data.draw(st.integers(0, k))
            top1 = data.draw(st.lists(st.floats(0, 1), min_size=k, max_size=k))
            policy.observe(context(reqs), [outcome(i, k=k, accepted=acc, draft_top1=top1)])
    cheap = LinearCost(target_s=10e-3, draft_s=data.draw(st.sampled_from([0.0, 2e-4, 1e-3])))
    ks = list(policy.choose(context(reqs, cost=cheap)))
    width = max(ks)
    top1 = np.array(data.draw(st.lists(st.lists(st.floats(0, 1), min_size=width,
                                                max_size=width), min_size=b, max_size=b)))
    whole = policy.stop_chains(reqs, ks, top1.reshape(b, width), np.zeros((b, width)))
    by_token = []
    for i, k in enumerate(ks):
        length = k
        for d in range(k):
            if policy.stop_drafting(reqs[i], d, float(top1[i, d]), 0.0):
                length = d + 1
                break
        by_token.append(length)
    assert whole == by_token
    assert all(1 <= n <= k for n, k in zip(whole, ks) if k)


def test_bad_parameters_are_refused_with_their_name():
    for params, name in (({"prior_alpha": 1.0}, "prior_alpha"), ({"stop_slack": 0.0}, "stop_slack"),
                         ({"k0_bonus": -1.0}, "k0_bonus"), ({"k_max": 65}, "k_max")):
        with pytest.raises(Exception, match=name):
            make_policy("auto", params)


def _bursty_trace(n: int, length: int, seed: int) -> SpeculationTrace:
    """Runs like an n-gram lookup's: long copied spans between stretches of nothing."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        match = np.zeros(length, dtype=bool)
        t = 0
        while t < length:
            span = int(rng.integers(5, 40))
            match[t:t + span] = rng.random() < 0.4
            t += span
        run = np.zeros(length, dtype=np.int32)
        for t in range(length - 2, -1, -1):
            run[t] = run[t + 1] + 1 if match[t] else 0
        run = np.minimum(run, length - np.arange(length))
        requests.append(RequestSpeculation(run=run, draft_top1=np.ones(length),
                                           draft_entropy=np.zeros(length), key=str(i)))
    return SpeculationTrace(tuple(requests), meta={"max_run": length})


def test_on_bursty_acceptance_it_beats_every_fixed_k_and_no_drafting():
    """Where acceptance comes in spans, the streak model drafts long inside them and little
    outside: better than any one k (and than k = 0) at light load."""
    n, length = 60, 160
    rng = np.random.default_rng(3)
    wl = workload(np.cumsum(rng.exponential(0.5, n)), [200] * n, [length] * n)
    trace = _bursty_trace(n, length, seed=4)

    def e2e(policy):
        result = simulate(wl, LinearLatency(), trace, policy, 10_000_000, SchedulerConfig())
        return float((result.requests["finish_s"] - result.requests["arrival_s"]).mean())

    auto = e2e(make_policy("auto"))
    fixed = {k: e2e(make_policy("fixed", {"k": k})) for k in (0, 1, 2, 4, 8)}
    assert auto < min(fixed.values()), (auto, fixed)
    assert STREAK_BINS > 8  # streaks past a whole chain of 8 stay distinguishable

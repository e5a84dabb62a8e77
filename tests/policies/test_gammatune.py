"""`gammatune` and `gammatune_plus` (Gautam et al. 2025): the switching rule on literal cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.engine import LinearLatency, workload
from support.policy_fakes import FakeRequest, context, outcome

from policies import PolicyError, make_policy
from simulator import SchedulerConfig, simulate
from traces import parametric_trace


def step(policy, request_id, accepted, drafted=None, k_max=10):
    """Choose, then observe `accepted` of what was drafted (all that was chosen by default)."""
    req = FakeRequest(request_id)
    k = policy.choose(context([req], k_max=k_max))[0]
    drafted = k if drafted is None else drafted
    policy.observe(context([req], k_max=k_max), [outcome(request_id, drafted, accepted)])
    return policy.choose(context([req], k_max=k_max))[0]


def chain(policy, request, top1):
    """Drafts kept: the engine asks after each draft and stops after the first True."""
    for depth in range(len(top1)):
        if policy.stop_drafting(request, depth, top1[depth], 0.0):
            return depth + 1
    return len(top1)


@pytest.mark.parametrize("name", ["gammatune", "gammatune_plus"])
def test_the_papers_example(name):
    policy = make_policy(name)
    assert list(policy.choose(context([FakeRequest(0)]))) == [3]
    assert step(policy, 0, accepted=3) == 5  # 3 of 3: g = 3 + 2
    assert step(policy, 0, accepted=2) == 3  # 2 of 5: ĝ = 0.7·3 + 0.3·2 = 2.7 -> 3
    assert step(policy, 0, accepted=0) == 2  # 0 of 3: ĝ = 0.7·2.7 = 1.89 -> 2 (ĝ was kept)


def test_full_acceptance_leaves_the_smoothed_estimate_alone():
    policy = make_policy("gammatune")
    assert [step(policy, 0, accepted=a) for a in (3, 5, 7)] == [5, 7, 9]
    assert step(policy, 0, accepted=1) == 3  # ĝ = 0.7·3 + 0.3·1 = 2.4, from 3, not from 9


def test_g_is_clipped_to_its_range():
    policy = make_policy("gammatune")
    assert [step(policy, 0, accepted=a) for a in (3, 5, 7, 9, 10)] == [5, 7, 9, 10, 10]
    policy = make_policy("gammatune", {"g_min": 2})
    # 0 of 3: ĝ = 2.1 -> 3; 0 of 3: ĝ = 1.47, clipped to 2 -> 2; and it stays there
    assert [step(policy, 0, accepted=0) for _ in range(4)] == [3, 2, 2, 2]


def test_ceil_ignores_float_noise():
    policy = make_policy("gammatune", {"eta": 0.2, "g_init": 6})
    assert 0.8 * 6 + 0.2 * 1 > 5  # 5.000000000000001 in floating point
    assert step(policy, 0, accepted=1) == 5


def test_the_engines_cap_limits_the_chain_not_the_state():
    policy = make_policy("gammatune")
    assert step(policy, 0, accepted=3) == 5
    assert list(policy.choose(context([FakeRequest(0)], k_max=4))) == [4]
    assert step(policy, 0, accepted=4, k_max=4) == 4  # 4 of 4 drafted: g = 7, capped at 4
    assert list(policy.choose(context([FakeRequest(0)], k_max=10))) == [7]


def test_requests_are_independent_and_finish_forgets():
    policy = make_policy("gammatune")
    a, b = FakeRequest(0), FakeRequest(1)
    policy.observe(context([a, b]), [outcome(0, 3, 3), outcome(1, 3, 0)])
    assert list(policy.choose(context([a, b]))) == [5, 3]  # b: ĝ = 2.1 -> 3
    policy.observe(context([a, b]), [outcome(0, 5, 1), outcome(1, 3, 0)])
    assert list(policy.choose(context([a, b]))) == [3, 2]  # a: ĝ = 2.4; b: ĝ = 1.47
    policy.finish(0)
    policy.finish(1)
    assert list(policy.choose(context([a, b]))) == [3, 3]
    assert step(policy, 1, accepted=0) == 3  # ĝ restarts at 3: 2.1 -> 3, not 1.03 -> 2


def test_nothing_drafted_teaches_nothing():
    policy = make_policy("gammatune")
    assert step(policy, 0, accepted=0, drafted=0, k_max=0) == 0
    assert list(policy.choose(context([FakeRequest(0)]))) == [3]


# -- gammatune_plus: the confidence stop, and what a cut chain counts as ----------------------


def test_plus_stops_drafting_after_the_first_low_confidence_draft():
    tops = [0.9, 0.5, 0.39, 0.9, 0.9]
    assert chain(make_policy("gammatune_plus"), FakeRequest(0), tops) == 3
    assert chain(make_policy("gammatune_plus", {"tau": 0.3}), FakeRequest(0), tops) == 5


def test_a_cut_chain_fully_accepted_grows_from_the_planned_length():
    policy = make_policy("gammatune_plus")
    assert step(policy, 0, accepted=3) == 5
    # planned 5, the stop cut it to 2, both accepted: g = 5 + 2 (not A + δ = 4)
    assert step(policy, 0, accepted=2, drafted=2) == 7
    # planned 7, cut to 3, one accepted: smoothing takes A = 1: ĝ = 0.7·3 + 0.3·1 = 2.4 -> 3
    assert step(policy, 0, accepted=1, drafted=3) == 3


def test_plus_judges_each_draft_on_its_own_signal():
    policy = make_policy("gammatune_plus")
    req = FakeRequest(0)
    assert policy.stop_drafting(req, 0, 0.1, 0.0)
    assert not policy.stop_drafting(req, 1, 0.9, 0.0)


@pytest.mark.parametrize("name, params", [
    ("gammatune", {"eta": 0.0}), ("gammatune", {"eta": 1.5}), ("gammatune", {"g_min": 0}),
    ("gammatune", {"g_min": 5, "g_max": 4}), ("gammatune", {"g_init": 11}),
    ("gammatune", {"delta": -1}), ("gammatune_plus", {"tau": 1.1}),
    ("gammatune_plus", {"tau": math.nan}),
])
def test_rejects_bad_parameters(name, params):
    with pytest.raises(PolicyError):
        make_policy(name, params)


@pytest.mark.parametrize("name", ["gammatune", "gammatune_plus"])
def test_runs_in_the_engine_on_a_parametric_trace(name):
    out = np.full(40, 60)
    trace = parametric_trace("beta:4,2", out, np.random.default_rng(0))
    res = simulate(workload(np.arange(40) * 0.01, np.full(40, 30), out), LinearLatency(), trace,
                   make_policy(name), 10_000_000, SchedulerConfig(k_max=10))
    assert int(res.requests["accepted"].sum()) > 0
    assert res.steps["max_k"].max() <= 10


# -- whatever they observe -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(["gammatune", "gammatune_plus"]),
       k_max=st.integers(0, 12))
def test_k_stays_within_bounds(data, name, k_max):
    g_max = data.draw(st.integers(1, 20))
    g_min = data.draw(st.integers(1, g_max))
    params = {"g_min": g_min, "g_max": g_max, "g_init": data.draw(st.integers(g_min, g_max)),
              "eta": data.draw(st.floats(0.01, 1.0)), "delta": data.draw(st.integers(0, 5))}
    policy = make_policy(name, params)
    live = {i: FakeRequest(i) for i in range(data.draw(st.integers(1, 4)))}
    signal = st.one_of(st.floats(0.0, 1.0), st.sampled_from([math.nan, math.inf, 0.0]))
    for _ in range(data.draw(st.integers(1, 30))):
        batch = list(live.values())
        ctx = context(batch, k_max=k_max)
        ks = [int(k) for k in policy.choose(ctx)]
        assert all(min(g_min, k_max) <= k <= min(g_max, k_max) for k in ks), (ks, params)
        outcomes = []
        for req, k in zip(batch, ks):
            if policy.uses_draft_stop:
                k = chain(policy, req, [data.draw(signal) for _ in range(k)])
            outcomes.append(outcome(req.request_id, k, data.draw(st.integers(0, k))))
        policy.observe(ctx, outcomes)
        if data.draw(st.booleans()):
            gone = data.draw(st.sampled_from(sorted(live)))
            policy.finish(gone)
            live[gone] = FakeRequest(gone)

"""`heuristic` and `confidence` (transformers assisted generation): literal cases and properties."""

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
from traces import RequestSpeculation, SpeculationTrace

BIG_KV = 10_000_000


def chain(policy, request, top1, entropy=None, k=None):
    """How many drafts the engine keeps: it asks after each draft and stops after the first True."""
    k = len(top1) if k is None else k
    entropy = [0.0] * len(top1) if entropy is None else entropy
    for depth in range(k):
        if policy.stop_drafting(request, depth, top1[depth], entropy[depth]):
            return depth + 1
    return k


# -- heuristic --------------------------------------------------------------------------------


def test_heuristic_grows_by_two_after_full_acceptance_then_shrinks_by_one():
    policy = make_policy("heuristic")
    req = FakeRequest(0)
    assert list(policy.choose(context([req]))) == [5]
    policy.observe(context([req]), [outcome(0, k=5, accepted=5)])
    assert list(policy.choose(context([req]))) == [7]
    policy.observe(context([req]), [outcome(0, k=7, accepted=3)])
    assert list(policy.choose(context([req]))) == [6]


def test_heuristic_never_goes_below_one():
    policy = make_policy("heuristic", {"k_init": 2})
    req = FakeRequest(0)
    for expected in (1, 1, 1):
        policy.observe(context([req]), [outcome(0, k=policy.choose(context([req]))[0],
                                                accepted=0)])
        assert list(policy.choose(context([req]))) == [expected]


def test_heuristic_stays_within_its_own_and_the_engines_cap():
    policy = make_policy("heuristic", {"k_max": 8})
    req = FakeRequest(0)
    policy.observe(context([req]), [outcome(0, k=5, accepted=5)])
    policy.observe(context([req]), [outcome(0, k=7, accepted=7)])
    assert list(policy.choose(context([req], k_max=10))) == [8]  # 9 capped at its k_max
    # the engine's cap 3 also caps the state: one failure brings it to 2, not to 7
    policy.observe(context([req], k_max=3), [outcome(0, k=3, accepted=3)])
    assert list(policy.choose(context([req], k_max=3))) == [3]
    policy.observe(context([req], k_max=3), [outcome(0, k=3, accepted=0)])
    assert list(policy.choose(context([req], k_max=10))) == [2]


def test_heuristic_full_acceptance_is_judged_against_what_was_drafted():
    policy = make_policy("heuristic")
    req = FakeRequest(0)
    policy.observe(context([req]), [outcome(0, k=4, accepted=4)])  # fewer drafted than planned
    assert list(policy.choose(context([req]))) == [7]


def test_heuristic_requests_are_independent_and_finish_forgets():
    policy = make_policy("heuristic")
    a, b = FakeRequest(0), FakeRequest(1)
    policy.choose(context([a, b]))
    policy.observe(context([a, b]), [outcome(0, k=5, accepted=5), outcome(1, k=5, accepted=1)])
    assert list(policy.choose(context([a, b]))) == [7, 4]
    policy.finish(0)
    assert list(policy.choose(context([a, b]))) == [5, 4]  # id 0 comes back as a new request


def test_heuristic_carry_over_starts_new_requests_where_the_last_one_ended():
    for carry, expected in ((True, 7), (False, 5)):
        policy = make_policy("heuristic", {"carry_over": carry})
        policy.observe(context([FakeRequest(0)]), [outcome(0, k=5, accepted=5)])
        policy.finish(0)
        assert list(policy.choose(context([FakeRequest(1)]))) == [expected]


def test_heuristic_ignores_steps_that_drafted_nothing():
    policy = make_policy("heuristic")
    req = FakeRequest(0)
    policy.observe(context([req], k_max=0), [outcome(0, k=0, accepted=0)])
    assert list(policy.choose(context([req]))) == [5]
    assert list(policy.choose(context([req], k_max=0))) == [0]


@pytest.mark.parametrize("params", [{"k_init": 0}, {"k_max": 0}, {"k_init": 9, "k_max": 8},
                                    {"grow": -1}, {"k_init": 2.5}])
def test_heuristic_rejects_bad_parameters(params):
    with pytest.raises(PolicyError):
        make_policy("heuristic", params)


# -- confidence -------------------------------------------------------------------------------


def test_confidence_drafts_up_to_twenty_within_the_engine_cap():
    policy = make_policy("confidence")
    reqs = [FakeRequest(0), FakeRequest(1)]
    assert list(policy.choose(context(reqs, k_max=10))) == [10, 10]
    assert list(policy.choose(context(reqs, k_max=30))) == [20, 20]


def test_confidence_keeps_the_first_low_draft_and_stops_after_it():
    tops = [0.9, 0.8, 0.39, 0.9, 0.9]
    assert chain(make_policy("confidence"), FakeRequest(0), tops) == 3


def test_confidence_threshold_is_strict_and_nan_counts_as_low():
    assert chain(make_policy("confidence"), FakeRequest(0), [0.4, 0.4, 0.4]) == 3
    assert chain(make_policy("confidence"), FakeRequest(0), [0.9, math.nan, 0.9]) == 2


def test_confidence_never_stops_a_fresh_chain_on_the_previous_chains_last_draft():
    policy = make_policy("confidence")
    req = FakeRequest(0)
    assert chain(policy, req, [0.9, 0.1]) == 2  # the low draft was the last one anyway
    assert chain(policy, req, [0.9, 0.9, 0.9]) == 3


def test_confidence_judges_each_draft_on_its_own_signal():
    policy = make_policy("confidence")
    a, b = FakeRequest(0), FakeRequest(1)
    assert policy.stop_drafting(a, 0, 0.1, 0.0)  # a's first draft is low: stop after it
    assert not policy.stop_drafting(b, 0, 0.9, 0.0)  # b is not stopped by a's low draft
    assert not policy.stop_drafting(a, 1, 0.9, 0.0)


@pytest.mark.parametrize("params", [{"threshold": 1.5}, {"threshold": -0.1}, {"max_k": -1},
                                    {"max_k": 65}])
def test_confidence_rejects_bad_parameters(params):
    with pytest.raises(PolicyError):
        make_policy("confidence", params)


def test_confidence_in_the_engine_keeps_each_low_draft():
    n = 30
    top1 = np.tile(np.array([0.9, 0.9, 0.3, 0.9, 0.4, 0.9, 0.9, 0.9], np.float32), 4)[:n]
    rec = RequestSpeculation(run=np.full(n, 8, np.int32), draft_top1=top1,
                             draft_entropy=np.zeros(n, np.float32))
    policy = make_policy("confidence", {"threshold": 0.5})
    res = simulate(workload([0.0], [20], [n]), LinearLatency(), SpeculationTrace((rec,), {}),
                   policy, BIG_KV, SchedulerConfig(k_max=6))
    drafted = res.steps[res.steps["decode_seqs"] > 0]["drafted"].tolist()
    # by hand: from g, draft up to 6, keeping the first draft whose top1 is below 0.5
    g, expected = 1, []
    while g < n:
        k = 0
        while k < 6:
            k += 1
            if top1[min(g + k - 1, n - 1)] < 0.5:
                break
        expected.append(k)
        g = min(g + k + 1, n)
    assert drafted == expected
    assert min(expected) >= 1 and max(expected) < 6  # chains were cut, never to nothing


# -- whatever they observe -------------------------------------------------------------------

SIGNAL = st.one_of(st.floats(0.0, 1.0), st.sampled_from([math.nan, math.inf, -math.inf, 0.0]))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(["heuristic", "confidence"]),
       k_max=st.integers(0, 25))
def test_k_stays_within_bounds(data, name, k_max):
    if name == "heuristic":
        params = {"k_max": data.draw(st.integers(1, 30)), "carry_over": data.draw(st.booleans())}
        params["k_init"] = data.draw(st.integers(1, params["k_max"]))
        own_max, own_min = params["k_max"], 1
    else:
        params = {"max_k": data.draw(st.integers(0, 30))}
        own_max, own_min = params["max_k"], params["max_k"]
    policy = make_policy(name, params)
    live = {i: FakeRequest(i) for i in range(data.draw(st.integers(1, 4)))}
    for _ in range(data.draw(st.integers(1, 30))):
        batch = list(live.values())
        ctx = context(batch, k_max=k_max)
        ks = [int(k) for k in policy.choose(ctx)]
        assert all(min(own_min, k_max) <= k <= min(own_max, k_max) for k in ks), (ks, params)
        outcomes = []
        for req, k in zip(batch, ks):
            if policy.uses_draft_stop:
                k = chain(policy, req, [data.draw(SIGNAL) for _ in range(k)])
            outcomes.append(outcome(req.request_id, k, data.draw(st.integers(0, k))))
        policy.observe(ctx, outcomes)
        if data.draw(st.booleans()):
            gone = data.draw(st.sampled_from(sorted(live)))
            policy.finish(gone)
            live[gone] = FakeRequest(gone)

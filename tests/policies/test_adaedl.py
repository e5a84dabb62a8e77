"""`adaedl` (Agrawal et al. 2024): the entropy stop and the λ update on hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.engine import LinearLatency, workload
from support.policy_fakes import FakeRequest, context, outcome

from policies import PolicyError, make_policy
from policies.adaedl import AdaEDL, acceptance_bound
from simulator import SchedulerConfig, simulate
from traces import parametric_trace


def chain(policy, request, entropy):
    """Drafts kept: the engine asks after each draft and stops after the first True."""
    for depth in range(len(entropy)):
        if policy.stop_drafting(request, depth, 0.5, entropy[depth]):
            return depth + 1
    return len(entropy)


def test_bound_is_one_minus_root_of_gamma_times_entropy():
    assert acceptance_bound(0.8, 0.2) == pytest.approx(0.6)  # 1 - sqrt(0.16)
    assert acceptance_bound(1.25, 0.2) == pytest.approx(0.5)  # 1 - sqrt(0.25)
    assert acceptance_bound(0.0, 0.2) == 1.0
    assert acceptance_bound(math.inf, 0.2) == -math.inf
    assert math.isnan(acceptance_bound(math.nan, 0.2))


def test_stops_after_the_first_draft_whose_bound_is_below_lambda():
    # bounds 1 - sqrt(0.2·H): 0.8, 0.6, 0.4, 1.0; λ = 0.5 fires at depth 2
    entropy = [0.2, 0.8, 1.8, 0.0]
    assert chain(make_policy("adaedl"), FakeRequest(0), entropy) == 3
    # a bound exactly at λ does not fire (1 - sqrt(0.2·1.25) = 0.5)
    assert chain(make_policy("adaedl"), FakeRequest(0), [1.25, 1.25]) == 2


def test_unreadable_entropy_stops_the_chain():
    policy = make_policy("adaedl")
    assert chain(policy, FakeRequest(0), [0.1, math.nan, 0.1]) == 2
    assert chain(policy, FakeRequest(0), [0.1, math.inf, 0.1]) == 2


def test_chain_cap_is_max_k_within_the_engines_k_max():
    policy = make_policy("adaedl")
    reqs = [FakeRequest(0), FakeRequest(1)]
    assert list(policy.choose(context(reqs, k_max=6))) == [6, 6]
    assert list(policy.choose(context(reqs, k_max=20))) == [10, 10]


def test_lambda_update_by_hand():
    policy = make_policy("adaedl")
    req = FakeRequest(0)

    def observe(k, accepted, k_max=10):
        policy.observe(context([req], k_max=k_max), [outcome(0, k, accepted)])
        return policy.threshold(0)

    # AR = 0.5·0 + 0.5·1 = 0.5 < 0.9: λ' = 0.51, λ = 0.9·0.5 + 0.1·0.51 = 0.501
    assert observe(10, 10) == pytest.approx(0.501)
    assert observe(10, 10) == pytest.approx(0.502)  # AR = 0.75: still below
    assert observe(10, 10) == pytest.approx(0.503)  # AR = 0.875
    # AR = 0.9375 > 0.9 and the whole chain (10 = cap) accepted: λ' = 0.493, λ = 0.502
    assert observe(10, 10) == pytest.approx(0.502)
    # AR = 0.96875 > 0.9 but the chain was cut at 4 (< cap 10): λ stays
    assert observe(4, 4) == pytest.approx(0.502)
    # AR = 0.5·0.96875 + 0.5·0 = 0.484375 < 0.9: λ = 0.9·0.502 + 0.1·0.512 = 0.503
    assert observe(4, 0) == pytest.approx(0.503)


def test_the_engines_cap_counts_as_the_whole_chain():
    policy = make_policy("adaedl", {"beta1": 0.0})  # AR is this round's rate
    policy.observe(context([FakeRequest(0)], k_max=6), [outcome(0, 6, 6)])
    assert policy.threshold(0) == pytest.approx(0.5 - 0.001)


def test_a_raised_lambda_stops_chains_sooner():
    policy = make_policy("adaedl", {"lambda_init": 0.5995})
    req = FakeRequest(0)
    assert chain(policy, req, [0.8, 0.8]) == 2  # bound 0.6 >= 0.5995
    policy.observe(context([req]), [outcome(0, 2, 0)])
    assert policy.threshold(0) == pytest.approx(0.6005)  # 0.9·0.5995 + 0.1·0.6095
    assert chain(policy, req, [0.8, 0.8]) == 1  # now fires on the first draft


def test_requests_are_independent_and_finish_forgets():
    policy = make_policy("adaedl")
    a, b = FakeRequest(0), FakeRequest(1)
    policy.observe(context([a, b]), [outcome(0, 10, 0), outcome(1, 0, 0)])
    assert policy.threshold(0) == pytest.approx(0.501)
    assert policy.threshold(1) == 0.5  # drafted nothing: unchanged
    assert policy.stop_drafting(a, 0, 0.5, 10.0)  # a low-confidence draft: stop after it
    assert not policy.stop_drafting(b, 0, 0.5, 0.0)
    assert not policy.stop_drafting(b, 1, 0.5, 0.0)
    policy.finish(0)
    assert policy.threshold(0) == 0.5


@pytest.mark.parametrize("params", [{"gamma": 0.0}, {"target_acceptance": 1.2},
                                    {"beta1": -0.1}, {"beta2": 2.0}, {"epsilon": math.nan},
                                    {"lambda_init": 1.5}, {"max_k": 65}, {"max_k": 2.5}])
def test_rejects_bad_parameters(params):
    with pytest.raises(PolicyError):
        make_policy("adaedl", params)


def test_runs_in_the_engine_on_a_parametric_trace():
    out = np.full(40, 80)
    trace = parametric_trace("beta:4,2", out, np.random.default_rng(0))
    res = simulate(workload(np.arange(40) * 0.01, np.full(40, 30), out), LinearLatency(), trace,
                   make_policy("adaedl", {"lambda_init": 0.65}), 10_000_000,
                   SchedulerConfig(k_max=10))
    drafted = res.steps[res.steps["decode_seqs"] > 0]["max_k"]
    assert drafted.min() >= 1 and drafted.max() <= 10
    assert int(res.requests["accepted"].sum()) > 0


@settings(max_examples=60, deadline=None)
@given(data=st.data(), k_max=st.integers(0, 12))
def test_k_and_lambda_stay_sane_whatever_is_observed(data, k_max):
    params = {"max_k": data.draw(st.integers(0, 20)),
              "gamma": data.draw(st.floats(0.01, 5.0)),
              "lambda_init": data.draw(st.floats(0.0, 1.0))}
    policy = make_policy("adaedl", params)
    live = {i: FakeRequest(i) for i in range(data.draw(st.integers(1, 4)))}
    entropy = st.one_of(st.floats(0.0, 12.0), st.sampled_from([math.nan, math.inf, 0.0]))
    for _ in range(data.draw(st.integers(1, 30))):
        batch = list(live.values())
        ctx = context(batch, k_max=k_max)
        ks = [int(k) for k in policy.choose(ctx)]
        assert ks == [min(params["max_k"], k_max)] * len(batch)
        outcomes = []
        for req, k in zip(batch, ks):
            drafted = chain(policy, req, [data.draw(entropy) for _ in range(k)])
            assert 0 <= drafted <= k
            if k > 0:
                assert drafted >= 1
            outcomes.append(outcome(req.request_id, drafted, data.draw(st.integers(0, drafted))))
        policy.observe(ctx, outcomes)
        assert all(math.isfinite(policy.threshold(r.request_id)) for r in batch)
        if data.draw(st.booleans()):
            gone = data.draw(st.sampled_from(sorted(live)))
            policy.finish(gone)
            live[gone] = FakeRequest(gone)


@pytest.mark.parametrize("seed", range(8))
def test_the_array_stop_rule_decides_as_token_by_token(seed):
    """AdaEDL.stop_chains (the batch at once) gives the chain lengths the base class's
    token-by-token `stop_drafting` gives, NaN, negative and infinite entropies included."""
    from policies import Policy

    rng = np.random.default_rng(seed)
    policy = AdaEDL(gamma=float(rng.uniform(0.05, 1.0)))
    reqs = [FakeRequest(i) for i in range(int(rng.integers(1, 20)))]
    for r in reqs:  # thresholds of their own
        policy._lambda[r.request_id] = float(rng.uniform(0.0, 1.0))
    ks = rng.integers(0, 11, len(reqs)).tolist()
    width = max(max(ks), 1)
    entropy = rng.exponential(1.5, (len(reqs), width))
    entropy[rng.random(entropy.shape) < 0.05] = np.nan
    entropy[rng.random(entropy.shape) < 0.05] = -0.0
    entropy[rng.random(entropy.shape) < 0.02] = np.inf
    top1 = rng.random((len(reqs), width))
    got = policy.stop_chains(reqs, ks, top1, entropy)
    assert got == Policy.stop_chains(policy, reqs, ks, top1, entropy)
    assert all(0 <= g <= k for g, k in zip(got, ks)) and any(g < k for g, k in zip(got, ks))

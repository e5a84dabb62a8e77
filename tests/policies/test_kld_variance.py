"""`kld_variance` (DSDE, Yang et al. 2025): warm-up, bounds, variance ratio, k formula, SL cap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.engine import LinearLatency, workload
from support.policy_fakes import FakeRequest, context, outcome

from policies import PolicyError, make_policy
from policies.kld_variance import (
    KL_CEILING,
    clean_kl,
    dsl_step,
    variance_ratio,
    warmup_bounds,
    weighted_variance,
)
from simulator import SchedulerConfig, simulate
from traces import parametric_trace


def observe(policy, request_id, k, accepted, kl, k_max=20):
    """One verified step; `kl` per observed position (the accepted drafts + first rejection)."""
    req = FakeRequest(request_id)
    policy.observe(context([req], k_max=k_max), [outcome(request_id, k, accepted, kl=kl)])
    return policy.choose(context([req], k_max=k_max))[0]


# -- warm-up ------------------------------------------------------------------------------------


def test_warm_up_doubles_k_after_full_acceptance_up_to_k_max_cfg():
    policy = make_policy("kld_variance")
    assert list(policy.choose(context([FakeRequest(0)], k_max=20))) == [5]
    assert observe(policy, 0, 5, 5, [0.1] * 5) == 10
    assert observe(policy, 0, 10, 9, [0.1] * 10) == 10  # 9 of 10: kept
    assert observe(policy, 0, 10, 10, [0.1] * 10) == 20
    assert observe(policy, 0, 20, 20, [0.1] * 20) == 20  # 40 capped at k_max_cfg
    assert policy.bounds(0) is None  # 45 KL values < W = 100: still warming up


def test_warm_up_doubles_zero_to_one():
    policy = make_policy("kld_variance", {"k_init": 0, "k_min_cfg": 0})
    assert observe(policy, 0, 0, 0, []) == 1
    assert observe(policy, 0, 1, 1, [0.1]) == 2


def test_warm_up_compares_with_its_own_k_not_a_clamped_chain():
    policy = make_policy("kld_variance")
    assert observe(policy, 0, 3, 3, [0.1] * 3, k_max=3) == 3  # engine cap 3: all 3 accepted
    assert observe(policy, 0, 3, 3, [0.1] * 3, k_max=20) == 5  # but k = 5 was not doubled


# -- end of warm-up: per-request bounds ---------------------------------------------------------


def test_bounds_arithmetic():
    # k_max_r = clamp(round(max_acc·(1 + 0.5·mean/max)), k_min_cfg, k_max_cfg)
    assert warmup_bounds([2, 4], [0.5, 1.0], 1, 20) == (1, 6)  # 4·1.375 = 5.5 -> 6 (even)
    assert warmup_bounds([1, 4], [0.5, 0.5], 1, 20) == (1, 6)  # 4·1.5 = 6; ceil(0.6) = 1
    assert warmup_bounds([3], [1.0, 1.0], 1, 20) == (1, 4)  # 3·1.5 = 4.5 -> 4 (half to even)
    assert warmup_bounds([20], [0.2, 0.2], 1, 20) == (2, 20)  # 30 -> 20; ceil(2.0) = 2
    assert warmup_bounds([12], [0.0, 0.0], 1, 20) == (2, 12)  # max KL 0 counts as 1; ceil(1.2)
    assert warmup_bounds([0, 0], [0.3], 1, 20) == (1, 1)  # nothing accepted: k_min_cfg
    assert warmup_bounds([], [], 1, 20) == (1, 20)  # no samples: the configured bounds
    assert warmup_bounds([9], [0.4], 6, 20) == (6, 14)  # 9·1.5 = 13.5 -> 14; ceil(1.4) -> 6


def test_bounds_are_taken_from_warm_up_samples_only():
    policy = make_policy("kld_variance", {"activation_tokens": 6})
    assert observe(policy, 0, 5, 2, [0.5, 0.5, 0.5]) == 5  # 3 values: warm-up sample (2)
    assert observe(policy, 0, 5, 1, [0.5, 0.5]) == 5  # 5 values: warm-up sample (1)
    # 6 values: H is full; this step is no sample. bounds from max acc 2, mean/max KL 1:
    # k_max_r = round(2·1.5) = 3, k_min_r = ceil(0.3) = 1. Then the k formula on this step:
    # H flat -> R = 20; D = 0.5 -> S = e - 1; R·S > 1 -> k = k_min_r
    assert observe(policy, 0, 5, 5, [0.5]) == 1
    assert policy.bounds(0) == (1, 3)
    # low KL: D = 0 -> S = 0 -> k = k_max_r whatever the variance ratio
    assert observe(policy, 0, 1, 1, [0.0]) == 3


# -- the variance ratio and the k formula -------------------------------------------------------


def test_weighted_variance_weights_the_newest_most():
    # two values a, b with weights 0.9, 1: variance = w1·w2·(a-b)² / (w1+w2)²
    assert weighted_variance(np.array([0.0, 2.0]), 0.9) == pytest.approx(0.9 * 4 / 1.9**2)
    assert weighted_variance(np.array([1.0, 2.0, 3.0]), 1.0) == pytest.approx(2 / 3)


def test_variance_ratio_by_hand():
    # decay 1: plain variances. n = 6, s = 2: var(5, 6) = 0.25; var(1..6) = 35/12
    assert variance_ratio(np.arange(1.0, 7.0), 1.0) == pytest.approx(0.25 / (35 / 12))
    # decay 0.9 on [0, 0, 0, 0, 0, 2]: W = Σ 0.9^i (i < 6); V_long = 4/W - (2/W)²;
    # newest two [0, 2], weights 0.9 and 1: V_short = 0.9·4/1.9²
    w = sum(0.9**i for i in range(6))
    v_long = 4 / w - (2 / w) ** 2
    v_short = 0.9 * 4 / 1.9**2
    assert variance_ratio(np.array([0, 0, 0, 0, 0, 2.0]), 0.9) == pytest.approx(v_short / v_long)
    assert v_short / v_long == pytest.approx(1.4851, abs=1e-4)


def test_variance_ratio_edge_cases():
    assert variance_ratio(np.full(9, 0.7), 0.9) == 20.0  # V_long < 1e-6
    assert variance_ratio(np.array([3.0]), 0.9) == 0.0  # n < 2
    assert variance_ratio(np.array([0.0, 1.0, 1.0]), 0.9) == 0.0  # newest third constant


def test_k_formula_by_hand():
    # R·S = 0.5·(e^0.2 - 1) = 0.1107; k = ceil(1 + 4·0.8893) = ceil(4.557) = 5
    assert dsl_step(0.5, 0.1, 1, 5, 2.0, 0.0) == 5
    # R·S = 1·(e^0.4 - 1) = 0.4918; k = ceil(1 + 4·0.5082) = ceil(3.033) = 4
    assert dsl_step(1.0, 0.2, 1, 5, 2.0, 0.0) == 4
    # R·S = 2·(e^0.6 - 1) = 1.644 > 1: k_min
    assert dsl_step(2.0, 0.3, 1, 5, 2.0, 0.0) == 1
    # temperature 2 halves D: same as D = 0.1
    assert dsl_step(0.5, 0.2, 1, 5, 2.0, 2.0) == 5
    # alpha 1 halves the exponent: R·S = 1·(e^0.2 - 1) = 0.2214; ceil(1 + 4·0.7786) = 5
    assert dsl_step(1.0, 0.2, 1, 5, 1.0, 0.0) == 5


def test_k_formula_with_huge_divergence():
    assert dsl_step(20.0, KL_CEILING, 1, 5, 2.0, 0.0) == 1
    assert dsl_step(20.0, KL_CEILING, 1, 5, 2.0, 1e-6) == 1  # exp would overflow: S = inf
    assert dsl_step(0.0, KL_CEILING, 1, 5, 2.0, 1e-6) == 5  # R = 0: R·S = 0, not NaN


# -- the SL cap -----------------------------------------------------------------------------


def _flat_first_step(policy, ids_kl):
    """W = 4: a first step with 5 observed values fills H (no warm-up sample: bounds 1..20)."""
    reqs = [FakeRequest(i) for i in ids_kl]
    ctx = context(reqs, k_max=20)
    policy.observe(ctx, [outcome(i, 5, 5, kl=[kl] * 5) for i, kl in ids_kl.items()])
    return list(policy.choose(ctx))


def test_sl_cap_limits_k_to_the_ceiling_of_the_batch_mean():
    # flat H: R = 20. KL 0.01: R·S = 20·(e^0.02 - 1) = 0.404 -> ceil(1 + 19·0.596) = 13;
    # KL 0.02: R·S = 0.816 -> ceil(1 + 19·0.184) = 5; KL 0: S = 0 -> 20
    kl = {0: 0.01, 1: 0.02, 2: 0.0}
    for cap, last in ((True, 13), (False, 20)):
        policy = make_policy("kld_variance", {"activation_tokens": 4, "cap": cap})
        # on its first step no request was past warm-up before it: no cap yet
        assert _flat_first_step(policy, kl) == [13, 5, 20]
        reqs = [FakeRequest(i) for i in range(4)]
        ctx = context(reqs, k_max=20)
        policy.observe(ctx, [outcome(0, 13, 13, kl=[0.01] * 13), outcome(1, 5, 5, kl=[0.02] * 5),
                             outcome(2, 20, 20, kl=[0.0] * 20), outcome(3, 5, 5, kl=[0.0] * 5)])
        # cap = ceil(mean(13, 5, 20)) = 13; request 3 ended warm-up in this step: it is capped
        # but not counted (counting it: ceil(58/4) = 15)
        assert list(policy.choose(ctx)) == [13, 5, last, last]


def test_sl_cap_leaves_warm_up_requests_alone():
    policy = make_policy("kld_variance", {"activation_tokens": 4})
    _flat_first_step(policy, {0: 0.02})  # post-warm-up at k = 5
    reqs = [FakeRequest(0), FakeRequest(1)]
    ctx = context(reqs, k_max=20)
    policy.observe(ctx, [outcome(0, 5, 5, kl=[0.02] * 5), outcome(1, 5, 1, kl=[0.1, 0.1])])
    policy.observe(ctx, [outcome(0, 5, 5, kl=[0.02] * 5), outcome(1, 5, 0, kl=[0.1])])
    assert policy.bounds(1) is None
    assert list(policy.choose(ctx)) == [5, 5]


# -- robustness, independence, cleanup ----------------------------------------------------------


def test_clean_kl_clips_inf_and_drops_nan():
    got = clean_kl(np.array([np.nan, np.inf, -1.0, 3.0], dtype=np.float32))
    assert got.tolist() == [KL_CEILING, 0.0, 3.0]
    assert round(KL_CEILING, 6) == 18.420681  # ln 1e8


def test_infinite_kl_gives_the_shortest_chain_not_nan():
    policy = make_policy("kld_variance", {"activation_tokens": 4})
    k = observe(policy, 0, 5, 5, [math.inf] * 5)  # H full of the ceiling: flat, R = 20
    assert k == 1 and isinstance(k, int)
    k = observe(policy, 0, 1, 0, [math.inf])
    assert k == 1


def test_nan_kl_is_ignored():
    policy = make_policy("kld_variance", {"activation_tokens": 4})
    assert observe(policy, 0, 5, 5, [math.nan] * 5) == 10  # still warm-up: nothing entered H
    assert policy.bounds(0) is None
    _flat_first_step(policy, {1: 0.02})
    assert observe(policy, 1, 5, 1, [math.nan, math.nan]) == 5  # no usable KL: k kept


def test_requests_are_independent_and_finish_forgets():
    policy = make_policy("kld_variance", {"activation_tokens": 4})
    assert _flat_first_step(policy, {0: 0.01, 1: 0.02}) == [13, 5]
    assert observe(policy, 2, 5, 5, [0.1, 0.2]) == 10  # a third request, still warming up
    assert policy.bounds(0) == (1, 20) and policy.bounds(2) is None
    policy.finish(0)
    assert policy.bounds(0) is None
    assert list(policy.choose(context([FakeRequest(0), FakeRequest(1)], k_max=20))) == [5, 5]


@pytest.mark.parametrize("params", [
    {"k_min_cfg": 21}, {"k_max_cfg": 0}, {"k_max_cfg": 65}, {"k_init": 0},
    {"k_init": 21}, {"activation_tokens": 0}, {"decay": 0.0}, {"decay": 1.5},
    {"alpha": -1.0}, {"alpha": math.inf}, {"temperature": -0.5}, {"temperature": math.nan},
])
def test_rejects_bad_parameters(params):
    with pytest.raises(PolicyError):
        make_policy("kld_variance", params)


def test_runs_in_the_engine_on_a_parametric_trace_with_infinite_kl():
    out = np.full(40, 150)
    trace = parametric_trace("markov:0,0.9@20", out, np.random.default_rng(1))
    assert np.isinf(np.concatenate([r.kl for r in trace.requests])).any()  # alpha 0: p = 0
    res = simulate(workload(np.arange(40) * 0.01, np.full(40, 30), out), LinearLatency(), trace,
                   make_policy("kld_variance", {"activation_tokens": 30}), 10_000_000,
                   SchedulerConfig(k_max=20))
    decode = res.steps[res.steps["decode_seqs"] > 0]
    assert decode["max_k"].max() <= 20 and int(res.requests["accepted"].sum()) > 0


# -- whatever it observes -----------------------------------------------------------------------

KL = st.one_of(st.floats(0.0, 30.0), st.sampled_from([math.inf, math.nan, 0.0, 1e-9]))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), k_max=st.integers(0, 24))
def test_k_stays_within_bounds_whatever_is_observed(data, k_max):
    k_max_cfg = data.draw(st.integers(1, 24))
    k_min_cfg = data.draw(st.integers(1, k_max_cfg))
    params = {"k_max_cfg": k_max_cfg, "k_min_cfg": k_min_cfg,
              "k_init": data.draw(st.integers(k_min_cfg, k_max_cfg)),
              "activation_tokens": data.draw(st.integers(1, 30)),
              "decay": data.draw(st.floats(0.05, 1.0)), "cap": data.draw(st.booleans()),
              "temperature": data.draw(st.sampled_from([0.0, 1e-6, 0.7, 2.0]))}
    policy = make_policy("kld_variance", params)
    live = {i: FakeRequest(i) for i in range(data.draw(st.integers(1, 4)))}
    for _ in range(data.draw(st.integers(1, 40))):
        batch = list(live.values())
        ctx = context(batch, k_max=k_max)
        ks = [int(k) for k in policy.choose(ctx)]
        lo, hi = min(k_min_cfg, k_max), min(k_max_cfg, k_max)
        assert all(lo <= k <= hi for k in ks), (ks, params)
        outcomes = []
        for req, k in zip(batch, ks):
            acc = data.draw(st.integers(0, k))
            kl = [data.draw(KL) for _ in range(min(acc + 1, k))]
            outcomes.append(outcome(req.request_id, k, acc, kl=kl))
        policy.observe(ctx, outcomes)
        for req in batch:
            bounds = policy.bounds(req.request_id)
            if bounds is not None:
                assert k_min_cfg <= bounds[0] <= bounds[1] <= k_max_cfg
        if data.draw(st.booleans()):
            gone = data.draw(st.sampled_from(sorted(live)))
            policy.finish(gone)
            live[gone] = FakeRequest(gone)

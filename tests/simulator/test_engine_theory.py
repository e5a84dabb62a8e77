"""Theory checks: zero-load latency, E[emitted] under i.i.d. acceptance, Little's law."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine import LinearLatency, trace_from_runs, workload

from policies import expected_emitted, make_policy
from simulator import StepCostModel, simulate, summarize
from simulator.metrics import time_average_held
from traces import parametric_trace, parse_acceptance

BIG_KV = 10_000_000


def test_zero_load_e2e_is_the_latency_models_own_sum():
    """One request alone: E2E = prefill + every step, summed by hand from the latency model.

    The draft model's first pass feeds the bonus token, and the last draft too after a chain
    was accepted whole (simulator/draft_feed.py): 2 tokens after g=7's run of 3 = k."""
    lat = LinearLatency()
    prompt, out, k = 37, 12, 3
    run = np.array([0, 2, 0, 5, 1, 0, 0, 3, 1, 0, 4, 2])
    res = simulate(workload([0.0], [prompt], [out]), lat, trace_from_runs([run]),
                   make_policy("fixed", {"k": k}), BIG_KV, fast_path=False)
    cost = StepCostModel(lat)
    expected = cost.prefill_s([prompt])
    g, steps, feed, feeds = 1, 0, 1, []
    while g < out:
        expected += cost.iteration_s([k], [prompt + g - 1], feeds=[feed])
        feeds.append(feed)
        feed = 2 if run[g] >= k else 1
        g = min(g + min(k, run[g]) + 1, out)
        steps += 1
    assert feeds == [1, 1, 1, 1, 2]  # steps at g = 1, 4, 6, 7, 11: only g=7's chain is whole
    row = res.requests.iloc[0]
    assert row["finish_s"] - row["arrival_s"] == pytest.approx(expected, rel=1e-12)
    assert row["first_token_s"] == pytest.approx(cost.prefill_s([prompt]), rel=1e-12)
    assert row["steps"] == steps
    assert steps == len(res.steps) - 1


def test_zero_load_walk_by_hand():
    """A literal case: k=3 over runs [_,2,0,5,1,...] visits positions 1, 4, 6, 7, 11, 12."""
    run = np.array([0, 2, 0, 5, 1, 0, 0, 3, 1, 0, 4, 2])
    res = simulate(workload([0.0], [10], [12]), LinearLatency(), trace_from_runs([run]),
                   make_policy("fixed", {"k": 3}), BIG_KV)
    decode = res.steps[res.steps["decode_seqs"] > 0]
    # step at 1: run 2 -> accept 2, emit 3 -> 4; at 4: run 1 -> emit 2 -> 6; at 6: run 0 -> 7;
    # at 7: run 3 -> emit 4 -> 11; at 11: run 2, but only 1 token left -> 12.
    assert decode["emitted"].tolist() == [3, 2, 1, 4, 1]
    assert decode["accepted"].tolist() == [2, 1, 0, 3, 0]
    assert res.requests["accepted"].iloc[0] == 6


@pytest.mark.parametrize("fast", [True, False])
def test_mean_emitted_matches_iid_formula(fast):
    """k=4, alpha=0.7: mean emitted per step within 1% of (1-0.7^5)/0.3 = 2.773 over >=10k steps."""
    n = 400 if fast else 60
    wl = workload(np.arange(n) * 50.0, np.full(n, 100), np.full(n, 2000))
    trace = parametric_trace(parse_acceptance("iid:0.7"), wl.output_tokens,
                             np.random.default_rng(1))
    res = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 4}), BIG_KV,
                   fast_path=fast)
    s = summarize(res.requests, res.steps)
    decode_steps = res.steps["decode_seqs"].sum()
    assert decode_steps >= 10_000
    assert s["mean_emitted_per_step"] == pytest.approx(expected_emitted(0.7, 4), rel=0.01)
    assert s["mean_k"] == 4


def test_littles_law_on_a_steady_run():
    """L (time-average held, from step records) = lambda W (from request records), within 5%."""
    rng = np.random.default_rng(3)
    n = 3000
    arrivals = np.cumsum(rng.exponential(1 / 8.0, n))
    wl = workload(arrivals, rng.integers(50, 400, n), rng.integers(20, 300, n))
    trace = parametric_trace(parse_acceptance("iid:0.6"), wl.output_tokens, rng)
    res = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 3}), BIG_KV)
    req = res.requests
    horizon = float(req["finish_s"].max())
    lam = n / horizon
    w = float((req["finish_s"] - req["arrival_s"]).mean())
    big_l = time_average_held(res.steps, horizon)
    assert big_l > 1.0  # the run is loaded, or the check would be empty
    assert big_l == pytest.approx(lam * w, rel=0.05)

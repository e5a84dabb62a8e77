"""The fast path on drafters that can run out of proposals (an n-gram lookup's `proposable`):
the same records as one iteration at a time, to the bit, since such runs were recorded step by
step (tests/golden's batch-adaptive n-gram case among them)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.engine import LinearLatency, workload

from policies import make_policy
from simulator import ClusterConfig, SchedulerConfig, simulate
from spectune.simulate import SimulationSpec, build_inputs
from traces import RequestSpeculation, SpeculationTrace, parametric_trace, parse_acceptance


def _both(wl, latency, trace, policy, kv, scheduler, cluster):
    return [simulate(wl, latency, trace, policy, kv, scheduler, cluster, fast_path=fast)
            for fast in (True, False)]


def _assert_identical(fast, slow):
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


@pytest.mark.parametrize("policy,params", [
    ("fixed", {"k": 4}), ("fixed", {"k": 0}), ("batch_adaptive", {}),
    # a k that moves with the batch size: every running request walks anew at each change
    ("batch_adaptive", {"schedule": [[1, 3, 5], [4, 8, 2], [9, 256, 1]]})])
@pytest.mark.parametrize("replicas,router", [(1, "round-robin"), (3, "least-loaded")])
def test_recorded_ngram_trace_on_the_roofline(policy, params, replicas, router):
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=150, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=3)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    assert inputs.acceptance.requests[0].proposable is not None
    fast, slow = _both(inputs.workload, inputs.latency, inputs.acceptance,
                       make_policy(policy, params), inputs.kv_capacity_tokens,
                       SchedulerConfig(max_num_seqs=24), ClusterConfig(replicas, router))
    _assert_identical(fast, slow)
    if "schedule" in params:  # the batch's k did move, both ways
        assert set(fast.steps.max_k[fast.steps.decode_seqs > 0]) >= {1, 2}
    if params.get("k"):  # the lookup's cap did bind: fewer drafts than k in some steps
        drafted = fast.steps.loc[fast.steps.decode_seqs > 0]
        assert (drafted.drafted < 4 * drafted.decode_seqs).any()


def _capped_trace(wl, rng) -> SpeculationTrace:
    """Beta acceptance with a random cap 0..5 per position; runs never exceed the cap."""
    base = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    reqs = []
    for rec in base.requests:
        cap = rng.integers(0, 6, len(rec.run))
        reqs.append(RequestSpeculation(run=np.minimum(rec.run, cap), proposable=cap))
    return SpeculationTrace(tuple(reqs), {"source": "test: capped", "parametric": True})


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("router", ["round-robin", "least-loaded"])
def test_arrivals_on_iteration_boundaries(seed, router):
    """Arrivals at multiples of a power of two land on iteration ends exactly, with ties."""
    rng = np.random.default_rng(seed)
    n = 80
    arrivals = np.sort(rng.integers(0, 300, n)) * 2.0**-7
    wl = workload(arrivals, rng.integers(1, 50, n), rng.integers(1, 40, n))
    latency = LinearLatency(draft=False, overhead_s=2.0**-8)
    fast, slow = _both(wl, latency, _capped_trace(wl, rng), make_policy("fixed", {"k": 3}),
                       100_000, SchedulerConfig(max_num_seqs=6), ClusterConfig(2, router))
    _assert_identical(fast, slow)


@pytest.mark.parametrize("catch_up", ["bonus", "committed", "one"])
@pytest.mark.parametrize("seed", range(3))
def test_a_draft_models_catch_up_after_capped_steps(seed, catch_up):
    """A draft model's catch-up after capped steps (a step that drafts nothing leaves the
    next chain more to feed) is walked by the fast path as stepping has it, and its passes
    where some steps draft fewer: a pass a step does not run costs nothing, though this
    latency model prices an empty pass above zero."""
    rng = np.random.default_rng(seed)
    n = 40
    wl = workload(np.sort(rng.integers(0, 200, n)) * 2.0**-7, rng.integers(1, 50, n),
                  rng.integers(1, 60, n))
    latency = LinearLatency(draft=True)
    latency.draft_catch_up = catch_up
    fast, slow = _both(wl, latency, _capped_trace(wl, rng), make_policy("fixed", {"k": 3}),
                       100_000, SchedulerConfig(max_num_seqs=6), ClusterConfig(2, "round-robin"))
    _assert_identical(fast, slow)
    assert (fast.steps.drafted == 0).any() and (fast.steps.drafted > 0).any()

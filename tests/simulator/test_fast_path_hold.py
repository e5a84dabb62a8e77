"""Policies that hold their k for some steps (`Policy.hold`: goodput between re-plans) take
the fast path, with the same records, to the bit, and the same policy state as one iteration at
a time: such runs were recorded step by step (tests/golden's goodput cases among them)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.engine import KeptPolicies, LinearLatency, workload

from policies import HeldSteps, Policy, make_policy
from policies.goodput import Goodput
from simulator import ClusterConfig, SchedulerConfig, simulate
from simulator.profiled import ProfiledLatency
from simulator.replica import Replica
from spectune.simulate import SimulationSpec, build_inputs
from traces import parametric_trace, parse_acceptance


@pytest.fixture(autouse=True)
def held_not_runs(monkeypatch):
    """goodput's held segments, not its runs of steps: with the compiled loops a replica takes
    those where they stand for it (tests/simulator/test_compiled_walked.py), and its held
    segments still stand where they do not (the numpy code, another estimate, a profile)."""
    from simulator import replica
    monkeypatch.setattr(replica, "prefers_runs", lambda policy: False)


def _both(monkeypatch, inputs, policy, scheduler, cluster=None):
    keep = KeptPolicies(monkeypatch)
    runs = [simulate(inputs.workload, inputs.latency, inputs.acceptance, policy,
                     inputs.kv_capacity_tokens, scheduler, cluster, fast_path=fast)
            for fast in (True, False)]
    n = len(keep.policies) // 2
    return runs, keep.policies[:n], keep.policies[n:]


def _state(policy) -> dict:
    return {k: v for k, v in vars(policy).items() if k.startswith("_") or k == "alpha_hat"}


GOODPUT = [{}, {"per_request": "true"}, {"ema_input": "step", "replan_every": "7"},
           {"ema_input": "inverted", "replan_every": "5"},
           {"ema_input": "cumulative", "per_request": "true", "replan_every": "3"},
           {"replan_every": "1"}]


@pytest.mark.parametrize("params", GOODPUT, ids=lambda p: ",".join(f"{k}={v}" for k, v in
                                                                 p.items()) or "default")
@pytest.mark.parametrize("acceptance,draft", [("smollm2-ngram", "none"), ("beta:5,3", None),
                                              ("iid:0.7~20", "none")])
def test_goodput_takes_the_fast_path_with_the_step_paths_records(monkeypatch, params,
                                                                 acceptance, draft):
    spec = SimulationSpec(workload="poisson", rate=14.0, requests=160, lengths="azure-conv",
                          acceptance=acceptance, draft=draft, seed=5)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    held, learned, real = [], [], Goodput.observe_held

    def observe_held(policy, ctx, steps):
        held.append(steps.steps)
        real(policy, ctx, steps)
        learned.append(policy.alpha_hat != policy.initial_alpha or bool(policy._alpha_r))

    monkeypatch.setattr(Goodput, "observe_held", observe_held)
    (fast, slow), fast_policies, slow_policies = _both(
        monkeypatch, inputs, make_policy("goodput", params), SchedulerConfig(max_num_seqs=24),
        ClusterConfig(2, "least-loaded"))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert [_state(p) for p in fast_policies] == [_state(p) for p in slow_policies]
    assert any(learned)  # its estimates moved
    # segments of several steps, never past a re-plan
    replan = int(params.get("replan_every", 20))
    assert max(held) == min(replan, max(held)) and (max(held) > 1) == (replan > 1)
    assert sum(held) == int((fast.steps.decode_seqs > 0).sum())


def test_arrivals_on_iteration_boundaries_with_a_policy_that_holds(monkeypatch):
    """Arrivals at multiples of a power of two land on iteration ends exactly, with ties."""
    rng = np.random.default_rng(3)
    n = 80
    arrivals = np.sort(rng.integers(0, 300, n)) * 2.0**-7
    wl = workload(arrivals, rng.integers(1, 50, n), rng.integers(1, 40, n))
    trace = parametric_trace(parse_acceptance("beta:4,2~5"), wl.output_tokens, rng)

    class Inputs:
        workload, latency, acceptance = wl, LinearLatency(draft=False, overhead_s=2.0**-8), trace
        kv_capacity_tokens = 100_000

    (fast, slow), fast_policies, slow_policies = _both(
        monkeypatch, Inputs, make_policy("goodput", {"replan_every": "4"}),
        SchedulerConfig(max_num_seqs=6), ClusterConfig(2, "round-robin"))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert [_state(p) for p in fast_policies] == [_state(p) for p in slow_policies]


class _HoldsTwo(Policy):
    """k = 2 held for 3 steps, recording what the engine tells it."""

    name = "holds-two"

    def __init__(self) -> None:
        self.calls, self.held = 0, []

    def choose(self, ctx):
        self.calls += 1
        return [2] * len(ctx.requests)

    def hold(self) -> int:
        return 3

    def observe_held(self, ctx, steps: HeldSteps) -> None:
        self.held.append(steps)


def test_the_engine_reports_held_steps_as_one_column_per_step():
    rng = np.random.default_rng(0)
    wl = workload(np.zeros(3), np.full(3, 10), np.array([30, 30, 30]))
    trace = parametric_trace(parse_acceptance("iid:0.5"), wl.output_tokens, rng)
    policy = _HoldsTwo()
    keep: list[Policy] = []
    real = Replica.__init__

    def init(replica, *args, **kwargs):
        real(replica, *args, **kwargs)
        keep.append(replica.policy)

    Replica.__init__ = init
    try:
        result = simulate(wl, LinearLatency(draft=False), trace, policy, 100_000)
    finally:
        Replica.__init__ = real
    used = keep[0]
    decode_steps = int((result.steps.decode_seqs > 0).sum())
    assert sum(h.steps for h in used.held) == decode_steps
    assert all(1 <= h.steps <= 4 for h in used.held)  # the first step and at most 3 held
    assert used.calls == len(used.held)  # asked once per segment
    for h in used.held:
        assert h.k.shape == h.accepted.shape == h.emitted.shape == h.position.shape
        assert (h.accepted == h.emitted - 1).all() and (h.accepted <= h.k).all()
        assert (h.position[:, 1:] == h.position[:, :-1] + h.emitted[:, :-1]).all()
    emitted = sum(int(h.emitted.sum()) for h in used.held)
    assert emitted == int(result.steps.emitted.sum())


def test_a_profile_takes_the_fast_path_with_the_step_paths_records():
    """A profile's arrays give its scalars' floats, so a policy that holds takes the fast path
    on it too, with the step path's records."""
    from tests.simulator.test_profiled import make_table

    rng = np.random.default_rng(2)
    n = 60
    wl = workload(np.sort(rng.uniform(0, 0.5, n)), rng.integers(1, 50, n),
                  rng.integers(1, 40, n))
    trace = parametric_trace(parse_acceptance("iid:0.6"), wl.output_tokens, rng)
    latency = ProfiledLatency(make_table())
    assert latency.arrays_match_scalars
    fast, slow = (simulate(wl, latency, trace, make_policy("goodput", {"replan_every": "4"}),
                           100_000, SchedulerConfig(max_num_seqs=8), fast_path=fast)
                  for fast in (True, False))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


def test_a_segment_goes_on_past_a_re_plan_that_repeats_the_ks(monkeypatch):
    """The policy is asked again inside a segment where its hold ends; while it repeats its ks,
    the segment goes on (one SimPy wait for several holds), with the step path's records."""
    spec = SimulationSpec(workload="poisson", rate=4.0, requests=120, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=3)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    segments, holds, real_segment, real_held = [], [], Replica._decode_segment, \
        Goodput.observe_held

    def decode_segment(replica):
        segments.append(1)
        return real_segment(replica)

    def observe_held(policy, ctx, steps):
        holds.append(steps.steps)
        real_held(policy, ctx, steps)

    monkeypatch.setattr(Replica, "_decode_segment", decode_segment)
    monkeypatch.setattr(Goodput, "observe_held", observe_held)
    (fast, slow), fast_policies, slow_policies = _both(
        monkeypatch, inputs, make_policy("goodput", {"replan_every": "4"}), SchedulerConfig())
    fast_segments = len(segments)  # the step path takes no segment
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert [_state(p) for p in fast_policies] == [_state(p) for p in slow_policies]
    assert max(holds) == 4 and fast_segments < len(holds) / 2


def test_held_steps_are_reported_in_the_step_paths_context(monkeypatch):
    """Each report of held steps (`observe_held`) comes with the context the step path observes
    the last of them in: at its end, with the requests that arrived during it waiting."""
    observed: list[set] = []
    # (the step path tells goodput its outcomes as columns: observe_columns)
    observe_held, observe = Goodput.observe_held, Goodput.observe_columns

    def seen(ctx):
        return (ctx.step_index, ctx.now_s, ctx.kv_free_tokens, ctx.waiting,
                tuple(r.request_id for r in ctx.requests))

    def counted_held(policy, ctx, steps):
        observed[-1].add(seen(ctx))
        return observe_held(policy, ctx, steps)

    def counted_observe(policy, ctx, outcomes):
        observed[-1].add(seen(ctx))
        return observe(policy, ctx, outcomes)

    monkeypatch.setattr(Goodput, "observe_held", counted_held)
    monkeypatch.setattr(Goodput, "observe_columns", counted_observe)
    spec = SimulationSpec(workload="poisson", rate=14.0, requests=160, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=5)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    for fast in (True, False):
        observed.append(set())
        simulate(inputs.workload, inputs.latency, inputs.acceptance,
                 make_policy("goodput", {"replan_every": "6"}), inputs.kv_capacity_tokens,
                 SchedulerConfig(max_num_seqs=8), fast_path=fast)
    assert observed[0] < observed[1]
    assert any(waiting for _, _, _, waiting, _ in observed[0])  # a queue was reported

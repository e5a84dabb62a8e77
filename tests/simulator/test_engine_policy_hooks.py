"""The protocol's hooks reach policies: draft-stop rules, oracle lookahead, the cost model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
from support.engine import LinearLatency, trace_from_runs, workload

from policies import Policy, make_policy
from simulator import ConfigError, SchedulerConfig, simulate
from traces import RequestSpeculation, SpeculationTrace

BIG_KV = 10_000_000


@dataclass
class _StopBelow(Policy):
    """Draft up to 6, stop a chain after a draft whose top-1 probability is below 0.5."""

    name: ClassVar[str] = "stop-below-test"
    uses_draft_stop: ClassVar[bool] = True

    def choose(self, ctx):
        return [6] * len(ctx.requests)

    def stop_drafting(self, request, depth, draft_top1, draft_entropy):
        return draft_top1 < 0.5


def test_draft_stop_cuts_chains_where_the_signal_says():
    n = 30
    top1 = np.tile(np.array([0.9, 0.9, 0.3, 0.9, 0.4, 0.9, 0.9, 0.9], dtype=np.float32), 4)[:n]
    run = np.full(n, 8, dtype=np.int32)  # every draft would be accepted
    rec = RequestSpeculation(run=run, draft_top1=top1, draft_entropy=np.zeros(n, np.float32))
    trace = SpeculationTrace((rec,), {"source": "test"})
    res = simulate(workload([0.0], [20], [n]), LinearLatency(), trace, _StopBelow(), BIG_KV,
                   SchedulerConfig(k_max=6))
    decode = res.steps[res.steps["decode_seqs"] > 0]
    # by hand: at g, draft until (and including) the first token with top1 < 0.5, at most 6;
    # every draft is accepted
    g, expected = 1, []
    while g < n:
        k = 0
        while k < 6:
            k += 1
            if top1[min(g + k - 1, n - 1)] < 0.5:
                break
        expected.append(k)
        g = min(g + k + 1, n)
    assert decode["drafted"].tolist() == expected
    assert min(expected) < 6  # some chains were cut


def test_draft_stop_without_the_signal_is_a_clear_error():
    with pytest.raises(ConfigError, match="draft_entropy, draft_top1"):
        simulate(workload([0.0], [20], [10]), LinearLatency(), trace_from_runs([np.ones(10)]),
                 _StopBelow(), BIG_KV, SchedulerConfig(k_max=6))


@dataclass
class _Oracle(Policy):
    """Simulation only: draft exactly as many as will be accepted (capped at 5)."""

    name: ClassVar[str] = "oracle-test"
    simulation_only: ClassVar[bool] = True

    def choose(self, ctx):
        return [min(5, int(ctx.lookahead(r.request_id)[r.generated])) for r in ctx.requests]


def test_lookahead_reaches_simulation_only_policies():
    rng = np.random.default_rng(0)
    runs = [rng.integers(0, 7, 80) for _ in range(5)]
    res = simulate(workload(np.arange(5) * 0.01, [30] * 5, [80] * 5), LinearLatency(),
                   trace_from_runs(runs), _Oracle(), BIG_KV, SchedulerConfig(k_max=5))
    steps, finish = res.steps, set(res.requests["finish_s"].round(12))
    ends = (steps["start_s"] + steps["duration_s"]).round(12)
    # no draft is ever rejected: only a request's last step can accept fewer (cut at its end)
    unfinished = steps[~ends.isin(finish) & (steps["decode_seqs"] > 0)]
    assert len(unfinished) > 20
    assert (unfinished["accepted"] == unfinished["drafted"]).all()


@dataclass
class _CostProbe(Policy):
    """Uses the cost model the way goodput-style policies do: k=2 only if it pays."""

    name: ClassVar[str] = "cost-probe-test"
    calls: ClassVar[list] = []

    def choose(self, ctx):
        contexts = [r.context_tokens for r in ctx.requests]
        plain = ctx.cost.step_s([0] * len(contexts), contexts)
        spec = ctx.cost.step_s([2] * len(contexts), contexts)
        _CostProbe.calls.append((plain, spec, ctx.kv_free_tokens, ctx.batch_size))
        return [2 if spec < 1.5 * plain else 0] * len(contexts)


def test_policies_see_the_engines_cost_model_and_kv_room():
    _CostProbe.calls.clear()
    kv = 50_000
    simulate(workload([0.0, 0.001], [100, 100], [30, 30]), LinearLatency(),
             trace_from_runs([np.full(30, 2)]), _CostProbe(), kv, SchedulerConfig(k_max=4))
    plain, spec, free, batch = _CostProbe.calls[0]
    assert 0 < plain < spec  # drafting costs draft passes and a longer verify
    assert free == kv - batch * (100 + 30 + 4)


def test_unknown_signal_needs_are_refused_up_front():
    @dataclass
    class _NeedsKl(Policy):
        name: ClassVar[str] = "needs-kl-test"
        signals: ClassVar[frozenset[str]] = frozenset({"kl"})

        def choose(self, ctx):
            return [1] * len(ctx.requests)

    with pytest.raises(ConfigError, match="kl"):
        simulate(workload([0.0], [20], [10]), LinearLatency(), trace_from_runs([np.ones(10)]),
                 _NeedsKl(), BIG_KV)


def test_a_drafter_that_runs_out_of_proposals_drafts_fewer():
    """An n-gram lookup proposes only what its match holds: the engine drafts min(k, that)."""
    n = 12
    run = np.array([0, 2, 0, 1, 3, 0, 0, 1, 0, 0, 2, 0], dtype=np.int32)
    proposable = np.array([0, 2, 1, 4, 3, 0, 0, 1, 5, 0, 2, 0], dtype=np.int32)
    trace = SpeculationTrace((RequestSpeculation(run=run, proposable=proposable),),
                             {"source": "test"})
    res, stepped = (simulate(workload([0.0], [20], [n]), LinearLatency(), trace,
                             make_policy("fixed", {"k": 4}), BIG_KV, fast_path=fast)
                    for fast in (True, False))
    decode = res.steps[res.steps["decode_seqs"] > 0]
    # by hand: g=1 draft min(4,2)=2, accept 2 -> 4; g=4 draft 3, accept 3 -> 8 (emits 4);
    # g=8 draft 4 (min(4, 5)), accept 0 -> 9; g=9 draft 0 -> 10; g=10 draft 2, accept min(2,2)
    # but one token left -> 12
    assert decode["drafted"].tolist() == [2, 3, 4, 0, 2]
    assert decode["accepted"].tolist() == [2, 3, 0, 0, 1]
    # the draft model's catch-up after those steps, walked by the fast path as stepped
    assert res.meta["fast_path"] and not stepped.meta["fast_path"]
    pd.testing.assert_frame_equal(res.steps, stepped.steps, check_exact=True)


@dataclass
class _SeesCost(Policy):
    """k = 2 while the cost model says a k=2 step costs under a second, else 0."""

    name: ClassVar[str] = "sees-cost-test"

    def choose(self, ctx):
        cheap = ctx.cost.step_s([2] * len(ctx.requests), [30] * len(ctx.requests)) < 1.0
        return [2 if cheap else 0] * len(ctx.requests)


class _Pricey:
    """A StepCost that prices every step at an hour."""

    def step_s(self, ks, context_tokens):
        return 3600.0


def test_policies_read_the_given_policy_cost_while_the_latency_times_the_steps():
    trace, wl = trace_from_runs([np.full(12, 4)]), workload([0.0], [20], [12])
    default = simulate(wl, LinearLatency(), trace, _SeesCost(), BIG_KV,
                       SchedulerConfig(k_max=2))
    assert default.steps["drafted"].max() == 2  # the simulator's own cost: cheap
    pricey = _Pricey()
    given = simulate(wl, LinearLatency(), trace, _SeesCost(), BIG_KV,
                     SchedulerConfig(k_max=2), policy_cost=pricey)
    assert given.steps["drafted"].sum() == 0  # the policy saw an hour per step: no drafts
    # ... but the steps were timed by the latency model, not by the policy's cost
    k0 = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 0}), BIG_KV,
                  SchedulerConfig(k_max=2))
    assert np.allclose(given.steps["duration_s"], k0.steps["duration_s"])

"""vLLM V1's scheduler on the fast path: its plain decode steps run as segments, up to the step
where the token budget or the free KV blocks change what `schedule()` plans, with the same
records, to the bit, as one engine step at a time (vllm-v1 runs were recorded step by step)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.engine import LinearLatency, workload

from policies import make_policy
from simulator import ClusterConfig, SchedulerConfig, simulate
from simulator.replica import Replica
from simulator.scheduler_vllm import VllmV1Scheduler
from spectune.simulate import SimulationSpec, build_inputs
from traces import parametric_trace, parse_acceptance


@pytest.fixture(autouse=True)
def held_not_runs(monkeypatch):
    """goodput's held segments, not its runs of steps: with the compiled loops a replica takes
    those where they stand for it (tests/simulator/test_compiled_walked.py), and its held
    segments still stand where they do not (the numpy code, another estimate, a profile)."""
    from simulator import replica
    monkeypatch.setattr(replica, "prefers_runs", lambda policy: False)


@pytest.fixture
def counted(monkeypatch):
    """Segments run and preemptions made, over the runs of a test."""
    seen = {"segments": 0, "preempted": 0, "left_sums": 0}
    segment, make_room = Replica._planned_segment, VllmV1Scheduler._make_room
    keep_sums = Replica._keep_sums

    def counted_keep(replica, summed):
        keep_sums(replica, summed)
        seen["left_sums"] += sum(not request.summed for request, _ in summed)

    def counted_segment(replica):
        seen["segments"] += 1
        return segment(replica)

    def counted_room(scheduler, request, need, plan):
        before = len(plan.preempted)
        fits = make_room(scheduler, request, need, plan)
        seen["preempted"] += len(plan.preempted) - before
        return fits

    monkeypatch.setattr(Replica, "_planned_segment", counted_segment)
    monkeypatch.setattr(VllmV1Scheduler, "_make_room", counted_room)
    monkeypatch.setattr(Replica, "_keep_sums", counted_keep)
    return seen


def _both(wl, latency, trace, policy, kv, scheduler, cluster=None):
    fast, slow = (simulate(wl, latency, trace, policy, kv, scheduler, cluster, fast_path=fast)
                  for fast in (True, False))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    return fast


CASES = [
    ("fixed", {"k": 4}, "smollm2-ngram", "none"),  # capped drafts
    ("fixed", {"k": 3}, "beta:7,3~20", None),  # a draft model: its feeds
    ("fixed", {"k": 0}, "iid:0.7", "none"),
    ("batch_adaptive", {}, "beta:3.5,6.5~20", None),  # k by batch size: proposals change
    ("confidence", {}, "smollm2-eagle-ngram", "none"),  # its stop folded into the cap
    # policies that hold their ks: asked at a segment's first step, observed at its end
    ("goodput", {"replan_every": 5}, "smollm2-ngram", "none"),
    ("goodput", {"per_request": True, "ema_input": "inverted"}, "beta:3.5,6.5~20", None),
]


@pytest.mark.parametrize("policy,params,acceptance,draft", CASES,
                         ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("budget,kv,replicas", [(2048, None, 1), (40, None, 2),
                                                (2048, 40 * 128, 1)])
def test_vllm_segments_match_the_step_path(counted, policy, params, acceptance, draft, budget,
                                           kv, replicas):
    """The budget of 40 tokens trims drafts, 40 blocks preempt."""
    spec = SimulationSpec(workload="poisson", rate=10.0 * replicas, requests=150,
                          lengths="azure-conv", acceptance=acceptance, draft=draft, seed=4)
    inputs = build_inputs(spec, {}, SchedulerConfig(scheduler="vllm-v1"))
    scheduler = SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=budget,
                                max_num_seqs=12, kv_capacity_tokens=kv)
    fast = _both(inputs.workload, inputs.latency, inputs.acceptance, make_policy(policy, params),
                 kv or inputs.kv_capacity_tokens, scheduler,
                 ClusterConfig(replicas, "least-loaded"))
    assert counted["segments"] and len(fast.steps) > counted["segments"]  # both kinds ran
    if kv is not None:
        assert counted["preempted"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("budget,blocks,prompts", [(512, 12, 300), (22, 200, 20)])
def test_arrivals_on_iteration_boundaries(monkeypatch, counted, seed, budget, blocks, prompts):
    """Arrivals on iteration ends exactly, with ties; a pool of 12 blocks that runs out, or a
    budget that 8 requests' k + 1 = 5 tokens overrun (short prompts: plain decodes mostly).
    The replica keeps the batch's sums (a model-free chain, fixed k) through the steps taken
    one at a time."""
    trimmed = []
    schedule = VllmV1Scheduler.schedule

    def counted_schedule(scheduler, now):
        plan = schedule(scheduler, now)
        trimmed.append(any(0 < e.drafts < 4 for e in plan.scheduled if not e.prefill))
        return plan

    monkeypatch.setattr(VllmV1Scheduler, "schedule", counted_schedule)
    rng = np.random.default_rng(seed)
    n = 90
    arrivals = np.sort(rng.integers(0, 300, n)) * 2.0**-7
    wl = workload(arrivals, rng.integers(1, prompts, n), rng.integers(1, 200, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    scheduler = SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=budget, max_num_seqs=8)
    _both(wl, LinearLatency(draft=False, overhead_s=2.0**-8), trace,
          make_policy("fixed", {"k": 4}), (blocks + 1) * 128, scheduler,
          ClusterConfig(2, "round-robin"))
    assert counted["segments"]
    assert counted["preempted"] if blocks < 100 else any(trimmed)
    # requests left the kept sums in steps taken one at a time (preempted, or their drafts
    # trimmed) and were walked anew, with the same records
    assert counted["left_sums"]


def test_a_policy_that_learns_every_step_steps_one_at_a_time():
    spec = SimulationSpec(workload="poisson", rate=4.0, requests=20, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=0)
    inputs = build_inputs(spec, {}, SchedulerConfig(scheduler="vllm-v1"))
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                      make_policy("auto", {}), inputs.kv_capacity_tokens,
                      SchedulerConfig(scheduler="vllm-v1"))
    assert result.meta["fast_path"] is False


def test_a_held_segment_asks_the_policy_once_and_reports_its_steps(monkeypatch):
    """goodput holds its ks between re-plans: a segment asks it at its first step, from the
    context the step path gives it there (the blocks that step allocates taken), ends where
    the hold does, and reports its steps to `observe_held` with the context the step path
    observes its last step in; its plans change along the run."""
    from policies.goodput import Goodput
    held, asked, observed = [], [], []
    observe_held, observe, choose = (Goodput.observe_held, Goodput.observe_columns,
                                   Goodput.choose)

    def seen(ctx):
        return (ctx.step_index, ctx.now_s, ctx.kv_free_tokens, ctx.waiting,
                tuple(r.request_id for r in ctx.requests))

    def counted_held(policy, ctx, steps):
        held.append(steps.steps)
        observed[-1].add(seen(ctx))
        return observe_held(policy, ctx, steps)

    def counted_observe(policy, ctx, outcomes):
        observed[-1].add(seen(ctx))
        return observe(policy, ctx, outcomes)

    def counted_choose(policy, ctx):
        asked[-1].add(seen(ctx))
        return choose(policy, ctx)

    monkeypatch.setattr(Goodput, "observe_held", counted_held)
    monkeypatch.setattr(Goodput, "observe_columns", counted_observe)  # (the simulator's form)
    monkeypatch.setattr(Goodput, "choose", counted_choose)
    spec = SimulationSpec(workload="poisson", rate=8.0, requests=120, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=2)
    inputs = build_inputs(spec, {}, SchedulerConfig(scheduler="vllm-v1"))
    runs = []
    for fast in (True, False):
        asked.append(set())
        observed.append(set())
        runs.append(simulate(inputs.workload, inputs.latency, inputs.acceptance,
                             make_policy("goodput", {"replan_every": 6}),
                             inputs.kv_capacity_tokens,
                             SchedulerConfig(scheduler="vllm-v1", max_num_seqs=12),
                             fast_path=fast))
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)
    pd.testing.assert_frame_equal(runs[0].steps, runs[1].steps, check_exact=True)
    assert max(held) == 6  # whole holds ran as segments
    # every ask and every report of the segments is one of the step path's, with the same
    # context (arrivals during a segment's last step waiting in its report)
    assert asked[0] < asked[1] and observed[0] < observed[1]
    decode = runs[0].steps[runs[0].steps.decode_seqs > 0]
    assert decode.max_k.nunique() > 1  # the plans moved


@pytest.mark.parametrize("rate,replicas,budget", [(10.0, 1, 2048), (20.0, 2, 2048),
                                                   (20.0, 1, 40)])
def test_steps_that_admit_take_the_walked_requests_share_from_the_kept_sums(monkeypatch, rate,
                                                                            replicas, budget):
    """Under load most engine steps admit or prefill: the running requests read from their
    walks (a model-free chain, a policy asked per running set) take their share of such a
    step from the kept sums (`_head_step`), the rest goes through schedule(); a k that
    changes with the batch size makes them propose other drafts than their walks'
    (`_propose_head`), and a budget of 40 tokens leaves requests unscheduled, holding the
    drafts of an older k. The same records, to the bit, as one engine step at a time."""
    seen = {"head": 0, "other ks": 0}
    head_step, propose_head = Replica._head_step, Replica._propose_head

    def counted_head(replica):
        head = head_step(replica)
        seen["head"] += head is not None
        return head

    def counted_propose(replica, size, ks):
        seen["other ks"] += 1
        return propose_head(replica, size, ks)

    monkeypatch.setattr(Replica, "_head_step", counted_head)
    monkeypatch.setattr(Replica, "_propose_head", counted_propose)
    spec = SimulationSpec(workload="poisson", rate=rate, requests=200, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=4)
    inputs = build_inputs(spec, {}, SchedulerConfig(scheduler="vllm-v1"))
    policy = make_policy("batch_adaptive", {"schedule": [[1, 3, 4], [4, 6, 3], [7, 256, 2]]})
    _both(inputs.workload, inputs.latency, inputs.acceptance, policy,
          inputs.kv_capacity_tokens,
          SchedulerConfig(scheduler="vllm-v1", max_num_seqs=12, max_batched_tokens=budget),
          ClusterConfig(replicas, "least-loaded"))
    assert seen["head"] > 100 and seen["other ks"]

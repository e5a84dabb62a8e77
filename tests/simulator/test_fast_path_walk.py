"""Policies that decide each request's k from its own outcomes alone (`Policy.walker`:
heuristic, gammatune, gammatune_plus, adaedl) take the fast path by walking each request's
whole decode at once (under chunked prefill too, its steps with prompt chunks drafting what
the walks draft there): the same records, to the bit, and the same policy state as asking
`choose` and `observe` every step, which is how such runs were recorded."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
from support.engine import KeptPolicies, LinearLatency, workload

from policies import DraftOutcome, Policy, StepContext, make_policy
from policies.gammatune import GammaTune, GammaTunePlus
from policies.heuristic import Confidence, below
from simulator import ClusterConfig, SchedulerConfig, simulate
from simulator.replica import Replica
from simulator.request import WALKED, RequestState, walk_alone
from spectune.simulate import SimulationSpec, build_inputs
from traces import parametric_trace, parse_acceptance

POLICIES = [("heuristic", {}), ("heuristic", {"carry_over": "true", "k_init": "3"}),
            ("heuristic", {"grow": "1", "shrink": "2", "k_max": "6"}), ("gammatune", {}),
            ("gammatune", {"eta": "0.7", "delta": "1", "g_max": "8"}), ("gammatune_plus", {}),
            ("adaedl", {}), ("adaedl", {"gamma": "0.5", "target_acceptance": "0.6"})]


#: every setting on both recordings; the parametric trace has no draft signals, so only the
#: policies without a stop rule run on it; with a draft model too (its catch-up walked)
CASES = [(policy, params, acceptance, replicas, "none")
         for acceptance, replicas in (("smollm2-ngram", 1), ("smollm2-eagle-ngram", 3))
         for policy, params in POLICIES] + [
    (policy, params, "beta:6,3~20", 1, draft) for policy, params in POLICIES
    if policy in ("heuristic", "gammatune") for draft in ("none", "Llama-68M")] + [
    (policy, params, "smollm2-eagle-ngram", 2, "Llama-68M") for policy, params in POLICIES
    if policy in ("gammatune_plus", "adaedl")] + [
    (policy, params, "smollm2-eagle-tree", 1, "Llama-68M") for policy, params in POLICIES[:1]
    + POLICIES[3:4]]  # a draft tree's passes, to its depth
#: chunked prefill: every setting on the n-gram recording at a tight budget (most steps carry
#: prompt chunks) and a loose one; with a draft model, and over replicas
CHUNKED = [(policy, params, "smollm2-ngram", 1, "none", budget) for policy, params in POLICIES
           for budget in (256, 2048)] + [
    (policy, params, "smollm2-eagle-ngram", 2, "Llama-68M", 512) for policy, params in POLICIES
    if policy in ("heuristic", "gammatune_plus", "adaedl")] + [
    ("gammatune", {}, "beta:6,3~20", 3, "none", 1024),
    ("heuristic", {}, "smollm2-eagle-tree", 1, "Llama-68M", 512)]  # a draft tree's passes


@pytest.mark.parametrize("policy,params,acceptance,replicas,draft", CASES,
                         ids=[f"{a}-{r}-{d}-{p}-" + (",".join(f"{k}={v}" for k, v in q.items())
                                                     or "default") for p, q, a, r, d in CASES])
def test_walked_requests_give_the_step_paths_records(monkeypatch, policy, params, acceptance,
                                                     replicas, draft):
    spec = SimulationSpec(workload="poisson", rate=14.0, requests=150, lengths="azure-conv",
                          acceptance=acceptance, draft=draft, seed=2)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    fast = _walked_as_stepped(monkeypatch, inputs, make_policy(policy, params),
                              inputs.kv_capacity_tokens, SchedulerConfig(max_num_seqs=24),
                              replicas)
    decode = fast.steps[fast.steps.decode_seqs > 0]
    assert decode.drafted.nunique() > 3  # ks moved from step to step


def _walked_as_stepped(monkeypatch, inputs, policy, kv_capacity: int,
                       scheduler: SchedulerConfig, replicas: int):
    """The run on the fast path (returned) and on the step path: the same records to the bit,
    and each replica's policy in the same state at the end."""
    keep = KeptPolicies(monkeypatch)
    fast, slow = (simulate(inputs.workload, inputs.latency, inputs.acceptance,
                           copy.deepcopy(policy), kv_capacity, scheduler,
                           ClusterConfig(replicas), fast_path=fast) for fast in (True, False))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    walked, stepped = keep.policies[:replicas], keep.policies[replicas:]
    for a, b in zip(walked, stepped):
        assert vars(a) == vars(b)
    return fast


@pytest.mark.parametrize("policy,params,acceptance,replicas,draft,budget", CHUNKED,
                         ids=[f"{a}-{r}-{d}-{b}-{p}-" + (",".join(f"{k}={v}" for k, v in q.items())
                                                         or "default")
                              for p, q, a, r, d, b in CHUNKED])
def test_walked_requests_under_chunked_prefill_give_the_step_paths_records(
        monkeypatch, policy, params, acceptance, replicas, draft, budget):
    spec = SimulationSpec(workload="poisson", rate=14.0, requests=150, lengths="azure-conv",
                          acceptance=acceptance, draft=draft, seed=3)
    scheduler = SchedulerConfig(chunked_prefill=True, max_batched_tokens=budget,
                                max_num_seqs=24)
    inputs = build_inputs(spec, {}, scheduler)
    # (the tight budget with a KV cache that holds a few requests: they wait for room)
    kv = 12_000 if budget == 256 else inputs.kv_capacity_tokens
    from_sums = []
    original = Replica._chunked_step

    def counted(self, head):
        from_sums.append(head.size)
        return (yield from original(self, head))
    monkeypatch.setattr(Replica, "_chunked_step", counted)
    fast = _walked_as_stepped(monkeypatch, inputs, make_policy(policy, params), kv, scheduler,
                              replicas)
    # a model-free drafter's steps with prompt chunks read the walks' share from the kept sums
    assert (len(from_sums) > 10) == (draft == "none" and "tree" not in acceptance)
    chunked = fast.steps[(fast.steps.decode_seqs > 0) & (fast.steps.prefill_seqs > 0)]
    assert len(chunked) > 10  # steps with prompt chunks drafted from the walks
    assert fast.steps.drafted.nunique() > 3  # ks moved from step to step


class _Steps:
    """A walker that drafts the ks it is given, in turn, and records what it was told."""

    def __init__(self, ks):
        self.ks, self.told = list(ks), []

    def k(self, position):
        return self.ks[len(self.told)]

    def saw(self, drafted, accepted, emitted, position):
        self.told.append((drafted, accepted, emitted, position))


def test_a_walk_by_hand():
    """From g = 1 over runs [_, 2, 0, 5, 1, 0, 0, 3, 1, 0, 4, 2] with caps of 3 everywhere but
    position 4 (1): k = 3 at 1 accepts 2 -> 4; k = 4 capped to 1 at 4 accepts 1 -> 6; k = 0 at 6
    emits 1 -> 7; k = 2 at 7 accepts 2 -> 10; k = 5 capped to 3 at 10 accepts 3, cut at the
    request's end (12) -> 2 emitted."""
    request = RequestState(0, 0, 0.0, 10, 12)
    request.generated = 1
    request.run = np.array([0, 2, 0, 5, 1, 0, 0, 3, 1, 0, 4, 2])
    request.cap = [3, 3, 3, 3, 1, 3, 3, 3, 3, 3, 3, 3]
    walker = _Steps([3, 4, 0, 2, 5])
    walk_alone(request, walker, k_max=8)
    assert request.chain.tolist() == [1, 4, 6, 7, 10, 12]
    assert request.chain_ks.tolist() == [3, 1, 0, 2, 3]
    assert walker.told == [(3, 2, 3, 1), (1, 1, 2, 4), (0, 0, 1, 6), (2, 2, 3, 7), (3, 1, 2, 10)]
    assert request.chain_k == WALKED


class _UnfoldedGammaTunePlus(GammaTunePlus):
    """gammatune_plus with its stop asked token by token: its walker does not apply the stop,
    so it must not be walked."""

    stop_positions = Policy.stop_positions


@pytest.mark.parametrize("case", ["vllm-v1", "unfolded stop"])
def test_where_requests_are_not_walked(case):
    rng = np.random.default_rng(3)
    n = 30
    wl = workload(np.arange(n) * 0.01, rng.integers(1, 50, n), rng.integers(2, 40, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    policy = make_policy("heuristic", {})
    latency, scheduler = LinearLatency(draft=False), SchedulerConfig()
    if case == "vllm-v1":
        scheduler = SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=256)
    else:
        spec = SimulationSpec(workload="poisson", rate=10.0, requests=60, lengths="azure-conv",
                              acceptance="smollm2-eagle-ngram", draft="none", seed=1)
        inputs = build_inputs(spec, {}, SchedulerConfig())
        wl, trace, latency = inputs.workload, inputs.acceptance, inputs.latency
        policy = _UnfoldedGammaTunePlus()
    result = simulate(wl, latency, trace, policy, 10_000_000, scheduler)
    assert result.meta["fast_path"] is False


class _StricterConfidence(Confidence):
    """confidence with its own rule, stop_drafting only: the parent's fold must not stand in."""

    def stop_drafting(self, request, depth, draft_top1, draft_entropy):
        return below(float(draft_top1), 0.8)


class _LoggedGammaTune(GammaTune):
    """gammatune with its own observe: the parent's walker must not stand in for it."""

    def observe(self, ctx, outcomes):
        super().observe(ctx, outcomes)


def test_a_subclass_that_changes_a_rule_is_not_given_its_parents_fast_form():
    spec = SimulationSpec(workload="poisson", rate=10.0, requests=80, lengths="azure-conv",
                          acceptance="smollm2-eagle-ngram", draft="none", seed=6)
    inputs = build_inputs(spec, {}, SchedulerConfig())

    def run(policy):
        return simulate(inputs.workload, inputs.latency, inputs.acceptance, policy,
                        inputs.kv_capacity_tokens)

    stricter, same_rule = run(_StricterConfidence()), run(Confidence(threshold=0.8))
    assert not stricter.meta["fast_path"] and same_rule.meta["fast_path"]
    pd.testing.assert_frame_equal(stricter.requests, same_rule.requests, check_exact=True)
    logged = run(_LoggedGammaTune())
    assert not logged.meta["fast_path"]
    pd.testing.assert_frame_equal(logged.requests, run(make_policy("gammatune", {})).requests,
                                  check_exact=True)


@pytest.mark.parametrize("policy,params", [("heuristic", {}), ("heuristic", {"carry_over": "true"}),
                                           ("gammatune", {"eta": "0.5"}), ("adaedl", {}),
                                           ("adaedl", {"gamma": "0.6", "beta1": "0.2"})])
def test_a_walker_is_its_policys_choose_and_observe_step_by_step(policy, params):
    """One request, step by step: the walker's ks and the policy's whole state after each
    step equal those of choose (its draft stop asked token by token), the cap and observe."""
    rng = np.random.default_rng(7)
    n, k_max = 120, 8
    run = rng.integers(0, 9, n)
    cap = rng.integers(0, 9, n).tolist()
    entropy = np.where(rng.random(n) < 0.1, np.nan, rng.exponential(1.0, n))
    signals = {"draft_entropy": entropy, "draft_top1": rng.random(n)}
    stepped, walked = make_policy(policy, params), make_policy(policy, params)
    for p in (stepped, walked):  # a request already finished, for carry_over to carry
        p.observe(_ctx([], k_max), [])
        if policy == "heuristic":
            p._carried = 4
    request = RequestState(0, 7, 0.0, 20, n)
    request.generated = 1
    walker = walked.walker(7, k_max, signals)
    g, states = 1, []
    while g < n:
        ctx = _ctx([request], k_max)
        k = int(stepped.choose(ctx)[0])
        if type(stepped).uses_draft_stop:  # as the replica's _draft_stop
            for d in range(k):
                t = min(g + d, n - 1)
                if stepped.stop_drafting(request, d, float(signals["draft_top1"][t]),
                                         float(entropy[t])):
                    k = d + 1
                    break
        assert walker.k(g) == k
        k = min(k, cap[g])
        emit = min((min(k, int(run[g])) if k else 0) + 1, n - g)
        stepped.observe(ctx, [DraftOutcome(7, k, emit - 1, emit, g)])
        walker.saw(k, emit - 1, emit, g)
        assert vars(walked) == vars(stepped)
        states.append(k)
        g += emit
        request.generated = g
    assert len(set(states)) > 2  # the ks moved


def _ctx(requests, k_max):
    return StepContext(now_s=0.0, replica=0, step_index=0, requests=requests, k_max=k_max,
                       cost=None, kv_capacity_tokens=0, kv_free_tokens=0, waiting=0)

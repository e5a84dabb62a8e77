"""Chunked prefill on the fast path: steps with no prompt to chunk run as segments, with the
same records, to the bit, and the same policy state as one iteration at a time (chunked runs
were recorded step by step)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.engine import ByParity, KeptPolicies, LinearLatency, workload

from policies import make_policy
from simulator import ClusterConfig, SchedulerConfig, simulate
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


def _both(monkeypatch, wl, latency, trace, policy, kv, scheduler, cluster=None):
    keep = KeptPolicies(monkeypatch)
    runs = [simulate(wl, latency, trace, policy, kv, scheduler, cluster, fast_path=fast)
            for fast in (True, False)]
    return runs, keep.policies


def _assert_identical(fast, slow):
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


CASES = [
    ("fixed", {"k": 4}, "smollm2-ngram", "none"),  # capped drafts
    ("fixed", {"k": 3}, "beta:7,3~20", None),  # a draft model: its feeds
    ("fixed", {"k": 0}, "iid:0.7", "none"),
    ("batch_adaptive", {}, "beta:3.5,6.5~20", None),
    ("goodput", {}, "smollm2-ngram", "none"),  # holds, asked again inside segments
    ("goodput", {}, "beta:5,3", None),
    ("confidence", {}, "smollm2-eagle-ngram", "none"),  # its stop folded into the cap
]


@pytest.mark.parametrize("policy,params,acceptance,draft", CASES,
                         ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("budget,replicas", [(2048, 1), (96, 2)])
def test_chunked_prefill_segments_match_the_step_path(monkeypatch, policy, params, acceptance,
                                                     draft, budget, replicas):
    spec = SimulationSpec(workload="poisson", rate=10.0 * replicas, requests=150,
                          lengths="azure-conv", acceptance=acceptance, draft=draft, seed=4)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    scheduler = SchedulerConfig(chunked_prefill=True, max_batched_tokens=budget, max_num_seqs=12)
    segments = []
    real = Replica._decode_segment

    def counted(replica):
        segments.append(replica.index)
        return real(replica)

    monkeypatch.setattr(Replica, "_decode_segment", counted)
    (fast, slow), kept = _both(monkeypatch, inputs.workload, inputs.latency, inputs.acceptance,
                               make_policy(policy, params), inputs.kv_capacity_tokens,
                               scheduler, ClusterConfig(replicas, "least-loaded"))
    _assert_identical(fast, slow)
    assert segments and len(fast.steps) > len(segments)  # both kinds of step ran
    assert (fast.steps.prefill_seqs > 0).any()
    if policy == "goodput":  # the same learnt state, replica by replica
        half = len(kept) // 2
        for a, b in zip(kept[:half], kept[half:]):
            assert a.alpha_hat == b.alpha_hat and a._alpha_r == b._alpha_r


@pytest.mark.parametrize("seed", range(3))
def test_kv_limit_and_arrivals_on_iteration_boundaries(monkeypatch, seed):
    """Requests wait for KV room (none fits until a finish), and arrivals land on iteration
    ends exactly, with ties."""
    rng = np.random.default_rng(seed)
    n = 90
    arrivals = np.sort(rng.integers(0, 300, n)) * 2.0**-7
    wl = workload(arrivals, rng.integers(1, 120, n), rng.integers(1, 60, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    scheduler = SchedulerConfig(chunked_prefill=True, max_batched_tokens=64, max_num_seqs=8)
    (fast, slow), _ = _both(monkeypatch, wl, LinearLatency(draft=False, overhead_s=2.0**-8),
                            trace, make_policy("fixed", {"k": 3}), 600, scheduler,
                            ClusterConfig(2, "round-robin"))
    _assert_identical(fast, slow)
    assert (fast.steps.waiting > 0).any()


def test_a_profile_takes_segments_with_the_step_paths_records():
    """A profile's arrays give its scalars' floats, so chunked runs on it take segments too,
    and a draft model's capped steps, with the step path's records."""
    for acceptance, profile in (("iid:0.6~20", "cpu-smollm2-135m"),
                                ("smollm2-ngram", "cpu-smollm2-135m")):
        spec = SimulationSpec(workload="poisson", rate=3.0, requests=40, lengths="azure-conv",
                              acceptance=acceptance, profile=profile, seed=0)
        inputs = build_inputs(spec, {}, SchedulerConfig())
        fast, slow = (simulate(inputs.workload, inputs.latency, inputs.acceptance,
                               make_policy("fixed", {"k": 3}), inputs.kv_capacity_tokens,
                               SchedulerConfig(chunked_prefill=True, max_batched_tokens=512),
                               fast_path=fast) for fast in (True, False))
        assert fast.meta["fast_path"] and not slow.meta["fast_path"]
        pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
        pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


@pytest.mark.parametrize("budget,replicas", [(2048, 1), (96, 2)])
def test_steps_with_prompt_chunks_take_the_decodes_share_from_the_kept_sums(
        monkeypatch, budget, replicas):
    """A model-free chain with a policy asked per running set: the replica keeps the batch's
    sums, and a step with prompt chunks prices its decodes from them, every running request
    walked at the set's k (`_chunked_head`; where a k by batch size changes, walked anew at
    the new one). The same records, to the bit, as one iteration at a time."""
    seen = {"from sums": 0, "ks": set()}
    chunked_head = Replica._chunked_head

    def counted_head(replica, decode):
        head = chunked_head(replica, decode)
        seen["from sums"] += head is not None
        seen["ks"].add(replica._walked_k)
        return head

    monkeypatch.setattr(Replica, "_chunked_head", counted_head)
    spec = SimulationSpec(workload="poisson", rate=10.0 * replicas, requests=200,
                          lengths="azure-conv", acceptance="smollm2-ngram", draft="none", seed=4)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    scheduler = SchedulerConfig(chunked_prefill=True, max_batched_tokens=budget, max_num_seqs=12)
    policy = make_policy("batch_adaptive", {"schedule": [[1, 3, 4], [4, 6, 3], [7, 256, 2]]})
    (fast, slow), _ = _both(monkeypatch, inputs.workload, inputs.latency, inputs.acceptance,
                            policy, inputs.kv_capacity_tokens, scheduler,
                            ClusterConfig(replicas, "least-loaded"))
    _assert_identical(fast, slow)
    assert seen["from sums"] > 100 and len(seen["ks"]) > 1


def test_a_set_of_several_ks_reads_every_request_in_steps_with_prompt_chunks(monkeypatch):
    """Where the policy gives the running set several ks, a step with prompt chunks reads every
    request (it takes the decodes' share from the sums only where the set has one k), and
    segments walk each at its own: the same records as one iteration at a time."""
    heads = []
    chunked_head = Replica._chunked_head

    def counted(replica, decode):
        head = chunked_head(replica, decode)
        heads.append(head is not None)
        return head

    monkeypatch.setattr(Replica, "_chunked_head", counted)
    spec = SimulationSpec(workload="poisson", rate=10.0, requests=150, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=4)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    scheduler = SchedulerConfig(chunked_prefill=True, max_batched_tokens=512, max_num_seqs=12)
    (fast, slow), _ = _both(monkeypatch, inputs.workload, inputs.latency, inputs.acceptance,
                            ByParity(), inputs.kv_capacity_tokens, scheduler)
    _assert_identical(fast, slow)
    assert any(heads) and not all(heads)  # (sets of one parity have one k)

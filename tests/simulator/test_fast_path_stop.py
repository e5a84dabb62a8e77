"""Stop rules that read only each drafted token's signals (`Policy.stop_positions`: confidence,
gammatune_plus) are folded into the drafter's cap per position: the same chains, so the same
records to the bit, as asking the rule token by token; confidence then takes the fast path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.engine import LinearLatency, workload

from policies import Policy, make_policy
from policies.gammatune import GammaTunePlus
from policies.heuristic import Confidence
from simulator import ClusterConfig, SchedulerConfig, simulate
from simulator.acceptance import UNCAPPED, stop_lengths
from spectune.simulate import SimulationSpec, build_inputs
from traces import RequestSpeculation, SpeculationTrace


class _AskedConfidence(Confidence):
    """confidence without the fold: its rule asked token by token, one step at a time."""

    stateless_per_batch = False
    stop_positions = Policy.stop_positions


class _AskedGammaTunePlus(GammaTunePlus):
    stop_positions = Policy.stop_positions


def test_stop_lengths_by_hand():
    stops = np.array([False, True, False, False, True, False])
    # from 0 the first stop is at 1 (two drafts), from 2 at 4 (three), none from 5 on
    assert stop_lengths(stops).tolist() == [2, 1, 3, 2, 1, UNCAPPED]
    assert stop_lengths(np.zeros(3, dtype=bool)).tolist() == [UNCAPPED] * 3


def _assert_same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)


@pytest.mark.parametrize("acceptance", ["smollm2-eagle-ngram", "smollm2-ngram"])
@pytest.mark.parametrize("params,scheduler,replicas", [
    ({}, SchedulerConfig(max_num_seqs=24), 1),
    ({"max_k": 8, "threshold": 0.7}, SchedulerConfig(max_num_seqs=16), 3),
    ({}, SchedulerConfig(chunked_prefill=True, max_batched_tokens=256), 1),
    ({}, SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=512), 1),
])
def test_confidence_folded_gives_the_rules_chains(acceptance, params, scheduler, replicas):
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=120, lengths="azure-conv",
                          acceptance=acceptance, draft="none", seed=4)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    runs = [simulate(inputs.workload, inputs.latency, inputs.acceptance, policy,
                     inputs.kv_capacity_tokens, scheduler, ClusterConfig(replicas), fast_path=fast)
            for policy, fast in ((Confidence(**params), True), (Confidence(**params), False),
                                 (_AskedConfidence(**params), False))]
    folded, stepped, asked = runs
    # (chunked prefill and vllm-v1: their plain decode steps run as segments)
    assert folded.meta["fast_path"] and not asked.meta["fast_path"]
    _assert_same(folded, asked)
    _assert_same(stepped, asked)
    decode = asked.steps[asked.steps.decode_seqs > 0]
    # the rule did cut chains: fewer drafts than max_k in some steps
    assert (decode.drafted < params.get("max_k", 20) * decode.decode_seqs).any()


def test_gammatune_plus_folded_gives_the_rules_chains():
    spec = SimulationSpec(workload="poisson", rate=10.0, requests=120, lengths="azure-conv",
                          acceptance="smollm2-eagle-ngram", draft="none", seed=5)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    folded, asked = (simulate(inputs.workload, inputs.latency, inputs.acceptance, policy,
                              inputs.kv_capacity_tokens)
                     for policy in (make_policy("gammatune_plus", {}), _AskedGammaTunePlus()))
    _assert_same(folded, asked)


def test_the_fold_compares_signals_in_float64_as_the_rule_does():
    """A top-1 of float32(0.7) is below 0.7 (the rule reads it as a Python float); compared in
    float32 it would not be, and the chains would differ. NaN counts as below."""
    n = 40
    rng = np.random.default_rng(0)
    top1 = np.where(rng.random(n) < 0.5, np.float32(0.7), np.float32(0.9)).astype(np.float32)
    top1[[5, 17]] = np.nan
    requests = tuple(RequestSpeculation(run=rng.integers(0, 6, n).astype(np.int64),
                                        draft_top1=top1, draft_entropy=np.zeros(n, np.float32))
                     for _ in range(6))
    trace = SpeculationTrace(requests, {"source": "test: float32 confidence"})
    wl = workload(np.arange(6) * 0.05, np.full(6, 30), np.full(6, n))
    folded, asked = (simulate(wl, LinearLatency(draft=False), trace, policy, 100_000,
                              SchedulerConfig(k_max=8))
                     for policy in (Confidence(max_k=6, threshold=0.7),
                                    _AskedConfidence(max_k=6, threshold=0.7)))
    _assert_same(folded, asked)
    decode = asked.steps[asked.steps.decode_seqs > 0]
    assert (decode.drafted < 6 * decode.decode_seqs).any()

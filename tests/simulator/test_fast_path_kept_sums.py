"""The kept sums under vLLM's scheduler and chunked prefill (`Replica.plan_sums`,
`Replica.chunk_sums`) across drawn configurations: policy, acceptance source, load, budget,
max_num_seqs, KV capacity, replicas, step records kept or only their totals. Each run's fast
path gives the records and totals of one step at a time, to the bit."""

from __future__ import annotations

import random

import pytest

from policies import make_policy
from simulator import ClusterConfig, SchedulerConfig, simulate
from spectune.simulate import SimulationSpec, build_inputs

POLICIES = [("fixed", {"k": 4}), ("fixed", {"k": 2}), ("fixed", {"k": 0}),
            ("batch_adaptive", {"schedule": [[1, 3, 5], [4, 8, 3], [9, 256, 1]]}),
            ("batch_adaptive", {}), ("confidence", {})]
SOURCES = ["smollm2-ngram", "smollm2-eagle-ngram", "iid:0.7", "beta:7,3~20"]


@pytest.mark.parametrize("draw", range(16))
def test_drawn_configurations_keep_the_step_paths_records(draw):
    rng = random.Random(draw)
    scheduler = rng.choice(["vllm-v1", "chunked"])
    policy = rng.choice(POLICIES)
    source = "smollm2-eagle-ngram" if policy[0] == "confidence" else rng.choice(SOURCES)
    replicas = rng.choice([1, 1, 2])
    budget, seqs = rng.choice([32, 64, 256, 1024, 2048]), rng.choice([4, 8, 16, 64])
    spec = SimulationSpec(workload="poisson", rate=rng.choice([4.0, 10.0, 20.0, 40.0]) * replicas,
                          requests=rng.choice([80, 150]),
                          lengths=rng.choice(["azure-conv", "azure-code"]), acceptance=source,
                          draft="none", seed=rng.randrange(100))
    config = (SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=max(budget, 64),
                              max_num_seqs=seqs) if scheduler == "vllm-v1"
              else SchedulerConfig(chunked_prefill=True, max_batched_tokens=budget,
                                   max_num_seqs=seqs))
    inputs = build_inputs(spec, {}, config)
    kv = rng.choice([None, 20_000, 60_000]) or inputs.kv_capacity_tokens
    keep = rng.random() < 0.8
    cluster = ClusterConfig(replicas, "least-loaded")
    fast, slow = (simulate(inputs.workload, inputs.latency, inputs.acceptance,
                           make_policy(*policy), kv, config, cluster, fast_path=f,
                           keep_steps=keep) for f in (True, False))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    assert fast.requests.equals(slow.requests)
    assert fast.steps.equals(slow.steps) and fast.totals == slow.totals
    assert len(fast.requests) == spec.requests

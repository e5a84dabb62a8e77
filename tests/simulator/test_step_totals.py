"""A run that keeps no step records (tune's, and simulate's without --out) summarises to the same
numbers as one that keeps them: the totals are folded as the steps come, on every path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from policies import make_policy
from simulator import ClusterConfig, SchedulerConfig, simulate, summarize
from simulator.logs import STEP_COLUMNS, StepLog, StepTotals
from spectune.simulate import SimulationSpec, build_inputs


@pytest.mark.parametrize("acceptance", ["smollm2-ngram", "iid:0.7~20"])
@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("scheduler,cluster,policy", [
    (SchedulerConfig(max_num_seqs=16), ClusterConfig(1), ("fixed", {"k": 3})),
    (SchedulerConfig(max_batched_tokens=512, chunked_prefill=True), ClusterConfig(1),
     ("goodput", {})),
    (SchedulerConfig(max_num_seqs=8), ClusterConfig(3, "least-loaded"), ("batch_adaptive", {})),
    (SchedulerConfig(max_num_seqs=12), ClusterConfig(2), ("goodput", {"per_request": True})),
    # the replica keeps the batch's sums through the steps with prompt chunks
    (SchedulerConfig(max_batched_tokens=512, chunked_prefill=True), ClusterConfig(1),
     ("fixed", {"k": 4})),
    (SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=512), ClusterConfig(2),
     ("fixed", {"k": 4})),
    # walked requests, whole prompts and chunked (the oracle's walks checked against its cap)
    (SchedulerConfig(max_num_seqs=16), ClusterConfig(1), ("oracle", {})),
    (SchedulerConfig(max_batched_tokens=512, chunked_prefill=True), ClusterConfig(2),
     ("oracle", {})),
    (SchedulerConfig(max_batched_tokens=512, chunked_prefill=True), ClusterConfig(1),
     ("heuristic", {})),
])
def test_totals_without_the_records_equal_those_of_the_records(
        monkeypatch, acceptance, fast_path, scheduler, cluster, policy):
    monkeypatch.setattr(StepLog, "FOLD", 7)  # fold many times in a short run
    spec = SimulationSpec(workload="poisson", rate=10.0, requests=120, acceptance=acceptance,
                          draft="none", seed=5)
    inputs = build_inputs(spec, {}, scheduler)
    runs = [simulate(inputs.workload, inputs.latency, inputs.acceptance,
                     make_policy(*policy), inputs.kv_capacity_tokens, scheduler, cluster,
                     fast_path=fast_path, keep_steps=keep) for keep in (True, False)]
    kept, folded = runs
    assert len(kept.steps) > 7 * 3 and folded.steps.empty
    assert list(folded.steps.columns) == list(STEP_COLUMNS)
    assert folded.totals == kept.totals == StepTotals.from_frame(kept.steps)
    pd.testing.assert_frame_equal(folded.requests, kept.requests, check_exact=True)
    assert summarize(folded.requests, folded.totals) == summarize(kept.requests, kept.steps)


def test_totals_by_hand():
    log = StepLog(keep=False)
    row = dict.fromkeys(STEP_COLUMNS, 0)
    for decode, emitted, drafted in ((2, 5, 6), (0, 0, 0), (3, 4, 9)):
        log.add(*{**row, "decode_seqs": decode, "emitted": emitted, "drafted": drafted}.values())
    block = np.zeros((len(STEP_COLUMNS), 2))
    block[STEP_COLUMNS.index("decode_seqs")] = [1, 4]
    block[STEP_COLUMNS.index("emitted")] = [2, 8]
    log.add_block(block)
    assert log.totals() == StepTotals(iterations=5, request_steps=10, decode_iterations=4,
                                      emitted=19, drafted=15)
    assert log.frame().empty

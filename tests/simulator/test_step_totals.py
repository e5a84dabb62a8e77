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
    head = {**row, "decode_seqs": 1}
    log.add_segment(tuple(head.values()), np.array([0.5]), np.array([0.1, 0.2]),
                    np.array([2, 8]))
    assert log.totals() == StepTotals(iterations=5, request_steps=7, decode_iterations=4,
                                      emitted=19, drafted=15)
    assert log.frame().empty


def test_segments_stitch_into_the_rows_they_stand_for():
    """A segment is its head repeated, with the columns that vary written over it: starts,
    durations, emitted (and accepted = emitted - decode requests), and drafted and max_k per
    step where given (max_k also as levels reached); rows between segments keep their place."""
    log = StepLog(keep=True)
    blank = dict.fromkeys(STEP_COLUMNS, 0)

    def head(**values):
        return tuple({**blank, **values}.values())

    log.add_segment(head(start_s=1.0, decode_seqs=2, drafted=8, max_k=4), np.array([1.5]),
                    np.array([0.5, 0.25]), np.array([5, 3]))
    log.add(*head(start_s=1.75, prefill_seqs=1, prefill_tokens=30))
    levels = np.array([[2, 1, 2], [1, 0, 1], [0, 0, 1]])  # requests drafting >= 1, 2, 3
    log.add_segment(head(start_s=2.0, decode_seqs=2, waiting=1), np.array([2.1, 2.3]),
                    np.array([0.1, 0.2, 0.3]), np.array([4, 2, 6]), np.array([3, 1, 4]),
                    levels)
    log.add_segment(head(start_s=2.6, decode_seqs=1), np.array([]), np.array([0.4]),
                    np.array([1]), np.array([0]), np.array([0]))
    frame = log.frame()
    assert frame["start_s"].tolist() == [1.0, 1.5, 1.75, 2.0, 2.1, 2.3, 2.6]
    assert frame["duration_s"].tolist() == [0.5, 0.25, 0.0, 0.1, 0.2, 0.3, 0.4]
    assert frame["emitted"].tolist() == [5, 3, 0, 4, 2, 6, 1]
    assert frame["accepted"].tolist() == [3, 1, 0, 2, 0, 4, 0]
    assert frame["drafted"].tolist() == [8, 8, 0, 3, 1, 4, 0]
    assert frame["max_k"].tolist() == [4, 4, 0, 2, 1, 3, 0]
    assert frame["waiting"].tolist() == [0, 0, 0, 1, 1, 1, 0]
    assert frame["prefill_tokens"].tolist() == [0, 0, 30, 0, 0, 0, 0]
    assert log.totals() == StepTotals.from_frame(frame)

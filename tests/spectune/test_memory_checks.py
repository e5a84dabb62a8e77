"""Before a run that cannot fit, one line with the estimate; steps.csv is streamed as the run
goes (the same file as written at once, in a replica count's worth of orders), and without
--out no step records are kept at all."""

from __future__ import annotations

import json

import pytest

from simulator import ClusterConfig, SchedulerConfig, engine
from simulator.logs import STEP_COLUMNS
from spectune.cli import _parser, main
from spectune.files import write_csv
from spectune.flags import dataclass_from_args
from spectune.simulate import SimulationSpec, run
from traces import parametric

RUN = ["simulate", "--workload", "poisson", "--requests", "200", "--acceptance", "iid:0.7"]


def test_records_that_cannot_fit_are_refused_with_the_estimate(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(parametric, "available_memory_bytes", lambda: 10_000)
    assert main([*RUN, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "200 requests need about 0.0 GiB, and this machine has 0.0 GiB available" in err


@pytest.mark.parametrize("flags", [
    [],
    ["--replicas", "3", "--router", "least-loaded", "--max-num-seqs", "8"],
    ["--replicas", "2", "--router", "round-robin", "--chunked-prefill", "--max-batched-tokens",
     "256", "--policy", "goodput"],
])
def test_streamed_steps_are_the_steps_written_at_once(monkeypatch, capsys, tmp_path, flags):
    monkeypatch.setattr(engine, "ARRIVAL_CHUNK", 5)  # flush between every 5 arrivals
    argv = [*RUN, "--rate", "12", *flags]
    assert main([*argv, "--format", "json", "--out", str(tmp_path / "a")]) == 0
    streamed = json.loads(capsys.readouterr().out)
    # the same run with its steps kept in memory, written at once
    args = _parser().parse_args(argv)
    result, summary = run(dataclass_from_args(SimulationSpec, args), {},
                          dataclass_from_args(SchedulerConfig, args),
                          dataclass_from_args(ClusterConfig, args))
    assert list(result.steps.columns) == list(STEP_COLUMNS) and len(result.steps) > 20
    write_csv(tmp_path / "kept.csv", result.steps)
    assert (tmp_path / "a" / "steps.csv").read_bytes() == (tmp_path / "kept.csv").read_bytes()
    assert not list((tmp_path / "a").glob(".*.part"))
    assert streamed["iterations"] == summary["iterations"] == len(result.steps)
    assert main([*argv, "--format", "json", "--no-steps", "--out", str(tmp_path / "b")]) == 0
    assert not (tmp_path / "b" / "steps.csv").exists()
    no_steps = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in no_steps.items() if k != "inputs"} == \
        {k: v for k, v in streamed.items() if k != "inputs"}

"""Cached evaluations are keyed by the contents of their inputs, not by their names: an edited
workload, speculation trace, profile or catalog entry, or new code, is simulated again, and an
unchanged rerun is answered from the cache."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from simulator import SchedulerConfig
from simulator.builtin_profiles import DATA as SHIPPED_PROFILES
from spectune import contents
from spectune.cli import main
from spectune.evaluate import Runner, Task
from spectune.search import Candidate
from spectune.simulate import SimulationSpec
from traces import parametric_trace

TINY_TUNE = ["--rates", "4", "--seeds", "1", "--requests", "30", "--policies", "fixed:k=2",
             "--jobs", "1", "--no-report", "--format", "json"]
K2 = Candidate("fixed", (("k", 2),))


def _write_workload(path: Path, output_scale: int = 1) -> None:
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(0.25, 60))
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["arrival_s", "prompt_tokens", "output_tokens"])
        for t, p, o in zip(arrivals, rng.integers(50, 800, 60), rng.integers(20, 300, 60)):
            writer.writerow([f"{t:.3f}", int(p), int(o) * output_scale])


def _tune(capsys, workload: Path, out: Path) -> tuple[float, int, int]:
    """(objective at rate 4, simulations, reused) of a tiny tune into `out`."""
    assert main(["tune", "--workload", str(workload), *TINY_TUNE, "--out", str(out)]) == 0
    objective = json.loads(capsys.readouterr().out)["recommendations"][0]["objective"]
    meta = json.loads((out / "tune.json").read_text())["meta"]
    return objective, meta["simulations"], meta["reused_from_cache"]


def test_a_tune_recomputes_when_the_workload_file_changes(tmp_path, capsys):
    workload, out = tmp_path / "my.csv", tmp_path / "run"
    _write_workload(workload)
    first, n, reused = _tune(capsys, workload, out)
    assert reused == 0
    assert _tune(capsys, workload, out) == (first, n, n)  # unchanged: every result reused

    _write_workload(workload, output_scale=5)
    edited, n, reused = _tune(capsys, workload, out)
    assert reused == 0
    assert edited > 2 * first  # five times the output tokens: a much longer E2E
    assert _tune(capsys, workload, out) == (edited, n, n)
    fresh, _, _ = _tune(capsys, workload, tmp_path / "fresh")
    assert edited == fresh


def _run(task: Task, cache: Path) -> tuple[dict, int]:
    """(metrics, how many came from the cache) of one task run through a Runner."""
    with Runner(cache, jobs=1) as runner:
        metrics = runner.run([task])[0]
    return metrics, runner.cached


def _task(**scenario) -> Task:
    spec = SimulationSpec(requests=30, **scenario)
    return Task(spec, SchedulerConfig(), K2, rate=4.0, seed=0)


def test_an_edited_speculation_trace_is_recomputed(tmp_path):
    trace_file, cache = tmp_path / "trace.npz", tmp_path / "evals"
    outputs = np.full(30, 200)
    parametric_trace("iid:0.3", outputs, np.random.default_rng(0)).save(trace_file)
    task = _task(workload="poisson", lengths="fixed:100,200", acceptance=str(trace_file))
    low, cached = _run(task, cache)
    assert cached == 0
    assert _run(task, cache) == (low, 1)

    parametric_trace("iid:0.9", outputs, np.random.default_rng(0)).save(trace_file)
    high, cached = _run(task, cache)
    assert cached == 0
    assert high["mean_emitted_per_step"] > low["mean_emitted_per_step"]
    assert _run(task, cache) == (high, 1)


def test_an_edited_profile_table_is_recomputed(tmp_path):
    profile, cache = tmp_path / "profile", tmp_path / "evals"
    shutil.copytree(SHIPPED_PROFILES / "cpu-smollm2-135m", profile)
    task = _task(workload="poisson", lengths="fixed:64,32", profile=str(profile))
    before, cached = _run(task, cache)
    assert cached == 0
    assert _run(task, cache) == (before, 1)

    table = profile / "latency.csv"
    rows = list(csv.DictReader(table.open()))
    for row in rows:  # a device twice as slow
        for column in ("median_s", "p10_s", "p90_s"):
            row[column] = str(2 * float(row[column]))
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    after, cached = _run(task, cache)
    assert cached == 0
    assert after["e2e_mean_s"] > 1.5 * before["e2e_mean_s"]


def test_a_new_code_version_is_recomputed(tmp_path, monkeypatch):
    cache, task = tmp_path / "evals", _task(workload="poisson", lengths="fixed:100,50")
    metrics, _ = _run(task, cache)
    assert _run(task, cache) == (metrics, 1)
    monkeypatch.setattr(contents, "code_version", lambda: "an upgrade")
    assert _run(task, cache) == (metrics, 0)  # same simulator output, but not assumed so
    assert len(list(cache.glob("*.json"))) == 2
    assert _run(task, cache) == (metrics, 1)


def test_the_code_version_covers_the_simulator_and_its_shipped_data():
    names = {name for name, _ in contents._code_files()}
    for name in ("simulator/engine.py", "policies/goodput.py", "traces/workload.py",
                 "spectune.evaluate", "spectune.simulate",
                 "traces/data/speculation/smollm2-ngram.npz",
                 "traces/data/AzureLLMInferenceTrace_conv.csv.gz",
                 "simulator/data/profiles/cpu-smollm2-135m/latency.csv"):
        assert name in names


def test_catalog_entries_are_keyed_by_their_fields(monkeypatch):
    import simulator

    task = _task(workload="azure-conv", hardware="H100-SXM")
    original = simulator.get_gpu
    monkeypatch.setattr(simulator, "get_gpu", lambda name: replace(
        original(name), bandwidth_bytes_per_s=original(name).bandwidth_bytes_per_s * 2))
    faster = task.key()
    monkeypatch.setattr(simulator, "get_gpu", original)
    assert task.key() != faster


def test_a_file_is_hashed_once_per_version(tmp_path, monkeypatch):
    file = tmp_path / "w.csv"
    file.write_text("a")
    calls = []
    real = contents.hashlib.file_digest
    monkeypatch.setattr(contents.hashlib, "file_digest",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    first = contents.file_digest(file)
    assert contents.file_digest(file) == first and len(calls) == 1
    file.write_text("bb")
    assert contents.file_digest(file) != first and len(calls) == 2

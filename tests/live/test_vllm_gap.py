"""vLLM's host time between iterations: a run's equation from its files, the fit over runs, the
profile that carries it into the simulator, and the command that writes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from live.vllm_gap import GapFitError, busy_seconds, find_runs, fit_iteration_gap, run_terms
from simulator import ConfigError
from simulator.builtin_profiles import resolve_profile
from simulator.latency_table import LatencyTable
from simulator.profiled import ProfiledLatency
from spectune.cli import main

FIXED, PER_REQUEST, SPEC_STEP = 0.0015, 0.00006, 0.0006


def write_run(folder: Path, batches: list[int], drafts: int, idle_s: float = 0.0,
              rng: np.random.Generator | None = None) -> None:
    """A served run whose busy time is exactly its iterations plus the gap model's time, with
    the requests split into two busy periods `idle_s` apart (idle time is not gap)."""
    folder.mkdir(parents=True)
    rng = rng or np.random.default_rng(0)
    elapsed = rng.uniform(20, 60, len(batches))
    its = pd.DataFrame({"iteration": range(len(batches)), "context_requests": 0,
                        "context_tokens": 0, "generation_requests": batches,
                        "generation_tokens": [b * (1 + drafts) for b in batches],
                        "elapsed_ms": elapsed, "dummy": False})
    its.to_csv(folder / "iterations.csv", index=False)
    step_s = elapsed / 1000 + FIXED + PER_REQUEST * np.array(batches) + SPEC_STEP * (drafts > 0)
    half = len(batches) // 2
    first, second = step_s[:half].sum(), step_s[half:].sum()
    # periods: [0, first] and [first + idle, first + idle + second], two overlapping requests each
    reqs = pd.DataFrame({"sent_s": [0.0, first / 3, first + idle_s, first + idle_s + 0.001],
                         "finish_s": [first / 2, first, first + idle_s + second,
                                      first + idle_s + second / 2]})
    reqs.to_csv(folder / "requests.csv", index=False)


def test_busy_time_is_the_union_of_the_requests_intervals():
    assert busy_seconds(np.array([0.0, 1.0, 5.0, 2.0]), np.array([2.0, 3.0, 6.0, 2.5])) == 4.0
    assert busy_seconds(np.array([]), np.array([])) == 0.0


def test_one_run_gives_its_terms_and_the_gap_they_sum_to(tmp_path):
    write_run(tmp_path / "r", [1, 2, 4, 4], drafts=2, idle_s=10.0)
    terms, gap = run_terms(tmp_path / "r")
    assert terms.tolist() == [4, 11, 4]
    assert gap == pytest.approx(4 * FIXED + 11 * PER_REQUEST + 4 * SPEC_STEP)


def test_the_fit_recovers_the_three_coefficients(tmp_path):
    rng = np.random.default_rng(1)
    for i, (batch, drafts) in enumerate([(1, 0), (4, 0), (12, 0), (2, 4), (8, 2), (20, 1)]):
        write_run(tmp_path / "runs" / f"r{i}", list(rng.integers(1, 2 * batch + 1, 50)), drafts,
                  idle_s=float(i), rng=rng)
    gap = fit_iteration_gap(find_runs([tmp_path / "runs"]))
    assert (gap.runs, gap.iterations) == (6, 300)
    assert gap.fixed_s == pytest.approx(FIXED, rel=1e-6)
    assert gap.per_request_s == pytest.approx(PER_REQUEST, rel=1e-6)
    assert gap.speculative_step_s == pytest.approx(SPEC_STEP, rel=1e-6)
    assert gap.rms_s < 1e-9


def test_runs_that_cannot_give_the_gap_say_why(tmp_path):
    write_run(tmp_path / "a", [1, 2], 0)
    with pytest.raises(GapFitError, match="needs at least 3"):
        fit_iteration_gap(find_runs([tmp_path]))
    with pytest.raises(GapFitError, match="not a folder"):
        find_runs([tmp_path / "missing"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "iterations.csv").write_text("x\n1\n")
    (tmp_path / "b" / "requests.csv").write_text("sent_s,finish_s\n0,1\n")
    with pytest.raises(GapFitError, match="not a measured vLLM run"):
        run_terms(tmp_path / "b")


def vllm_table(gap: dict | None = None, constant: float | None = None) -> LatencyTable:
    table = LatencyTable.load(resolve_profile("vllm-cpu-smollm2"))
    meta = {k: v for k, v in table.meta.items() if k not in ("iteration_gap", "iteration_gap_s")}
    if gap is not None:
        meta["iteration_gap"] = gap
    if constant is not None:
        meta["iteration_gap_s"] = constant
    return LatencyTable(table.rows, meta)


def test_a_profile_carries_its_fitted_gap_into_the_simulator():
    gap = {"fixed_s": FIXED, "per_request_s": PER_REQUEST, "speculative_step_s": SPEC_STEP}
    latency = ProfiledLatency.with_host_time(vllm_table(gap, constant=0.0028))
    host = latency.step_overhead_s(np.array([0, 1, 10, 10]), np.array([0, 0, 0, 3]))
    assert host.tolist() == pytest.approx([0.0, FIXED + PER_REQUEST, FIXED + 10 * PER_REQUEST,
                                           FIXED + 10 * PER_REQUEST + SPEC_STEP])
    assert latency.step_overhead_s(10, 3) == pytest.approx(host[3])
    assert latency.step_overhead_s(10) == pytest.approx(host[2])
    # the profile session's constant where no fit exists; nothing where neither does
    assert ProfiledLatency.with_host_time(vllm_table(constant=0.0028)).step_overhead_s(5, 2) \
        == 0.0028
    assert ProfiledLatency.with_host_time(vllm_table()).step_overhead_s(5, 2) == 0.0
    with pytest.raises(ConfigError, match="must hold fixed_s"):
        ProfiledLatency.with_host_time(vllm_table({"fixed_s": 0.001}))


def test_profile_gap_from_writes_the_fit_into_the_profile(tmp_path, capsys):
    rng = np.random.default_rng(2)
    for i, (batch, drafts) in enumerate([(1, 0), (6, 0), (2, 3), (10, 2)]):
        write_run(tmp_path / "runs" / f"r{i}", list(rng.integers(1, 2 * batch + 1, 40)), drafts,
                  rng=rng)
    profile = tmp_path / "profile"
    shutil.copytree(resolve_profile("vllm-cpu-smollm2").parent, profile)
    assert main(["profile", "--engine", "vllm", "--gap-from", str(tmp_path / "runs"),
                 "--out", str(profile)]) == 0
    assert "0.060 ms per request + 0.60 ms when the step verifies drafts" in capsys.readouterr().out
    written = json.loads((profile / "latency.meta.json").read_text())["iteration_gap"]
    assert written["runs"] == 4 and written["fitted_on"] == [str(tmp_path / "runs")]
    assert written["fixed_s"] == pytest.approx(FIXED, rel=1e-6)


def test_profile_gap_from_refuses_what_it_cannot_use(tmp_path, capsys):
    assert main(["profile", "--gap-from", str(tmp_path), "--out", str(tmp_path / "p")]) != 0
    assert "add --engine vllm" in capsys.readouterr().err
    assert main(["profile", "--engine", "vllm", "--gap-from", str(tmp_path),
                 "--out", str(tmp_path / "p")]) != 0
    assert "no vLLM profile there" in capsys.readouterr().err

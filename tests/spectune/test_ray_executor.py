"""`--executor ray`: tune and plan give the results local processes give, through the same
cache; bad flags and addresses fail in seconds with one line; Ctrl-C and a driver killed
outright leave no Ray process behind. Runs a real local Ray (the `ray` extra)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import terminal_sigint

from spectune import evaluate
from spectune.cli import main
from spectune.files import without_keys

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")

REPO = Path(__file__).resolve().parents[2]
TUNE = ["tune", "--workload", "poisson", "--requests", "60", "--lengths", "fixed:200,60",
        "--acceptance", "beta:7,3", "--rates", "4", "30", "--policies", "fixed,goodput",
        "--seeds", "2", "--points", "2", "--no-report"]
PLAN = ["plan", "--requests", "60", "--slo-ttft", "1", "--slo-tpot", "0.03", "--policies",
        "fixed:k=0,fixed:k=4", "--tolerance", "0.1"]
#: how the simulations were dispatched and how long they took: not results
NOT_RESULTS = {"wall_s", "engine_s", "created", "reused_from_cache", "executor", "ray_address",
               "jobs"}


def results(path: Path):
    return without_keys(json.loads(path.read_text()), NOT_RESULTS)


@pytest.mark.parametrize("argv", [TUNE, PLAN], ids=["tune", "plan"])
def test_ray_gives_what_local_processes_give_through_the_same_cache(argv, tmp_path,
                                                                    monkeypatch):
    name = argv[0]
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert main([*argv, "--jobs", "2", "--out", str(local)]) == 0
    assert main([*argv, "--executor", "ray", "--out", str(on_ray)]) == 0
    assert results(on_ray / f"{name}.json") == results(local / f"{name}.json")
    # Ray's results are cached as local ones are: the same entries, and a local rerun reads
    # every one back without simulating anything
    entries = sorted(p.name for p in (on_ray / "evals").glob("*.json"))
    assert entries and entries == sorted(p.name for p in (local / "evals").glob("*.json"))

    def no_simulation(task, keep_records=False):
        raise AssertionError(f"simulated again: {task.candidate.label} at {task.rate}")

    monkeypatch.setattr(evaluate, "evaluate", no_simulation)
    assert main([*argv, "--jobs", "1", "--out", str(on_ray)]) == 0
    assert results(on_ray / f"{name}.json") == results(local / f"{name}.json")


def test_bad_executor_flags_fail_at_once_with_one_line(tmp_path, capsys, monkeypatch):
    out = ["--out", str(tmp_path / "t")]
    assert main([*TUNE, "--ray-address", "127.0.0.1:6379", *out]) != 0
    assert "add --executor ray" in capsys.readouterr().err
    assert main([*TUNE, "--executor", "dask", *out]) != 0
    assert "--executor must be local or ray" in capsys.readouterr().err
    started = time.monotonic()
    assert main([*TUNE, "--executor", "ray", "--ray-address", "127.0.0.1:1", *out]) != 0
    err = capsys.readouterr().err
    assert "no Ray there" in err and "ray start --head" in err
    assert time.monotonic() - started < 30  # Ray itself would retry for minutes
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    assert main([*TUNE, "--executor", "ray", *out]) != 0
    assert "pip install -e '.[ray]'" in capsys.readouterr().err


def _start(out: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "spectune", "tune", "--requests", "300", "--rates", "4",
               "12", "24", "--seeds", "3", "--executor", "ray", "--no-report", "--out", str(out)]
    return subprocess.Popen(command, cwd=out.parent, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=terminal_sigint)


def _session(proc: subprocess.Popen) -> list[str]:
    """The live (not zombie) processes of the run's session, as ps lists them."""
    ps = subprocess.run(["ps", "-o", "stat=,args=", "--sid", str(proc.pid)],
                        capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line and not line.lstrip().startswith("Z")]


def _wait_for_results(proc: subprocess.Popen, out: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list((out / "evals").glob("*.json"))) >= 2:
            return
        time.sleep(0.1)
    raise AssertionError(f"no results cached within {timeout_s} s (exit code {proc.poll()})")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_sweep_and_ray_with_one_line(tmp_path):
    proc = _start(tmp_path / "out")
    _wait_for_results(proc, tmp_path / "out")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    assert proc.returncode == 130
    assert "interrupted;" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err
    time.sleep(1)
    assert _session(proc) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_driver_killed_outright_takes_its_ray_with_it(tmp_path):
    proc = _start(tmp_path / "out")
    _wait_for_results(proc, tmp_path / "out")
    assert len(_session(proc)) > 3  # the driver, Ray's servers, agents and workers
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while _session(proc) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _session(proc)
    if left:
        subprocess.run(["pkill", "-9", "-s", str(proc.pid)])
    assert left == []

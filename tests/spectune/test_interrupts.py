"""Stopping a run: Ctrl-C prints one line (how much is cached, how to resume) and exits 130 with no
traceback and no worker left behind; a parent killed outright takes its workers with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import terminal_sigint

from simulator import SchedulerConfig
from spectune import evaluate
from spectune.cli import main
from spectune.evaluate import Interrupted, Runner, Task
from spectune.search import Candidate
from spectune.simulate import SimulationSpec

REPO = Path(__file__).resolve().parents[2]
#: a tune of ~20+ s on two cores: long enough to be stopped in the middle
LONG_TUNE = ["tune", "--requests", "300", "--rates", "4", "12", "24", "--seeds", "3",
             "--jobs", "2", "--no-report"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _start_tune(out: Path) -> subprocess.Popen:
    """The tune in a session of its own, as a terminal runs a foreground job."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-X", "faulthandler", "-m", "spectune", *LONG_TUNE,
               "--out", str(out)]
    return subprocess.Popen(command, cwd=out.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=terminal_sigint)


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever adopted it, is not alive)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _wait_for_workers(proc: subprocess.Popen, out: Path, timeout_s: float = 30) -> list[int]:
    """The tune's two workers, once at least one result is cached."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        kids = _children(proc.pid)
        if len(kids) == 2 and any((out / "evals").glob("*.json")):
            return kids
        time.sleep(0.1)
    raise AssertionError(f"no workers and cached result within {timeout_s} s "
                         f"(exit code {proc.poll()})")


def _stacks(proc: subprocess.Popen) -> str:
    """Every thread's Python stack of a hung `proc` (faulthandler prints them on SIGABRT) and
    the processes of its session: what a failure needs to be debugged after the fact."""
    tree = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,args", "--sid", str(proc.pid)],
                          capture_output=True, text=True).stdout
    os.kill(proc.pid, signal.SIGABRT)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        err = "(no stacks: it did not die of SIGABRT within 10 s either)"
    return f"its session:\n{tree}\nstderr:\n{err[-6000:]}"


@contextlib.contextmanager
def _tune_process(out: Path):
    """A running long tune; whatever the test's outcome, it and its workers are gone after."""
    proc = _start_tune(out)
    kids: list[int] = []
    try:
        kids += _wait_for_workers(proc, out)
        yield proc, kids
    finally:  # workers first: they hold the pipes communicate() reads to the end
        for pid in kids:
            with contextlib.suppress(OSError):
                if _alive(pid) and b"spectune" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_ctrl_c_in_a_tune_prints_one_line_and_leaves_no_worker(tmp_path):
    out = tmp_path / "run"
    with _tune_process(out) as (proc, workers):
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the tune did not stop within 20 s of Ctrl-C; where it hung:\n"
                        + _stacks(proc))
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("interrupted"), err
        cached = len(list((out / "evals").glob("*.json")))
        assert f"; {cached} of " in lines[0] and str(out / "evals") in lines[0]
        assert "rerun" in lines[0]
        assert [w for w in workers if _alive(w)] == []


def test_workers_die_with_a_parent_killed_outright(tmp_path):
    with _tune_process(tmp_path / "run") as (proc, workers):
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 3
        while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [w for w in workers if _alive(w)] == []


def _task(seed: int) -> Task:
    return Task(SimulationSpec(workload="poisson", lengths="fixed:50,20", requests=20),
                SchedulerConfig(), Candidate("fixed", (("k", 2),)), rate=4.0, seed=seed)


def test_the_runner_says_how_much_is_cached_when_interrupted(tmp_path, monkeypatch):
    real = evaluate.evaluate

    def stop_at_seed_2(task: Task, keep_records: bool = False):
        if task.seed == 2:
            raise KeyboardInterrupt
        return real(task, keep_records)

    monkeypatch.setattr(evaluate, "evaluate", stop_at_seed_2)
    with pytest.raises(Interrupted) as caught, Runner(tmp_path, jobs=1) as runner:
        runner.run([_task(s) for s in range(4)])
    assert (caught.value.done, caught.value.total, caught.value.cache_dir) == (2, 4, tmp_path)
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_ctrl_c_in_simulate_is_one_line_and_exit_130(monkeypatch, capsys):
    import spectune.simulate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(spectune.simulate, "run", interrupted)
    try:
        code = main(["simulate", "--requests", "10"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped main() (a traceback for the user)")
    assert code == 130
    captured = capsys.readouterr()
    assert captured.err == "interrupted\n" and captured.out == ""

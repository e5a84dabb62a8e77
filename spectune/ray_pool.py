"""Simulations as Ray tasks: `--executor ray` for tune and plan.

Each simulation is one task of 1 CPU; the driver keeps the content-keyed cache (every result is
stored as it arrives, so an interrupted sweep resumes from what finished), so a Ray sweep and a
local one read and write the same entries. Without an address, Ray starts on this machine and
stops with the run; with one, the run joins that cluster and leaves it running. The nodes need
spectune installed and the run's input files at the same paths (tasks run in the driver's
working directory). Measured: benchmarks/ray_sweep.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence

from simulator import ConfigError

INSTALL = "pip install -e '.[ray]'"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--executor ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def _evaluate_in(cwd: str, evaluate: Callable[[object], dict], task: object) -> dict:
    """One simulation (`evaluate(task)`) on a Ray worker, in the driver's working directory
    (relative input paths mean what they meant to the driver)."""
    try:
        os.chdir(cwd)
    except OSError:
        raise ConfigError(f"Ray node {os.uname().nodename}: no folder {cwd}; every node needs "
                          f"the run's inputs at the driver's paths") from None
    return evaluate(task)


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on an address nothing listens at (Ray itself retries for minutes)."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("ray://") or "127.0.0.1"
    if not port.isdigit():
        raise ConfigError(f"--ray-address {address!r}: expected HOST:PORT, as ray start --head "
                          f"prints it")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"--ray-address {address}: no Ray there ({err.strerror or err}); "
                          f"start one with: ray start --head --port {port}") from None


class RayPool:
    """Ray, initialised once per runner: a local instance (started here, stopped by close) or
    the cluster at `address` (joined, left running)."""

    def __init__(self, address: str | None, evaluate: Callable[[object], dict]) -> None:
        self.ray = _import_ray()
        self.evaluate = evaluate
        self.address = address
        self._pending: list = []
        if address is not None:
            reachable(address)
        try:
            self.ray.init(address=address, include_dashboard=False, log_to_driver=False,
                          logging_level="ERROR", configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            if address is None:
                raise ConfigError(f"--executor ray: cannot start Ray on this machine ({err})"
                                  ) from None
            raise ConfigError(f"--executor ray: cannot join the Ray cluster at {address} "
                              f"({err}); a cluster that ray start --head started uses token "
                              f"authentication: set RAY_AUTH_MODE=token, with its token in "
                              f"~/.ray/auth_token or RAY_AUTH_TOKEN (docs/ray.md)") from None
        self._remote = self.ray.remote(num_cpus=1, max_retries=0)(_evaluate_in)
        # the Ray this run started must not outlive it, even killed outright (SIGKILL)
        self._reaper = _Reaper() if address is None else None

    def run(self, tasks: Sequence[object], done: Callable[[int, dict], None]) -> None:
        """Submit every task, then hand each result to `done(index, metrics)` as it finishes."""
        ray = self.ray
        cwd = os.getcwd()
        index = {}
        for i, task in enumerate(tasks):
            ref = self._remote.remote(cwd, self.evaluate, task)
            index[ref] = i
            self._pending.append(ref)
        while self._pending:
            ready, self._pending = ray.wait(self._pending, num_returns=1)
            try:
                metrics = ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:  # the task's own error, as if local
                cause = getattr(err, "cause", None)
                if isinstance(cause, Exception):
                    raise cause from None
                raise
            done(index[ready[0]], metrics)

    def abort(self) -> None:
        """Leave Ray now (stopping it if this run started it); Ray ends a departed driver's
        tasks. Not ray.cancel: forcing a task that is just completing crashes Ray 2.60's core
        ("Tried to complete task that was not pending", 1 Ctrl-C in 4 here)."""
        self._pending = []
        self.close()

    def close(self) -> None:
        if self.ray.is_initialized():
            self.ray.shutdown()
        if self._reaper is not None:
            self._reaper.release()
            self._reaper = None


class _Reaper:
    """spectune/ray_reaper.py, watching this process: the Ray it started dies with it, even
    when it is killed outright."""

    def __init__(self) -> None:
        self._proc = None
        if sys.platform.startswith("linux"):
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "spectune.ray_reaper", str(os.getpid())],
                stdin=subprocess.PIPE, text=True, start_new_session=True)

    def release(self) -> None:
        """Ray was shut down: the reaper exits without killing anything."""
        if self._proc is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self._proc.communicate("done\n", timeout=5)
            self._proc = None

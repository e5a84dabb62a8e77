"""One simulation per (policy setting, request rate, seed), cached on disk and run in parallel.

Seeds are real replicates, not one run three times: a trace workload serves another window of
the trace per seed, a synthetic one draws its arrivals and lengths from it, and acceptance is
drawn from it or assigned from a recording in a seed-dependent order; every candidate sees the
same seeds, so differences are paired. Each evaluation is one JSON file named by the hash of the
contents (not names) of everything that determines it, code version included, so an interrupted
tune resumes and an edited input is recomputed. Details: docs/tune-cache.md.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator import ConfigError, SchedulerConfig, kernels
from spectune import contents
from spectune.search import Candidate
from spectune.simulate import (
    SYNTHETIC,
    SimulationSpec,
    build_acceptance,
    build_latency,
    build_slo,
    build_workload,
    load_trace,
    trace_window,
)
from traces import SpeculationTrace

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

#: the flat metrics kept per evaluation (seconds, tokens/s, counts)
METRICS = ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s", "tpot_p50_s", "tpot_p99_s",
           "e2e_mean_s", "e2e_p50_s", "e2e_p99_s", "throughput_tokens_per_s", "mean_k",
           "mean_emitted_per_step", "mean_batch_size", "slo_attainment", "goodput_tokens_per_s")


@dataclass(frozen=True)
class Task:
    """Everything one evaluation depends on."""

    scenario: SimulationSpec  # workload, models, acceptance, SLOs (its rate/seed/policy unused)
    scheduler: SchedulerConfig
    candidate: Candidate
    rate: float
    seed: int

    def key(self) -> str:
        """The cache key: names and numbers, plus the contents they stand for (files, catalog
        entries, code), so that editing any of them changes the key."""
        blob = json.dumps([asdict(self.scenario), asdict(self.scheduler), self.candidate.policy,
                           [list(p) for p in self.candidate.params], self.rate, self.seed,
                           contents.input_contents(self.scenario), contents.code_version()],
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


def flat_metrics(summary: dict) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in ("ttft", "tpot", "e2e"):
        for q in ("mean", "p50", "p99"):
            out[f"{name}_{q}_s"] = summary[f"{name}_s"][q]
    for key in ("throughput_tokens_per_s", "mean_k", "mean_batch_size", "slo_attainment",
                "goodput_tokens_per_s"):
        out[key] = summary.get(key)
    out["mean_emitted_per_step"] = summary["mean_emitted_per_step"]
    return {k: (None if v is None or not np.isfinite(v) else float(v)) for k, v in out.items()}


def _whole_trace(workload: str):
    """A whole trace workload, loaded once per process and version of its file."""
    return _load_trace(workload, contents.file_or_none(workload))


@functools.lru_cache(maxsize=4)
def _load_trace(workload: str, digest: str | None):
    """(`digest` keys the cache only: an edited file is loaded again, not served from here.)"""
    return load_trace(workload)


def _recording(name: str) -> SpeculationTrace | None:
    """A recorded speculation trace loaded once per process and version of its file; None for a
    parametric spec."""
    from traces.builtin import speculation_names

    if name in speculation_names() or name.endswith(".npz") or Path(name).exists():
        return _load_recording(name, contents.file_or_none(name))
    return None


@functools.lru_cache(maxsize=4)
def _load_recording(name: str, digest: str | None) -> SpeculationTrace:
    return build_acceptance(name, None, np.random.default_rng(0))  # type: ignore[arg-type]


def seeded_inputs(task: Task):
    """The simulation inputs of one (rate, seed): the windowed/rescaled workload, the latency
    model, the acceptance assigned in the seed's order, the KV capacity, the SLO."""
    scenario = replace(task.scenario, rate=task.rate, seed=task.seed)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(task.seed).spawn(3)]
    if scenario.workload not in SYNTHETIC:  # one window of the trace per seed, then the rate
        n = scenario.requests or 1000
        workload = trace_window(_whole_trace(scenario.workload), n, task.rate, task.seed * n)
    else:
        workload = build_workload(scenario, rngs[0])
    latency, kv = build_latency(scenario, task.scheduler)
    acceptance = _recording(scenario.acceptance)
    if acceptance is None:
        acceptance = build_acceptance(scenario.acceptance, workload, rngs[1])
    elif len(acceptance) > 1:
        order = rngs[2].permutation(len(acceptance))
        acceptance = SpeculationTrace(tuple(acceptance.requests[i] for i in order),
                                      acceptance.meta)
    return workload, latency, acceptance, kv, build_slo(scenario)


def evaluate(task: Task, keep_records: bool = False):
    """Simulate one task: its flat metrics (and the records when asked)."""
    from policies import make_policy
    from simulator import simulate, summarize

    workload, latency, acceptance, kv, slo = seeded_inputs(task)
    policy = make_policy(task.candidate.policy, task.candidate.params_dict)
    result = simulate(workload, latency, acceptance, policy, kv, task.scheduler,
                      keep_steps=keep_records)
    metrics = flat_metrics(summarize(result.requests, result.totals, slo))
    return (metrics, result) if keep_records else metrics


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, with what is saved: `done` of `total` results are in `cache_dir`
    (None: nothing is cached), so the command line can say how to resume in one line."""

    def __init__(self, done: int, total: int, cache_dir: Path | None) -> None:
        super().__init__(done, total, cache_dir)
        self.done, self.total, self.cache_dir = done, total, cache_dir


EXECUTORS = ("local", "ray")
EXECUTOR_HELP = ("local (worker processes on this machine) or ray (every simulation a Ray task "
                 "of 1 CPU: a local Ray, or the cluster at --ray-address; pip install -e '.[ray]')")
RAY_ADDRESS_HELP = ("a Ray cluster's address (HOST:PORT, as ray start --head prints) for "
                    "--executor ray")


def check_executor(executor: str, ray_address: str | None) -> None:
    """The --executor and --ray-address flags, checked before any work."""
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be local or ray, got {executor!r}")
    if ray_address is not None and executor != "ray":
        raise ConfigError("--ray-address is where Ray runs the simulations: add --executor ray")


class Runner:
    """Runs tasks in parallel over `jobs` processes, or as Ray tasks (`executor` "ray", on the
    cluster at `ray_address` or a local Ray: spectune/ray_pool.py), answering from `cache_dir`
    what is done.

    Ctrl-C (KeyboardInterrupt) inside run() or the `with` block tears the pool down at once
    (pending tasks cancelled, workers terminated) and is raised again as `Interrupted`."""

    def __init__(self, cache_dir: Path | None, jobs: int = 0,
                 progress: Callable[[int, int], None] | None = None, executor: str = "local",
                 ray_address: str | None = None) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
        self.progress = progress
        self.executor, self.ray_address = executor, ray_address
        self.done = self.total = self.cached = 0
        self._pool: ProcessPoolExecutor | None = None
        self._ray = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if kind is None:
            self.close()
            return
        self.abort()
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            raise self._interrupted() from exc

    def close(self) -> None:
        """Wait for the workers to finish and exit (the normal end of a run)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        ray, self._ray = self._ray, None
        if ray is not None:
            ray.close()

    def abort(self) -> None:
        """Stop now: cancel what has not started, terminate the workers (SIGTERM, then SIGKILL
        after a second), and wait for them, so none outlives the parent."""
        ray, self._ray = self._ray, None
        if ray is not None:
            ray.abort()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + 1.0
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(1.0)
        # the executor's manager thread closes its wake-up pipe as it ends; at interpreter exit
        # concurrent.futures writes to that pipe, and while the thread is still closing it the
        # write fails with EBADF and prints a traceback (a race in CPython 3.11): let it end
        manager = getattr(pool, "_executor_manager_thread", None)
        if manager is not None:
            manager.join(2.0)
            if manager.is_alive():  # its workers are dead: never let the exit hook wait on it
                from concurrent.futures import process as futures_process

                getattr(futures_process, "_threads_wakeups", {}).pop(manager, None)

    def _interrupted(self) -> Interrupted:
        return Interrupted(self.done, self.total, self.cache_dir)

    def _workers(self, first: Task) -> ProcessPoolExecutor:
        """One pool for the runner's life, forked after the parent has loaded the trace and
        the recording once (the workers inherit them instead of each loading its own). The
        workers ignore Ctrl-C (the parent handles it) and die with the parent (_worker_init)."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            import simulator.engine  # noqa: F401  (imported once here: the workers inherit it)

            seeded_inputs(first)  # fill the per-process caches before forking
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else None)
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=context,
                                             initializer=_worker_init, initargs=(os.getpid(),))
        return self._pool

    def _path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{key}.json"

    def _load(self, key: str) -> dict | None:
        path = self._path(key)
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())["metrics"]
        except (OSError, ValueError, KeyError):
            return None  # a damaged entry is recomputed

    def _store(self, key: str, task: Task, metrics: dict) -> None:
        from spectune.files import write_json

        path = self._path(key)
        if path is not None:
            write_json(path, {"task": {"candidate": task.candidate.label, "rate": task.rate,
                                       "seed": task.seed}, "metrics": metrics})

    def run(self, tasks: Sequence[Task]) -> list[dict]:
        """Metrics per task, in order. The keys are taken once, before simulating, so a file
        edited meanwhile cannot file an old result under its new contents."""
        try:
            return self._run(tasks)
        except Interrupted:
            raise
        except KeyboardInterrupt as exc:
            self.abort()
            raise self._interrupted() from exc

    def _run(self, tasks: Sequence[Task]) -> list[dict]:
        keys = [t.key() for t in tasks]
        out: list[dict | None] = [self._load(k) for k in keys]
        # a task the batch holds twice (searches run together can ask for the same one) is
        # simulated once; each repeat counts as it would have a batch later, once this batch
        # is done (so an interrupted batch's count is the cache's: one file per simulation):
        # read from the cache where there is one, else simulated again
        first: dict[str, int] = {}
        repeats: dict[int, list[int]] = {}  # first index -> the repeats' indices
        for i, m in enumerate(out):
            if m is None:
                if keys[i] in first:
                    repeats.setdefault(first[keys[i]], []).append(i)
                else:
                    first[keys[i]] = i
        todo = list(first.values())
        repeated = sum(map(len, repeats.values()))
        loaded = len(tasks) - len(todo) - repeated
        self.cached += loaded
        self.total += len(tasks)
        self.done += loaded
        self._tick()

        def finished(i: int, metrics: dict) -> None:
            out[i] = self._finish(keys[i], tasks[i], metrics)
            for j in repeats.get(i, ()):
                out[j] = metrics

        if todo and self.executor != "ray":  # the compiled loops, where this batch repays
            # loading them: loaded here, before the workers fork, they inherit them
            from policies import make_policy
            from simulator.scheduler import scheduler_class
            from simulator.stepped import repays_loading

            requests = [tasks[i].scenario.requests or 0 for i in todo]
            repays_from = [repays_loading(make_policy(tasks[i].candidate.policy,
                                                      tasks[i].candidate.params_dict),
                                          scheduler_class(tasks[i].scheduler.scheduler)
                                          .plans_whole_step) for i in todo]
            # (exact shares: ten runs of 30 auto requests repay loading them, as one of 300)
            kernels.prepare(sum(requests), sum(Fraction(n, t)
                                               for n, t in zip(requests, repays_from) if t))
        if todo and self.executor == "ray":
            if self._ray is None:
                from spectune.ray_pool import RayPool

                self._ray = RayPool(self.ray_address, evaluate)
            self._ray.run([tasks[i] for i in todo], lambda j, metrics: finished(todo[j], metrics))
        elif len(todo) > 1 and self.jobs > 1:
            pool = self._workers(tasks[todo[0]])
            for i, metrics in zip(todo, pool.map(evaluate, [tasks[i] for i in todo])):
                finished(i, metrics)
        else:
            for i in todo:
                finished(i, evaluate(tasks[i]))
        if repeated:
            self.cached += repeated if self.cache_dir is not None else 0
            self.done += repeated
            self._tick()
        return out  # type: ignore[return-value]

    def map_here(self, fn: Callable, tasks: Sequence[Task], *per_task: Sequence) -> list:
        """`fn(task, *values)` for each task (and its values in `per_task`), in order, on this
        machine: over the worker pool where this runner has local workers, else one after
        another (a Ray runner's too: what `fn` writes must land here). For work that writes
        local files (tune's samples)."""
        if self.executor == "local" and self.jobs > 1 and len(tasks) > 1:
            return list(self._workers(tasks[0]).map(fn, tasks, *per_task))
        return [fn(*args) for args in zip(tasks, *per_task)]

    def _finish(self, key: str, task: Task, metrics: dict) -> dict:
        self._store(key, task, metrics)
        self.done += 1
        self._tick()
        return metrics

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _worker_init(parent: int) -> None:
    """In each worker: leave Ctrl-C to the parent (a terminal sends SIGINT to the whole process
    group; the parent tears the pool down, and the workers print no tracebacks), and die with
    the parent even when it is killed outright (kill -9 leaves no chance to terminate them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="spectune-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _death_signal() -> bool:
    """Linux: have the kernel SIGKILL this process when its parent dies (prctl
    PR_SET_PDEATHSIG). Strictly, when the parent's thread that forked it exits: the pool forks
    from the thread that first calls run(), the main thread of the command line. False where
    unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, every_s: float = 0.5) -> None:
    """Elsewhere: poll the parent; once it is gone (this process was re-parented), exit."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def progress_bar(label: str) -> Callable[[int, int], None] | None:
    """A bar on stderr, redrawn in place; None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None

    def draw(done: int, total: int) -> None:
        filled = int(30 * done / total) if total else 0
        print(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} simulations",
              end="", file=sys.stderr, flush=True)

    return draw

"""One simulation per (policy setting, request rate, seed), cached on disk and run in parallel.

What a seed changes, so that seeds are real replicates and not the same run three times:
- a trace workload (azure-conv, a file): seed i serves the i-th window of `requests` consecutive
  requests of the trace (rescaled to the rate), so each seed is another stretch of real traffic;
- a synthetic workload: its arrivals and lengths are drawn from the seed;
- acceptance: parametric models are drawn from the seed; a recorded trace is assigned to the
  workload's requests in a seed-dependent order.
Every candidate sees the same seeds (common random numbers), so their differences are paired.

Each evaluation is written as one JSON file named by the hash of everything that determines it,
atomically: an interrupted tune resumes where it stopped, and a rerun with other rates or
policies reuses what it shares.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from policies import make_policy
from simulator import SchedulerConfig, Slo, simulate, summarize
from spectune.search import Candidate
from spectune.simulate import (
    SYNTHETIC,
    SimulationSpec,
    build_acceptance,
    build_latency,
    build_workload,
)
from traces import SpeculationTrace, rescale_to_rate

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
        blob = json.dumps([asdict(self.scenario), asdict(self.scheduler), self.candidate.policy,
                           [list(p) for p in self.candidate.params], self.rate, self.seed],
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


@functools.lru_cache(maxsize=4)
def _whole_trace(scenario: SimulationSpec):
    """A whole trace workload, loaded once per process (every task of a tune shares it)."""
    from traces import builtin_names, builtin_workload, load_workload

    if scenario.workload in builtin_names():
        return builtin_workload(scenario.workload)
    return load_workload(scenario.workload)  # a file: trace workloads are built-in or files


@functools.lru_cache(maxsize=4)
def _recording(name: str) -> SpeculationTrace | None:
    """A recorded speculation trace loaded once per process; None for a parametric spec."""
    from traces.builtin import speculation_names

    if name in speculation_names() or name.endswith(".npz") or Path(name).exists():
        return build_acceptance(name, None, np.random.default_rng(0))  # type: ignore[arg-type]
    return None


def seeded_inputs(task: Task):
    """The simulation inputs of one (rate, seed): the windowed/rescaled workload, the latency
    model, the acceptance assigned in the seed's order, the KV capacity, the SLO."""
    scenario = replace(task.scenario, rate=task.rate, seed=task.seed)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(task.seed).spawn(3)]
    if scenario.workload not in SYNTHETIC:  # one window of the trace per seed, then the rate
        n = scenario.requests or 1000
        whole = _whole_trace(replace(task.scenario, rate=None, seed=0))
        workload = rescale_to_rate(whole.window(task.seed * n, n), task.rate)
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
    return workload, latency, acceptance, kv, slo_of(scenario)


def evaluate(task: Task, keep_records: bool = False):
    """Simulate one task: its flat metrics (and the records when asked)."""
    workload, latency, acceptance, kv, slo = seeded_inputs(task)
    policy = make_policy(task.candidate.policy, task.candidate.params_dict)
    result = simulate(workload, latency, acceptance, policy, kv, task.scheduler)
    metrics = flat_metrics(summarize(result.requests, result.steps, slo))
    return (metrics, result) if keep_records else metrics


def slo_of(scenario: SimulationSpec) -> Slo | None:
    if scenario.slo_ttft is None and scenario.slo_tpot is None:
        return None
    return Slo(ttft_s=scenario.slo_ttft, tpot_s=scenario.slo_tpot)


class Runner:
    """Runs tasks in parallel over `jobs` processes, answering from `cache_dir` what is done."""

    def __init__(self, cache_dir: Path | None, jobs: int = 0,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
        self.progress = progress
        self.done = self.total = self.cached = 0
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _workers(self, first: Task) -> ProcessPoolExecutor:
        """One pool for the runner's life, forked after the parent has loaded the trace and
        the recording once (the workers inherit them instead of each loading its own)."""
        if self._pool is None:
            import multiprocessing

            seeded_inputs(first)  # fill the per-process caches before forking
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else None)
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=context)
        return self._pool

    def _path(self, task: Task) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{task.key()}.json"

    def _load(self, task: Task) -> dict | None:
        path = self._path(task)
        if path is None or not path.is_file():
            return None
        try:
            return json.loads(path.read_text())["metrics"]
        except (OSError, ValueError, KeyError):
            return None  # a damaged entry is recomputed

    def _store(self, task: Task, metrics: dict) -> None:
        from spectune.files import write_json

        path = self._path(task)
        if path is not None:
            write_json(path, {"task": {"candidate": task.candidate.label, "rate": task.rate,
                                       "seed": task.seed}, "metrics": metrics})

    def run(self, tasks: Sequence[Task]) -> list[dict]:
        """Metrics per task, in order."""
        out: list[dict | None] = [self._load(t) for t in tasks]
        todo = [i for i, m in enumerate(out) if m is None]
        self.cached += len(tasks) - len(todo)
        self.total += len(tasks)
        self.done += len(tasks) - len(todo)
        self._tick()
        if len(todo) > 1 and self.jobs > 1:
            pool = self._workers(tasks[todo[0]])
            for i, metrics in zip(todo, pool.map(evaluate, [tasks[i] for i in todo])):
                out[i] = self._finish(tasks[i], metrics)
        else:
            for i in todo:
                out[i] = self._finish(tasks[i], evaluate(tasks[i]))
        return out  # type: ignore[return-value]

    def _finish(self, task: Task, metrics: dict) -> dict:
        self._store(task, metrics)
        self.done += 1
        self._tick()
        return metrics

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)


def progress_bar(label: str) -> Callable[[int, int], None] | None:
    """A bar on stderr, redrawn in place; None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None

    def draw(done: int, total: int) -> None:
        filled = int(30 * done / total) if total else 0
        print(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} simulations",
              end="", file=sys.stderr, flush=True)

    return draw

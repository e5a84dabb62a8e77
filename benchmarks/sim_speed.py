"""How fast the simulator runs: wall time, simulated requests/s and iterations/s.

First table: the Azure conversation trace's (prompt, output) lengths, Poisson arrivals at 2
req/s, one replica, roofline Llama-3.1-8B + Llama-68M on H100-SXM, acceptance iid:0.7, fixed
k=0 and k=4, for 1k, 10k and 100k requests. Columns:
  build_s   workload + acceptance trace generation
  engine_s  the SimPy run (arrivals, scheduling, step costs, acceptance replay)
  records_s turning the logs into DataFrames
  total_s   all three (what `spectune simulate` spends, less imports and printing)
Second table (`--recorded N`): what `tune` runs, the shipped n-gram recording (its lookup's
proposal caps included) on a model-free draft at 8 req/s, per policy, with the fast path and
one iteration at a time side by side (us/iter: engine time per simulated iteration).
Third table (`--targets`): the scale issue's targets side by side, each measured here, in one
run: 10k-request recorded-trace runs (fixed k=4 and goodput, 8 req/s) by engine time and by
the wall of the `spectune simulate` command; 100k of them (fixed k=4) by engine time; the
default `spectune tune` by its wall on every core. `--target-requests N` scales the rows (N,
10N; the tune row then runs N/33 requests per seed instead of its default 300).
Fourth table (`--every-policy N`): every registered policy with its defaults (fixed: k=4) on
the path the simulator takes for it (fast: segments; runs: compiled runs of steps, auto's and
kld_variance's; step: one iteration at a time), on the shipped n-gram recording and on a
parametric acceptance, N requests at 8 req/s, and whether it meets the scale issue's 10 us per
simulated iteration.
Fourth table's companion (`--every-scheduler N`): every registered policy with its defaults on
the shipped n-gram recording (kld_variance, which reads KL, on beta:7,3~20), model-free, 8
req/s, under chunked prefill (a 2,048-token budget) and under vLLM's scheduler, the path it
takes there and whether it meets 10 us.
Fifth table (`--paths N`): us per simulated iteration on each path a run can take (chunked
prefill, vllm-v1, replicas, a draft model after capped, folded-stop or walked steps, a policy
that holds its k under chunked prefill and vllm-v1), N requests per replica at 8 and 20 req/s
per replica (the batch column: how full it runs).
Sixth table (`--profiles N`): us per simulated iteration on the shipped profiles (the CPU
SmolLM2 engine's with its early-exit draft, vLLM-CPU's with the n-gram lookup and its
scheduler) at a light load and at three times it, the fast path beside one iteration at a
time, and how far apart their mean E2E is.
Seventh table (`--planners N`): us per simulated iteration of the policies that price a step's
alternatives through the cost model, with the Llama-68M draft model (beta:7,3~20, 8 req/s).
Eighth table (`--compiled N`): the fifth table's paths with the per-request loops in numpy and
compiled (simulator/compiled.py), side by side, and their ratio.
`--loops` says which per-request loops the in-process tables run (simulator/kernels.py):
`numba` by default, loaded once before the tables (the time it took is printed), so the
tables give the simulator's cost per iteration whatever a run's length; `auto` as a user's
runs choose (compiled from 20,000 requests, or once loaded); `numpy`. The targets' CLI rows
run as a user's command does (`auto`).
Run on a quiet machine: `python benchmarks/sim_speed.py [--sizes 1000 10000 100000]`.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: time numpy single-threaded
# this folder holds benchmarks/policies.py, which would shadow the `policies` package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from policies import make_policy, policy_names  # noqa: E402
from simulator import ClusterConfig, SchedulerConfig, kernels, summarize  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from spectune.simulate import SimulationSpec, build_inputs  # noqa: E402


def measure(n: int, k: int, acceptance: str = "iid:0.7", rate: float = 2.0,
            policy: str = "fixed", fast_path: bool = True, draft: str | None = None,
            scheduler: SchedulerConfig | None = None, replicas: int = 1,
            profile: str | None = None, policy_params: dict | None = None) -> dict:
    spec = SimulationSpec(workload="poisson", rate=rate, requests=n, lengths="azure-conv",
                          acceptance=acceptance, seed=0, draft=draft, profile=profile)
    params = {"k": k} if policy == "fixed" else {}
    scheduler = scheduler or SchedulerConfig()
    t0 = time.perf_counter()
    inputs = build_inputs(spec, {key: str(v) for key, v in params.items()}, scheduler)
    t1 = time.perf_counter()
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                      make_policy(policy, params if policy == "fixed" else policy_params or {}),
                      inputs.kv_capacity_tokens, scheduler,
                      ClusterConfig(replicas, "least-loaded"), fast_path=fast_path)
    t2 = time.perf_counter()
    summary = summarize(result.requests, result.steps)
    t3 = time.perf_counter()
    engine_s = result.meta["engine_s"]
    return {
        "requests": n, "k": k, "build_s": t1 - t0, "engine_s": engine_s,
        "records_s": (t2 - t1) - engine_s + (t3 - t2), "total_s": t3 - t0,
        "iterations": summary["iterations"], "mean_batch": summary["mean_batch_size"],
        "sim_seconds": summary["duration_s"], "fast_path": result.meta["fast_path"],
        "path": ("whole" if result.meta["whole_run"] else "fast" if result.meta["fast_path"]
                 else "runs" if result.meta["steps_at_once"] else "step"),
        "e2e_mean": summary["e2e_s"]["mean"],
    }


def _header(header: str) -> None:
    print(header)
    print("-" * len(header))


#: the second table's rows: (policy, k, fast path allowed)
RECORDED = (("fixed", 4, True), ("fixed", 4, False), ("batch_adaptive", 0, True),
            ("batch_adaptive", 0, False), ("goodput", 0, True))


def recorded_table(n: int, repeats: int) -> None:
    print(f"\n{n:,} requests, smollm2-ngram, model-free draft, 8 req/s "
          f"(times: median of {repeats}, rows interleaved)")
    _header(f"{'policy':>15} {'k':>2} {'path':>5} {'engine_s':>9} {'total_s':>8} "
            f"{'iterations':>11} {'us/iter':>8} {'batch':>6} {'mean E2E s':>11}")
    runs = {row: [] for row in RECORDED}
    for _ in range(repeats):  # interleaved, so that the machine's drift spreads over every row
        for row in RECORDED:
            policy, k, fast = row
            runs[row].append(measure(n, k, "smollm2-ngram", 8.0, policy, fast, draft="none"))
    for (policy, k, _), results in runs.items():
        r = dict(results[0])
        r["engine_s"] = float(np.median([x["engine_s"] for x in results]))
        r["total_s"] = float(np.median([x["total_s"] for x in results]))
        print(f"{policy:>15} {k if policy == 'fixed' else '':>2} {r['path']:>5} "
              f"{r['engine_s']:>9.2f} {r['total_s']:>8.2f} {r['iterations']:>11,} "
              f"{r['engine_s'] / r['iterations'] * 1e6:>8.1f} {r['mean_batch']:>6.2f} "
              f"{r['e2e_mean']:>11.6f}", flush=True)


#: the fourth table's acceptance sources: the shipped n-gram recording (proposal caps, draft
#: signals) and a parametric one (the only one with the KL that kld_variance reads)
EVERY_ACCEPTANCE = ("smollm2-ngram", "beta:7,3~20")
#: the scale issue's target per simulated iteration
TARGET_US = 10.0


def every_policy_table(n: int, repeats: int) -> None:
    """Every registered policy's us per simulated iteration, on the path it takes."""
    print(f"\n{n:,} requests per run, every policy with its defaults (fixed: k=4), model-free "
          f"draft, 8 req/s (times: median of {repeats}, rows interleaved)")
    _header(f"{'policy':>15} {'acceptance':>14} {'path':>5} {'engine_s':>9} "
            f"{'iterations':>11} {'us/iter':>8} {'batch':>6} {'<= 10 us':>9}")
    rows = [(policy, acceptance) for acceptance in EVERY_ACCEPTANCE for policy in policy_names()]
    runs: dict[tuple[str, str], list[dict] | str] = {row: [] for row in rows}
    for _ in range(repeats):
        for row in rows:
            if isinstance(runs[row], str):
                continue
            policy, acceptance = row
            try:
                runs[row].append(measure(n, 4, acceptance, 8.0, policy, draft="none"))
            except ConfigError as e:
                if "needs signals" not in str(e):
                    raise
                runs[row] = f"n/a: {str(e).split(';')[0]}"  # a signal this source lacks
    for (policy, acceptance), results in runs.items():
        if isinstance(results, str):
            print(f"{policy:>15} {acceptance:>14}  {results}", flush=True)
            continue
        r = results[0]
        engine_s = float(np.median([x["engine_s"] for x in results]))
        us = engine_s / r["iterations"] * 1e6
        print(f"{policy:>15} {acceptance:>14} {r['path']:>5} "
              f"{engine_s:>9.2f} {r['iterations']:>11,} {us:>8.1f} {r['mean_batch']:>6.2f} "
              f"{'yes' if us <= TARGET_US else 'no':>9}", flush=True)


#: the schedulers of the every-scheduler table (the fourth's rows are the default fcfs-reserve)
EVERY_SCHEDULER = (("chunked prefill", SchedulerConfig(chunked_prefill=True,
                                                       max_batched_tokens=2048)),
                   ("vllm-v1", SchedulerConfig(scheduler="vllm-v1")))


def every_scheduler_table(n: int, repeats: int) -> None:
    """Every registered policy's us per simulated iteration under chunked prefill and vLLM's
    scheduler, on the path it takes there."""
    print(f"\n{n:,} requests per run, every policy with its defaults (fixed: k=4), model-free "
          f"draft, 8 req/s, under chunked prefill (budget 2,048) and vLLM's scheduler (times: "
          f"median of {repeats}, rows interleaved)")
    _header(f"{'policy':>15} {'acceptance':>14} {'scheduler':>16} {'path':>5} {'engine_s':>9} "
            f"{'iterations':>11} {'us/iter':>8} {'batch':>6} {'<= 10 us':>9}")
    # the n-gram recording, but for the policy that reads KL, which it lacks
    rows = [(policy, "beta:7,3~20" if policy == "kld_variance" else "smollm2-ngram", i)
            for i in range(len(EVERY_SCHEDULER)) for policy in policy_names()]
    runs: dict[tuple[str, str, int], list[dict]] = {row: [] for row in rows}
    for _ in range(repeats):
        for policy, acceptance, i in rows:
            runs[(policy, acceptance, i)].append(measure(
                n, 4, acceptance, 8.0, policy, draft="none", scheduler=EVERY_SCHEDULER[i][1]))
    for (policy, acceptance, i), results in runs.items():
        r = results[0]
        engine_s = float(np.median([x["engine_s"] for x in results]))
        us = engine_s / r["iterations"] * 1e6
        print(f"{policy:>15} {acceptance:>14} {EVERY_SCHEDULER[i][0]:>16} "
              f"{r['path']:>5} {engine_s:>9.2f} "
              f"{r['iterations']:>11,} {us:>8.1f} {r['mean_batch']:>6.2f} "
              f"{'yes' if us <= TARGET_US else 'no':>9}", flush=True)


#: the planners' table: the policies that price a step's alternatives through the cost model,
#: with its parameters; run with a draft model, whose passes `StepCostModel.steps_s` prices at
#: once from four alternatives on
PLANNERS = (("auto", {}), ("goodput", {}), ("goodput", {"per_request": "true"}),
            ("batch_adaptive", {}), ("oracle", {"knows": "probabilities"}))


def planners_table(n: int, repeats: int) -> None:
    """The planners' us per simulated iteration with a draft model (Llama-68M, the default)."""
    print(f"\n{n:,} requests per run, the planners with the Llama-68M draft model, "
          f"beta:7,3~20, 8 req/s (times: median of {repeats}, rows interleaved)")
    _header(f"{'policy':>26} {'engine_s':>9} {'iterations':>11} {'us/iter':>8} {'batch':>6}")
    runs: dict[int, list[dict]] = {i: [] for i in range(len(PLANNERS))}
    for _ in range(repeats):
        for i, (policy, params) in enumerate(PLANNERS):
            runs[i].append(measure(n, 4, "beta:7,3~20", 8.0, policy, policy_params=params))
    for i, (policy, params) in enumerate(PLANNERS):
        results = runs[i]
        engine_s = float(np.median([x["engine_s"] for x in results]))
        name = policy + "".join(f"/{key}={value}" for key, value in params.items())
        print(f"{name:>26} {engine_s:>9.2f} {results[0]['iterations']:>11,} "
              f"{engine_s / results[0]['iterations'] * 1e6:>8.1f} "
              f"{results[0]['mean_batch']:>6.2f}", flush=True)


#: the fifth table's rows: (path, acceptance, draft, policy, scheduler, replicas); the rate
#: is per replica
CHUNKED = SchedulerConfig(chunked_prefill=True, max_batched_tokens=2048)
PATHS = (
    ("one replica", "smollm2-ngram", "none", "fixed", SchedulerConfig(), 1),
    ("chunked prefill", "smollm2-ngram", "none", "fixed", CHUNKED, 1),
    ("vllm-v1", "smollm2-ngram", "none", "fixed", SchedulerConfig(scheduler="vllm-v1"), 1),
    ("3 replicas", "smollm2-ngram", "none", "fixed", SchedulerConfig(), 3),
    ("draft model", "beta:7,3~20", "Llama-68M", "fixed", SchedulerConfig(), 1),
    ("n-gram caps + draft", "smollm2-ngram", "Llama-68M", "fixed", SchedulerConfig(), 1),
    ("folded stop + draft", "beta:7,3~20", "Llama-68M", "confidence", SchedulerConfig(), 1),
    ("walked + draft", "beta:7,3~20", "Llama-68M", "heuristic", SchedulerConfig(), 1),
    ("goodput, chunked", "smollm2-ngram", "none", "goodput", CHUNKED, 1),
    ("goodput, vllm-v1", "smollm2-ngram", "none", "goodput",
     SchedulerConfig(scheduler="vllm-v1"), 1),
)
PATH_RATES = (8.0, 20.0)
#: the compiled table's rows beside PATHS: a policy decided step by step, whose every step
#: runs compiled loops of its own (`auto`), model-free and with a draft model
STEPPED = (
    ("auto", "smollm2-ngram", "none", "auto", SchedulerConfig(), 1),
    ("auto + draft", "beta:7,3~20", "Llama-68M", "auto", SchedulerConfig(), 1),
)


def paths_table(n: int, repeats: int) -> None:
    """us per simulated iteration on each path a run can take (scheduler, replicas, drafter),
    at a light and a heavier load per replica: what grows with the batch is per-request work."""
    print(f"\n{n:,} requests per replica, fixed k=4 unless named, per-replica rates "
          f"{' and '.join(f'{r:g}' for r in PATH_RATES)} req/s (times: median of {repeats}, "
          "rows interleaved)")
    cells = [f"{'us/iter':>8} {'batch':>6}" for _ in PATH_RATES]
    _header(f"{'run':>20} {'policy':>10} {'path':>5} " + " ".join(cells))
    runs: dict[tuple, list[dict]] = {(row, rate): [] for row in PATHS for rate in PATH_RATES}
    for _ in range(repeats):
        for (name, acceptance, draft, policy, scheduler, replicas), rate in runs:
            runs[(name, acceptance, draft, policy, scheduler, replicas), rate].append(measure(
                n * replicas, 4, acceptance, rate * replicas, policy, draft=draft,
                scheduler=scheduler, replicas=replicas))
    for row in PATHS:
        line = f"{row[0]:>20} {row[3]:>10} "
        for i, rate in enumerate(PATH_RATES):
            results = runs[row, rate]
            r = results[0]
            us = float(np.median([x["engine_s"] for x in results])) / r["iterations"] * 1e6
            if i == 0:
                line += f"{r['path']:>5} "
            line += f"{us:>8.1f} {r['mean_batch']:>6.1f} "
        print(line.rstrip(), flush=True)


def compiled_table(n: int, repeats: int) -> None:
    """Each path's us per simulated iteration with the per-request loops in numpy and compiled,
    interleaved in this process (the compiled ones loaded before: their load is per process),
    and `auto`'s, whose steps run compiled loops of their own (STEPPED)."""
    print(f"\n{n:,} requests per replica, the paths above with the per-request loops in numpy "
          f"and compiled (times: median of {repeats}, rows interleaved)")
    cells = [f"{'numpy':>7} {'numba':>7} {'ratio':>6}" for _ in PATH_RATES]
    _header(f"{'run':>20} {'policy':>10} " + "  ".join(cells)
            + f"   (us/iter at {' and '.join(f'{r:g}' for r in PATH_RATES)} req/s)")
    chosen = os.environ.get("SPECTUNE_KERNELS")
    runs: dict[tuple, list[float]] = {}
    try:
        for _ in range(repeats):
            for row in PATHS + STEPPED:
                _, acceptance, draft, policy, scheduler, replicas = row
                for rate in PATH_RATES:
                    for loops in ("numpy", "numba"):
                        os.environ["SPECTUNE_KERNELS"] = loops
                        r = measure(n * replicas, 4, acceptance, rate * replicas, policy,
                                    draft=draft, scheduler=scheduler, replicas=replicas)
                        runs.setdefault((row, rate, loops), []).append(
                            r["engine_s"] / r["iterations"] * 1e6)
    finally:
        os.environ["SPECTUNE_KERNELS"] = chosen or "auto"
    for row in PATHS + STEPPED:
        line = f"{row[0]:>20} {row[3]:>10} "
        for rate in PATH_RATES:
            plain, fast = (float(np.median(runs[row, rate, loops])) for loops in ("numpy", "numba"))
            line += f" {plain:>7.1f} {fast:>7.1f} {fast / plain:>6.2f} "
        print(line.rstrip(), flush=True)


#: the sixth table's rows: (shipped profile, acceptance, policy, scheduler, rate): the CPU
#: engines' passes take milliseconds, so light loads (batch 4-8), and three times those
#: rates (batch 73-108: where segments last a few steps)
VLLM_CPU = SchedulerConfig(scheduler="vllm-v1", kv_capacity_tokens=262_144)
PROFILES = (
    ("cpu-smollm2-135m", "iid:0.7~20", "fixed", SchedulerConfig(), 0.1),
    ("cpu-smollm2-135m", "smollm2-ngram", "fixed", SchedulerConfig(), 0.1),
    ("cpu-smollm2-135m", "smollm2-ngram", "goodput", SchedulerConfig(), 0.1),
    ("vllm-cpu-smollm2", "smollm2-ngram", "fixed", VLLM_CPU, 0.2),
    ("vllm-cpu-smollm2", "smollm2-ngram", "goodput", VLLM_CPU, 0.2),
    ("cpu-smollm2-135m", "smollm2-ngram", "fixed", SchedulerConfig(), 0.3),
    ("cpu-smollm2-135m", "smollm2-ngram", "goodput", SchedulerConfig(), 0.3),
    ("vllm-cpu-smollm2", "smollm2-ngram", "fixed", VLLM_CPU, 0.6),
    ("vllm-cpu-smollm2", "smollm2-ngram", "goodput", VLLM_CPU, 0.6),
)


def profiles_table(n: int, repeats: int) -> None:
    """us per simulated iteration on the shipped profiles (their own drafters), with the
    fast path and one iteration at a time side by side, and how far apart their mean E2E is:
    exact where segments follow the step path's clock (capped drafts, holds, vllm-v1), within
    float rounding where an uncapped segment adds its steps' durations up before the clock."""
    print(f"\n{n:,} requests on the shipped profiles, fixed k=3 unless named (times: median of "
          f"{repeats}, rows interleaved)")
    _header(f"{'profile':>17} {'acceptance':>14} {'policy':>8} {'scheduler':>12} {'rate':>5} "
            f"{'fast us':>8} {'step us':>8} {'batch':>6} {'E2E apart':>10}")
    runs: dict[tuple, list[dict]] = {(row, fast): [] for row in PROFILES for fast in (1, 0)}
    for _ in range(repeats):
        for (profile, acceptance, policy, scheduler, rate), fast in runs:
            runs[(profile, acceptance, policy, scheduler, rate), fast].append(measure(
                n, 3, acceptance, rate, policy, bool(fast), scheduler=scheduler,
                profile=profile))
    for row in PROFILES:
        cells = []
        for fast in (1, 0):
            results = runs[row, fast]
            cells.append(float(np.median([x["engine_s"] for x in results]))
                         / results[0]["iterations"] * 1e6)
        fast_e2e, step_e2e = runs[row, 1][0]["e2e_mean"], runs[row, 0][0]["e2e_mean"]
        apart = abs(fast_e2e - step_e2e) / step_e2e
        print(f"{row[0]:>17} {row[1]:>14} {row[2]:>8} {row[3].scheduler:>12} {row[4]:>5g} "
              f"{cells[0]:>8.1f} {cells[1]:>8.1f} {runs[row, 1][0]['mean_batch']:>6.1f} "
              f"{'exact' if apart == 0 else f'{apart:.0e}':>10}", flush=True)


ROOT = Path(__file__).resolve().parents[1]
RECORDED_ARGS = ["--workload", "poisson", "--rate", "8", "--lengths", "azure-conv",
                 "--acceptance", "smollm2-ngram", "--draft", "none", "--seed", "0"]


def _command_s(args: list[str]) -> float:
    """Wall seconds of one `spectune` command in a fresh interpreter, output discarded (its
    per-request loops chosen as a user's command chooses them: no SPECTUNE_KERNELS)."""
    env = {key: value for key, value in os.environ.items() if key != "SPECTUNE_KERNELS"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "spectune", *args], cwd=ROOT, check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def targets_table(n: int) -> None:
    """Each target, what it measures here, and whether it holds."""
    print(f"\nTargets (recorded rows: smollm2-ngram, model-free draft, 8 req/s; "
          f"{os.cpu_count()} cores for tune)")
    _header(f"{'run':>50} {'measured':>9} {'target':>7} {'met':>4}")
    rows = []
    for policy, k in (("fixed", 4), ("goodput", 0)):
        r = measure(n, k, "smollm2-ngram", 8.0, policy, True, draft="none")
        rows.append((f"{n:,} requests {policy}{' k=4' if k else ''}: engine s", r["engine_s"],
                     1.5))
        flags = ["--policy", policy, *(["--set", f"k={k}"] if k else [])]
        rows.append((f"{n:,} requests {policy}: `spectune simulate` wall s",
                     _command_s(["simulate", *RECORDED_ARGS, "--requests", str(n), *flags,
                                 "--format", "json"]), 2.0))
    r = measure(10 * n, 4, "smollm2-ngram", 8.0, "fixed", True, draft="none")
    rows.append((f"{10 * n:,} requests fixed k=4: engine s", r["engine_s"], 15.0))
    tune = [] if n == 10_000 else ["--requests", str(max(10, n // 33))]
    with tempfile.TemporaryDirectory() as out:
        rows.append((f"default `spectune tune`{' (scaled)' if tune else ''}: wall s",
                     _command_s(["tune", *tune, "--no-report", "--out", out]), 15.0))
    for name, measured, target in rows:
        print(f"{name:>50} {measured:>9.2f} {target:>7.1f} "
              f"{'yes' if measured <= target else 'no':>4}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--recorded", type=int, default=10_000,
                        help="requests of the recorded-trace table (0: skip it)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per recorded-trace row")
    parser.add_argument("--targets", action="store_true",
                        help="also the targets table (a few minutes)")
    parser.add_argument("--target-requests", type=int, default=10_000,
                        help="requests of the targets' recorded rows (the 100k row: 10x)")
    parser.add_argument("--every-policy", type=int, default=0, metavar="N",
                        help="also every policy's us per iteration, N requests a run (0: skip)")
    parser.add_argument("--every-scheduler", type=int, default=0, metavar="N",
                        help="also every policy's us per iteration under chunked prefill and "
                             "vLLM's scheduler, N requests a run (0: skip)")
    parser.add_argument("--planners", type=int, default=0, metavar="N",
                        help="also the planners' us per iteration with a draft model, N "
                             "requests a run (0: skip)")
    parser.add_argument("--profiles", type=int, default=0, metavar="N",
                        help="also the us per iteration on the shipped profiles, fast path "
                             "beside one iteration at a time, N requests a run (0: skip)")
    parser.add_argument("--paths", type=int, default=0, metavar="N",
                        help="also the us per iteration of each path (scheduler, replicas, "
                             "drafter) at two loads, N requests per replica (0: skip)")
    parser.add_argument("--compiled", type=int, default=0, metavar="N",
                        help="also each path's us per iteration with the per-request loops in "
                             "numpy beside compiled, N requests per replica (0: skip)")
    parser.add_argument("--loops", choices=kernels.CHOICES, default="numba",
                        help="the per-request loops of the in-process tables (default: "
                             "compiled, loaded once before them)")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    os.environ["SPECTUNE_KERNELS"] = args.loops
    started = time.perf_counter()
    loaded = kernels.prepare(0) is not None
    said = (f"compiled, loaded in {time.perf_counter() - started:.2f} s (once per process)"
            if loaded else "numpy")
    if args.loops == "auto":
        said += f" (auto: compiled from {kernels.AUTO_REQUESTS:,} requests a run)"
    print(f"per-request loops: {said}")
    _header(f"{'requests':>9} {'k':>2} {'build_s':>8} {'engine_s':>9} {'records_s':>9} "
            f"{'total_s':>8} {'req/s':>9} {'iter/s':>10} {'iterations':>11} {'batch':>6}")
    for n in args.sizes:
        for k in args.ks:
            r = measure(n, k)
            print(f"{r['requests']:>9,} {r['k']:>2} {r['build_s']:>8.2f} {r['engine_s']:>9.2f} "
                  f"{r['records_s']:>9.2f} {r['total_s']:>8.2f} "
                  f"{r['requests'] / r['total_s']:>9,.0f} {r['iterations'] / r['total_s']:>10,.0f} "
                  f"{r['iterations']:>11,} {r['mean_batch']:>6.2f}", flush=True)
    if args.recorded:
        recorded_table(args.recorded, args.repeats)
    if args.every_policy:
        every_policy_table(args.every_policy, args.repeats)
    if args.every_scheduler:
        every_scheduler_table(args.every_scheduler, args.repeats)
    if args.planners:
        planners_table(args.planners, args.repeats)
    if args.paths:
        paths_table(args.paths, args.repeats)
    if args.profiles:
        profiles_table(args.profiles, args.repeats)
    if args.compiled:
        compiled_table(args.compiled, args.repeats)
    if args.targets:
        targets_table(args.target_requests)


if __name__ == "__main__":
    main()

"""Every policy with its defaults beside the best fixed k in hindsight and the oracle, per cell.

A cell is an acceptance source x a load x a GPU x a workload (Llama-3.1-8B target on the roofline,
N requests of the trace with its arrivals rescaled to the rate, the mean over the seeds: seed i
serves the i-th window of N requests, as `spectune tune` evaluates).
Loads are fractions of the cell's capacity without speculation (requests/s of k = 0 under a burst),
so "light" and "saturated" mean the same on every GPU and workload. Per cell: the best fixed
k in 0..10 in hindsight, the oracle, and every policy with default parameters; then the targets of
spectune's own policy (`auto`): no cell more than 1% slower than the best fixed k, none slower
than k = 0, and the share of the distance from the best fixed k to the oracle it closes (mean over
the cells where the oracle beats the best fixed k by more than 0.5%).

Each run is appended to OUT/results.jsonl as it finishes; a rerun with the same OUT skips what is
there, so an interrupted matrix resumes.

    python benchmarks/policy_matrix.py [--requests 800] [--seeds 0 1 2] [--jobs 2] \
        [--out runs/policy-matrix] [--markdown benchmarks/results/policy_matrix.md]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
# run as a script, this file's folder comes first on sys.path and its name would shadow the
# `policies` package: drop that entry so `import policies` finds the package
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402  (after the sys.path fix above)
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: E402
from pathlib import Path  # noqa: E402

from policies import policy_names  # noqa: E402
from simulator import ClusterConfig, SchedulerConfig  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from spectune.evaluate import Task, evaluate  # noqa: E402
from spectune.search import Candidate  # noqa: E402
from spectune.simulate import SimulationSpec, run  # noqa: E402

#: acceptance source -> the draft charged: model-free for the n-gram lookups (the EAGLE-drafted
#: one as the issue's table ran it), the early exit at its recorded depth as a draft model, and
#: the parametric settings with the catalog's default small draft
ACCEPTANCES = {
    "smollm2-ngram": "none",
    "smollm2-eagle-ngram": "none",
    "smollm2-early-exit-24-lens": "Llama-3.1-8B-EE26",
    "beta:7,3~20": "Llama-68M",
    "beta:3.5,6.5~20": "Llama-68M",
}
GPUS = ("H100-SXM", "A100-80GB")
WORKLOADS = ("azure-conv", "azure-code")
LOADS = (0.1, 0.4, 0.7, 0.95)  # of the capacity without speculation
FIXED_KS = tuple(range(11))  # the engine's k_max (10) and below, as the oracle
SLO_TTFT_S, SLO_TPOT_S = 1.0, 0.025
MIN_ORACLE_GAP = 0.01  # cells where the oracle gains less are left out of the distance closed
PARAM_TYPES = {"k": int, "per_request": lambda v: v == "true"}  # the arms' parameters, typed
#: non-default settings shown beside the defaults: goodput's own per-request planner
EXTRA_ARMS = (("goodput", {"per_request": "true"}),)
#: the second yardstick, always run: an oracle that knows each position's chance of acceptance
#: and not the draws (parametric acceptance only; skipped on recordings)
CALIBRATED = ("oracle", {"knows": "probabilities"})
#: every registered policy but `fixed` (its k's are the grid) and `oracle` (the yardstick)
OTHERS = tuple(n for n in policy_names() if n not in ("fixed", "oracle"))


def spec(acceptance: str, gpu: str, workload: str, rate: float, requests: int, seed: int,
         policy: str) -> SimulationSpec:
    return SimulationSpec(workload=workload, rate=rate, requests=requests,
                          acceptance=acceptance, draft=ACCEPTANCES.get(acceptance, "none"),
                          hardware=gpu, policy=policy, seed=seed, slo_ttft=SLO_TTFT_S,
                          slo_tpot=SLO_TPOT_S)


def capacity(gpu: str, workload: str, requests: int) -> float:
    """Requests/s of k = 0 under a burst (every request arriving in the first 1/1000 s)."""
    _, s = run(spec("beta:7,3", gpu, workload, 1000.0 * requests, requests, 0, "fixed"),
               {"k": "0"}, SchedulerConfig(), ClusterConfig())
    return s["throughput_requests_per_s"]


def one_run(job: dict) -> dict:
    """One simulation's figures, evaluated as `spectune tune` evaluates a candidate: seed i
    serves the trace's i-th window of requests, with the recording's requests in the seed's
    order. A policy the acceptance source cannot serve (a signal the recording lacks) is
    recorded as skipped, with the reason."""
    started = time.perf_counter()
    params = tuple((k, PARAM_TYPES.get(k, str)(v)) for k, v in job["params"].items())
    task = Task(spec(job["acceptance"], job["gpu"], job["workload"], job["rate"],
                     job["requests"], job["seed"], job["policy"]), SchedulerConfig(),
                Candidate(job["policy"], params), job["rate"], job["seed"])
    try:
        m = evaluate(task)
    except ConfigError as error:
        return {**job, "skipped": str(error), "wall_s": time.perf_counter() - started}
    return {**job, "e2e_mean_s": m["e2e_mean_s"], "e2e_p99_s": m["e2e_p99_s"],
            "tpot_mean_s": m["tpot_mean_s"], "slo_attainment": m["slo_attainment"],
            "goodput_tokens_per_s": m["goodput_tokens_per_s"], "mean_k": m["mean_k"],
            "wall_s": time.perf_counter() - started}


def label(job: dict) -> str:
    if job["policy"] == "fixed":
        return f"k={job['params']['k']}"
    return "/".join([job["policy"], *(f"{k}={v}" for k, v in job["params"].items())])


def key(job: dict) -> str:
    return json.dumps([job[f] for f in ("acceptance", "gpu", "workload", "load", "requests",
                                        "seed", "policy")] + [job["params"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--acceptances", nargs="+", default=list(ACCEPTANCES))
    parser.add_argument("--gpus", nargs="+", default=list(GPUS))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS))
    parser.add_argument("--policies", nargs="+", default=list(OTHERS),
                        help="policies besides the fixed k's and the oracle")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=Path("runs/policy-matrix"))
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    args = parser.parse_args()
    for name in args.policies:
        if name not in OTHERS:
            parser.error(f"unknown policy {name!r}; choose from {', '.join(OTHERS)}")

    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "results.jsonl"
    done = {key(r): r for r in map(json.loads, log.read_text().splitlines())} \
        if log.exists() else {}
    rates = {}
    for gpu in args.gpus:
        for workload in args.workloads:
            mu = capacity(gpu, workload, args.requests)
            rates[gpu, workload] = {load: float(f"{load * mu:.3g}") for load in args.loads}
            print(f"{gpu} {workload}: capacity without speculation {mu:.2f} req/s", flush=True)
    arms = [("fixed", {"k": str(k)}) for k in FIXED_KS] + [("oracle", {}), CALIBRATED] + [
        (name, {}) for name in args.policies] + [
        (name, params) for name, params in EXTRA_ARMS if name in args.policies]
    jobs = [{"acceptance": a, "gpu": g, "workload": w, "load": load,
             "rate": rates[g, w][load], "requests": args.requests, "seed": seed,
             "policy": policy, "params": params}
            for a in args.acceptances for g in args.gpus for w in args.workloads
            for load in args.loads for seed in args.seeds for policy, params in arms]
    todo = [j for j in jobs if key(j) not in done]
    print(f"{len(jobs) - len(todo)} runs reused from {log}, {len(todo)} to go", flush=True)
    pool = ProcessPoolExecutor(max_workers=args.jobs)
    try:
        with log.open("a") as out:
            futures = [pool.submit(one_run, job) for job in todo]
            for i, future in enumerate(as_completed(futures), 1):
                r = future.result()
                out.write(json.dumps(r) + "\n")
                out.flush()
                done[key(r)] = r
                if i % 50 == 0 or i == len(todo):
                    print(f"[{i}/{len(todo)}] last: {r['acceptance']} {r['gpu']} "
                          f"{r['workload']} {r['load']:g} {label(r)} {r['wall_s']:.1f} s",
                          flush=True)
    finally:  # on an error or Ctrl-C, do not sit out the queued runs: what finished is saved
        pool.shutdown(wait=True, cancel_futures=True)
    results = [done[key(j)] for j in jobs]
    text = report(results, args.policies)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)


def cells(results: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(acceptance, gpu, workload, load) -> label -> means over the seeds."""
    grouped: dict[tuple, dict[str, list[dict]]] = {}
    for r in results:
        if "skipped" in r:
            continue
        cell = (r["acceptance"], r["gpu"], r["workload"], r["load"])
        grouped.setdefault(cell, {}).setdefault(label(r), []).append(r)
    return {cell: {name: {f: statistics.fmean(r[f] for r in runs)
                          for f in ("e2e_mean_s", "slo_attainment", "rate")}
                   for name, runs in arms.items()}
            for cell, arms in grouped.items()}


def report(results: list[dict], policies: list[str]) -> str:
    """The per-cell table (mean E2E relative to the best fixed k), then the targets."""
    table = cells(results)
    calibrated = label({"policy": CALIBRATED[0], "params": CALIBRATED[1]})
    shown = ["oracle", calibrated, *policies, *(label({"policy": name, "params": params})
                                                for name, params in EXTRA_ARMS
                                                if name in policies)]
    policies = shown[1:]
    lines = ["| acceptance | GPU | workload | load | rate | best fixed k | k=0 | "
             + " | ".join(shown) + " |",
             "|---" * (7 + len(shown)) + "|"]
    closed: dict[str, list[tuple[float, float]]] = {name: [] for name in policies}
    worst: dict[str, float] = {name: 0.0 for name in policies}
    over_k0: dict[str, int] = {name: 0 for name in policies}
    for cell, arms in table.items():
        fixed = {name: v["e2e_mean_s"] for name, v in arms.items() if name.startswith("k=")}
        best = min(fixed, key=fixed.__getitem__)
        b, oracle = fixed[best], arms["oracle"]["e2e_mean_s"]
        row = [*cell[:3], f"{cell[3]:g}", f"{arms[best]['rate']:g}/s",
               f"{best} {b:.3f} s", _rel(fixed["k=0"], b)]
        for name in shown:
            if name not in arms:
                row.append("n/a")
                continue
            e2e = arms[name]["e2e_mean_s"]
            row.append(_rel(e2e, b))
            if name == "oracle":
                continue
            worst[name] = max(worst[name], e2e / b - 1.0)
            over_k0[name] += e2e > fixed["k=0"] * (1 + 1e-9)
            if oracle < b * (1.0 - MIN_ORACLE_GAP):
                closed[name].append(((b - e2e) / b, (b - oracle) / b))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Mean E2E against the best fixed k in hindsight (per cell, mean over seeds).",
              "", "| policy | worst cell vs best fixed k | cells slower than k=0 | "
              "distance to the oracle closed: mean over cells (pooled) | SLO attainment (mean) |",
              "|---|---|---|---|---|"]
    for name in policies:
        gains = closed[name]
        share = statistics.fmean(p / o for p, o in gains) if gains else float("nan")
        pooled = sum(p for p, _ in gains) / sum(o for _, o in gains) if gains else float("nan")
        served = [arms for arms in table.values() if name in arms]
        slo = statistics.fmean(a[name]["slo_attainment"] for a in served) if served else 0.0
        lines.append(f"| {name} | {worst[name] * 100:+.1f}% | {over_k0[name]} of {len(served)} "
                     f"| {_share(share, pooled)} | {slo * 100:.1f}% |")
    slo_fixed = statistics.fmean(
        max(v["slo_attainment"] for n, v in arms.items() if n.startswith("k="))
        for arms in table.values())
    gaps = sum(1 for arms in table.values() if arms["oracle"]["e2e_mean_s"] < (1.0 - MIN_ORACLE_GAP)
               * min(v["e2e_mean_s"] for n, v in arms.items() if n.startswith("k=")))
    lines += ["", f"The distance closed is (best fixed - policy) / (best fixed - oracle) over the "
              f"{gaps} cells where the oracle is more than {MIN_ORACLE_GAP * 100:g}% faster than "
              "the best fixed k (elsewhere it divides by noise); pooled: the sums' ratio. "
              f"{calibrated}: the oracle that knows each position's chance of acceptance, not "
              "the draws (parametric acceptance only): the share it closes is what perfect "
              "calibration could, the rest is the draws' luck.",
              f"SLO: TTFT <= {SLO_TTFT_S:g} s and TPOT <= {SLO_TPOT_S * 1e3:g} ms; the best "
              f"fixed k's attainment per cell averages {slo_fixed * 100:.1f}%.", ""]
    return "\n".join(lines)


def _share(mean: float, pooled: float) -> str:
    """The distance closed, or n/a where no cell's oracle was far enough ahead."""
    return "n/a" if mean != mean else f"{mean * 100:.0f}% ({pooled * 100:.0f}%)"


def _rel(value: float, best: float) -> str:
    return f"{(value / best - 1.0) * 100:+.1f}%"


if __name__ == "__main__":
    main()

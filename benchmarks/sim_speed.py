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
import time  # noqa: E402

import numpy as np  # noqa: E402

from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig, summarize  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from spectune.simulate import SimulationSpec, build_inputs  # noqa: E402


def measure(n: int, k: int, acceptance: str = "iid:0.7", rate: float = 2.0,
            policy: str = "fixed", fast_path: bool = True, draft: str | None = None) -> dict:
    spec = SimulationSpec(workload="poisson", rate=rate, requests=n, lengths="azure-conv",
                          acceptance=acceptance, seed=0, draft=draft)
    params = {"k": k} if policy == "fixed" else {}
    t0 = time.perf_counter()
    inputs = build_inputs(spec, {key: str(v) for key, v in params.items()}, SchedulerConfig())
    t1 = time.perf_counter()
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                      make_policy(policy, params), inputs.kv_capacity_tokens,
                      fast_path=fast_path)
    t2 = time.perf_counter()
    summary = summarize(result.requests, result.steps)
    t3 = time.perf_counter()
    engine_s = result.meta["engine_s"]
    return {
        "requests": n, "k": k, "build_s": t1 - t0, "engine_s": engine_s,
        "records_s": (t2 - t1) - engine_s + (t3 - t2), "total_s": t3 - t0,
        "iterations": summary["iterations"], "mean_batch": summary["mean_batch_size"],
        "sim_seconds": summary["duration_s"], "fast_path": result.meta["fast_path"],
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
        path = "fast" if r["fast_path"] else "step"
        print(f"{policy:>15} {k if policy == 'fixed' else '':>2} {path:>5} "
              f"{r['engine_s']:>9.2f} {r['total_s']:>8.2f} {r['iterations']:>11,} "
              f"{r['engine_s'] / r['iterations'] * 1e6:>8.1f} {r['mean_batch']:>6.2f} "
              f"{r['e2e_mean']:>11.6f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--recorded", type=int, default=10_000,
                        help="requests of the recorded-trace table (0: skip it)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per recorded-trace row")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
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


if __name__ == "__main__":
    main()

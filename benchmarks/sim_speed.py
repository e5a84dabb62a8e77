"""How fast the simulator runs: wall time, simulated requests/s and iterations/s.

Workload: the Azure conversation trace's (prompt, output) lengths, Poisson arrivals at 2 req/s,
one replica, roofline Llama-3.1-8B + Llama-68M on H100-SXM, acceptance iid:0.7, fixed k=0 and
k=4, for 1k, 10k and 100k requests. Columns:
  build_s   workload + acceptance trace generation
  engine_s  the SimPy run (arrivals, scheduling, step costs, acceptance replay)
  records_s turning the logs into DataFrames
  total_s   all three (what `spectune simulate` spends, less imports and printing)
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

from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig, summarize  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from spectune.simulate import SimulationSpec, build_inputs  # noqa: E402


def measure(n: int, k: int) -> dict:
    spec = SimulationSpec(workload="poisson", rate=2.0, requests=n, lengths="azure-conv",
                          acceptance="iid:0.7", seed=0)
    t0 = time.perf_counter()
    inputs = build_inputs(spec, {"k": str(k)}, SchedulerConfig())
    t1 = time.perf_counter()
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                      make_policy("fixed", {"k": k}), inputs.kv_capacity_tokens)
    t2 = time.perf_counter()
    summary = summarize(result.requests, result.steps)
    t3 = time.perf_counter()
    engine_s = result.meta["engine_s"]
    return {
        "requests": n, "k": k, "build_s": t1 - t0, "engine_s": engine_s,
        "records_s": (t2 - t1) - engine_s + (t3 - t2), "total_s": t3 - t0,
        "iterations": summary["iterations"], "mean_batch": summary["mean_batch_size"],
        "sim_seconds": summary["duration_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 4])
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    header = (f"{'requests':>9} {'k':>2} {'build_s':>8} {'engine_s':>9} {'records_s':>9} "
              f"{'total_s':>8} {'req/s':>9} {'iter/s':>10} {'iterations':>11} {'batch':>6}")
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        for k in args.ks:
            r = measure(n, k)
            print(f"{r['requests']:>9,} {r['k']:>2} {r['build_s']:>8.2f} {r['engine_s']:>9.2f} "
                  f"{r['records_s']:>9.2f} {r['total_s']:>8.2f} "
                  f"{r['requests'] / r['total_s']:>9,.0f} {r['iterations'] / r['total_s']:>10,.0f} "
                  f"{r['iterations']:>11,} {r['mean_batch']:>6.2f}", flush=True)


if __name__ == "__main__":
    main()

"""How close is the tuner's choice to the best of an exhaustive grid, on the same seeds?

For each workload, `spectune tune` runs twice on identical scenarios and seeds: the default search
(successive halving over each policy's grid x a Sobol sample of its bounds, then a local
refinement) and `--search grid` (every grid value x --grid-points per bounded parameter, on
every seed).
Printed per workload and rate: the best objective of each, the gap in percent, and how many
simulations each needed. The objective values do not depend on the machine's speed.

    python benchmarks/tune_vs_grid.py [--requests 300] [--out runs/tune-vs-grid]
"""

from __future__ import annotations

import os
import sys

# run as a script, this folder comes first on sys.path and benchmarks/policies.py would shadow
# the `policies` package: drop that entry
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

from simulator import SchedulerConfig  # noqa: E402
from spectune.simulate import SimulationSpec  # noqa: E402
from spectune.tune import TUNE_SCENARIO, TuneSpec, run_tune  # noqa: E402

WORKLOADS = {"azure-conv": (4.0, 12.0, 24.0), "azure-code": (2.0, 6.0, 10.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=TUNE_SCENARIO["requests"])
    parser.add_argument("--policies", default="fixed,batch_adaptive,goodput")
    parser.add_argument("--grid-points", type=int, default=5,
                        help="grid points per bounded parameter of the exhaustive search")
    parser.add_argument("--out", type=Path, default=Path("runs/tune-vs-grid"))
    args = parser.parse_args()
    print(f"{'workload':<12}{'rate':>6}  {'tuner':<40}{'objective':>11}  {'grid':<40}"
          f"{'objective':>11}{'gap':>8}")
    for workload, rates in WORKLOADS.items():
        scenario = replace(SimulationSpec(), **{**TUNE_SCENARIO, "requests": args.requests},
                           workload=workload)
        sims = {}
        best = {}
        for search, points in (("halving", 4), ("grid", args.grid_points)):
            spec = TuneSpec(rates=rates, policies=args.policies, search=search, points=points,
                            samples=False)
            result = run_tune(spec, scenario, SchedulerConfig(), args.out / workload / search)
            sims[search] = result["meta"]["simulations"]
            best[search] = {r["rate"]: r for r in result["recommendations"]}
        for rate in rates:
            t, g = best["halving"][rate], best["grid"][rate]
            gap = (t["objective"] - g["objective"]) / g["objective"] * 100
            print(f"{workload:<12}{rate:>6g}  {t['label'][:39]:<40}{t['objective']:>11.4f}  "
                  f"{g['label'][:39]:<40}{g['objective']:>11.4f}{gap:>+7.2f}%")
        print(f"{'':<12}simulations: tuner {sims['halving']}, grid {sims['grid']}")


if __name__ == "__main__":
    main()

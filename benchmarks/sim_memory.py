"""Peak memory and wall time of `spectune simulate` as the workload grows: the run's memory must
follow the requests in flight, not the workload (docs/design.md, "Memory").

Each size runs the CLI in a process of its own (Poisson arrivals at 2 req/s, Azure conversation
lengths, beta:7,3 acceptance, fixed k = 4: simulate's defaults), and its peak resident memory is
read from the kernel (getrusage of the finished child). No other process may run while it is
timed.

    python benchmarks/sim_memory.py [--sizes 100000 1000000 10000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(requests: int, extra: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS in MiB) of one simulate run in a child process."""
    command = [sys.executable, "-m", "spectune", "simulate", "--workload", "poisson", "--rate",
               "2", "--requests", str(requests), "--format", "json", *extra]
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)  # the child's own rusage, peak RSS included
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command[2:])} failed: {child.stderr.read()[-500:]!r}")
    child.stderr.close()
    kib = usage.ru_maxrss if sys.platform.startswith("linux") else usage.ru_maxrss / 1024
    return wall, kib / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--args", nargs=argparse.REMAINDER, default=[],
                    help="more simulate flags (after everything else)")
    args = ap.parse_args()
    print(f"{'requests':>12} {'wall_s':>9} {'peak_MiB':>9} {'bytes/request':>14}")
    for n in args.sizes:
        wall, peak = measure(n, args.args)
        print(f"{n:>12,} {wall:>9.1f} {peak:>9.0f} {peak * 2**20 / n:>14,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

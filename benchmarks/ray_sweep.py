"""A tune on a two-node Ray cluster against the same tune on local processes: the same results,
and the wall time of each.

The cluster is two `ray start` processes on this machine (a head and a worker node, 1 CPU each,
in a temp dir of their own, stopped at the end: only their processes, not other Ray sessions),
joined with token authentication as `ray start --head` sets it up. The tune is `spectune tune`
on the embedded defaults unless --args says otherwise, with a fresh cache for each executor.
No other process may run while it is timed.

    python benchmarks/ray_sweep.py [--args "--requests 100 --seeds 2"]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
#: what tune writes that says how or how fast it ran, not what it found
NOT_RESULTS = {"wall_s", "engine_s", "created", "reused_from_cache", "executor", "ray_address",
               "jobs"}


def cluster_env() -> dict:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}


def start_cluster(temp: Path, port: int, nodes: int = 2) -> str:
    """A head and nodes - 1 workers of 1 CPU each, all on this machine; its address."""
    ray = str(BIN / "ray")
    common = ["--num-cpus", "1", "--disable-usage-stats", "--temp-dir", str(temp)]
    subprocess.run([ray, "start", "--head", "--port", str(port), "--include-dashboard", "false",
                    *common], check=True, capture_output=True, env=cluster_env())
    address = f"127.0.0.1:{port}"
    for _ in range(nodes - 1):
        subprocess.run([ray, "start", "--address", address, *common], check=True,
                       capture_output=True, env=cluster_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = subprocess.run([ray, "status", "--address", address], capture_output=True,
                                text=True, env=cluster_env()).stdout
        if status.count(" node_") >= nodes:
            return address
        time.sleep(1)
    raise RuntimeError(f"the {nodes} Ray nodes did not all join within 60 s")


def stop_cluster(temp: Path) -> None:
    """Kill the processes of this cluster only: those whose command lines name its temp dir
    (its servers and raylets) and every process below them (agents and workers rename
    themselves)."""
    from spectune.ray_reaper import descendants

    named = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and str(temp) in (proc / "cmdline").read_bytes().replace(
                    b"\0", b" ").decode():
                named.append(int(proc.name))
    for pid in {*named, *(kid for parent in named for kid in descendants(parent))}:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def timed_tune(args: list[str], out: Path, env: dict | None = None) -> float:
    started = time.perf_counter()
    subprocess.run([str(BIN / "spectune"), "tune", *args, "--no-report", "--out", str(out)],
                   check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    from spectune.files import without_keys

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--args", default="", help="tune's flags (default: the embedded defaults)")
    ap.add_argument("--port", type=int, default=6391)
    args = ap.parse_args()
    tune = shlex.split(args.args)
    with tempfile.TemporaryDirectory(prefix="spectune-ray-") as folder:
        work = Path(folder)
        local_s = timed_tune([*tune, "--jobs", "2"], work / "local")
        temp = work / "ray"
        try:
            address = start_cluster(temp, args.port)
            ray_s = timed_tune([*tune, "--executor", "ray", "--ray-address", address],
                               work / "on-ray", cluster_env())
        finally:
            stop_cluster(temp)
        local, on_ray = (json.loads((work / run / "tune.json").read_text())
                         for run in ("local", "on-ray"))
        same = without_keys(local, NOT_RESULTS) == without_keys(on_ray, NOT_RESULTS)
        sims = local["meta"]["simulations"]
    print(f"spectune tune {' '.join(tune) or '(embedded defaults)'}: {sims} simulations")
    print(f"{'executor':<40} {'wall_s':>7}")
    print(f"{'local processes (--jobs 2)':<40} {local_s:>7.1f}")
    print(f"{'Ray, two nodes of 1 CPU on this machine':<40} {ray_s:>7.1f}")
    print(f"results identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

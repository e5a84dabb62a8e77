"""How long the command line takes to start: `spectune --help`, `spectune policies` and friends.

Each command runs `--runs` times in a fresh interpreter (stdout to /dev/null); the table gives
the median, min and max wall time. Two settings:
  as is     the environment as it stands (with PYTHONDONTWRITEBYTECODE=1 and no __pycache__ in
            the tree, every project module is compiled from source at each start)
  bytecode  compiled modules cached (PYTHONPYCACHEPREFIX in a temporary folder, filled by one
            untimed run first): what an installed spectune sees from its second start on
Then the import-time top offenders of building the parser (`python -X importtime`, cached
bytecode): the modules with the most time of their own, and whether any heavy package
(pandas, plotly, scipy, SimPy, torch) was imported at all.

`--root DIR` times the spectune tree in DIR instead of this one (e.g. a `git archive` of an
older commit, to compare before and after on the same machine in one sitting).
Run on a quiet machine: `python benchmarks/cli_startup.py [--runs 5] [--root DIR]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = (["--help"], ["policies"], ["catalog"], ["tune", "--help"])
HEAVY = ("pandas", "plotly", "scipy", "simpy", "torch")
#: runs the CLI as the `spectune` console script does, from the tree in the working directory
LAUNCH = "import sys; from spectune.cli import main; sys.exit(main())"
PARSER = "import spectune.cli; spectune.cli._parser()"


def wall(argv: list[str], root: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", LAUNCH, *argv], cwd=root, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def timings(root: Path, runs: int, env: dict[str, str]) -> list[tuple[str, list[float]]]:
    wall(["--help"], root, env)  # untimed: fills a bytecode cache, warms the file cache
    return [(" ".join(["spectune", *argv]), [wall(argv, root, env) for _ in range(runs)])
            for argv in COMMANDS]


def import_times(root: Path, env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) of every import made while building the parser."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", PARSER], cwd=root, env=env,
                         check=True, capture_output=True, text=True).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(own), int(cumulative), name.rstrip()))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the tree whose spectune is timed (default: this one)")
    ap.add_argument("--top", type=int, default=12, help="import-time rows to show")
    args = ap.parse_args()
    root = args.root.resolve()
    as_is = dict(os.environ)
    with tempfile.TemporaryDirectory() as cache:
        cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = cache
        table = {"as is": timings(root, args.runs, as_is),
                 "bytecode": timings(root, args.runs, cached)}
        imports = import_times(root, cached)
    print(f"# {root}, python {sys.version.split()[0]}, {args.runs} runs each, "
          f"{os.cpu_count()} cores")
    print(f"{'command':<22}" + "".join(f"{s + ' median':>18}{'min':>8}{'max':>8}"
                                       for s in table))
    for i, (command, _) in enumerate(table["as is"]):
        cells = ""
        for rows in table.values():
            t = rows[i][1]
            cells += f"{statistics.median(t):>16.3f} s{min(t):>8.3f}{max(t):>8.3f}"
        print(f"{command:<22}{cells}")
    total = sum(own for own, _, _ in imports) / 1e6
    heavy = sorted({name.strip().split(".")[0] for _, _, name in imports} & set(HEAVY))
    print(f"\nbuilding the parser: {len(imports)} modules imported, {total:.3f} s of import "
          f"time (-X importtime, cached bytecode); heavy packages: {', '.join(heavy) or 'none'}")
    print(f"{'self ms':>8}{'cumul ms':>10}  module (the most time of its own first)")
    for own, cumulative, name in sorted(imports, reverse=True)[:args.top]:
        print(f"{own / 1e3:>8.1f}{cumulative / 1e3:>10.1f}  {name.strip()}")


if __name__ == "__main__":
    main()

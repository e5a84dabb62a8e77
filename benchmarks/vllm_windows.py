"""The validation targets over several measured windows: per configuration and rate, the mean
of its simulated values over the windows that served it against the mean of vLLM's (mean TTFT,
TPOT and E2E, the mean of the windows' E2E p99, tokens per step), beside how many of its single
runs met all five. Reads `validate.csv` tables of `spectune validate --engine vllm` (nothing
served).

One window serves a configuration once: 24 requests, on one server instance, whose speed moves
by several percent from one instance or hour to the next (docs/vllm.md). Over windows served by
other instances, of other questions and arrivals, what is noise averages out, as it does for a
user who serves a configuration longer than one window; a bias stays and shows. Each run is
still simulated on its own workload.

    python benchmarks/vllm_windows.py runs/window-0/calibrated/validate.csv \\
        runs/window-1/calibrated/validate.csv ...
    python benchmarks/vllm_windows.py          # the six calibrated windows shipped
    python benchmarks/vllm_windows.py --plain  # ... simulated with the plain profile
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

#: the validation targets (docs/vllm.md): the largest |error| in percent each metric may have
TARGETS = {"ttft_mean_s": 10.0, "tpot_mean_s": 5.0, "e2e_mean_s": 5.0, "e2e_p99_s": 10.0,
           "emitted_per_step": 1.0}
LABELS = {"ttft_mean_s": "TTFT mean", "tpot_mean_s": "TPOT mean", "e2e_mean_s": "E2E mean",
          "e2e_p99_s": "E2E p99", "emitted_per_step": "tokens/step"}
COLUMNS = ("policy", "rate", "metric", "simulated", "measured")
#: the windows measured on the EPYC VM (docs/vllm.md): seeds 0-3 (loop 2's seven
#: configurations) and windows 5-6 (the two tables beside k = 0, 1, 2)
SHIPPED = Path(__file__).resolve().parent / "results" / "vllm-epyc"
SHIPPED_WINDOWS = ("matched", "matched-s1", "matched-s2", "matched-s3", "tables-s4", "tables-s5")


class WindowsError(ValueError):
    """A table that is not a validate.csv, or tables that cannot be pooled."""


def read_window(path: Path) -> pd.DataFrame:
    """One window's validate.csv: its target metrics' simulated and measured values."""
    try:
        table = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as exc:
        raise WindowsError(f"{path}: cannot read it as a table ({exc})") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise WindowsError(f"{path}: not a validate.csv of `spectune validate --engine vllm` "
                           f"(no column {', '.join(missing)})")
    table = table[table.metric.isin(TARGETS)].loc[:, list(COLUMNS)].copy()
    if table.empty:
        raise WindowsError(f"{path}: none of the metrics {', '.join(TARGETS)}")
    for column in ("rate", "simulated", "measured"):  # numbers, or empty (not simulated)
        given = table[column].notna()
        table[column] = pd.to_numeric(table[column], errors="coerce")
        if (given & table[column].isna()).any() or (column == "rate"
                                                     and table.rate.isna().any()):
            raise WindowsError(f"{path}: column {column} holds a value that is not a number")
    if table.policy.isna().any():
        raise WindowsError(f"{path}: a row without its configuration (policy)")
    if table.duplicated(["policy", "rate", "metric"]).any():
        raise WindowsError(f"{path}: a configuration, rate and metric appears twice")
    # a metric one side lacks in a window is that window's gap, not pooled one-sided
    return table[table.simulated.notna() & table.measured.notna()]


def pool(windows: list[pd.DataFrame]) -> pd.DataFrame:
    """Per (configuration, rate) in order of first appearance: the windows that served it, each
    target metric's error of the mean simulated against the mean measured (percent), whether
    all five are within their targets, and how many single runs met all five."""
    tagged = pd.concat([w.assign(window=i) for i, w in enumerate(windows)], ignore_index=True)
    tagged["error"] = (tagged.simulated / tagged.measured - 1.0) * 100.0
    tagged["within"] = [abs(e) <= TARGETS[m] for e, m in zip(tagged.error, tagged.metric)]
    rows = []
    for (policy, rate), group in tagged.groupby(["policy", "rate"], sort=False):
        means = group.groupby("metric")[["simulated", "measured"]].mean()
        # a run counts as meeting the targets where every metric it reports is within its own
        runs = group.groupby("window").within.all()
        complete = group.groupby("window").metric.nunique() == len(TARGETS)
        row = {"policy": policy, "rate": rate, "windows": int(group.window.nunique()),
               "runs_within": int((runs & complete).sum())}
        for metric in TARGETS:
            if metric in means.index and means.at[metric, "measured"] != 0:
                row[metric] = (means.at[metric, "simulated"] / means.at[metric, "measured"]
                               - 1.0) * 100.0
            else:
                row[metric] = float("nan")
        row["within"] = all(abs(row[m]) <= TARGETS[m] for m in TARGETS)  # NaN: not within
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(pooled: pd.DataFrame) -> str:
    """The pooled table as docs/vllm.md shows it, and a line of totals."""
    head = ("| configuration | rate | windows | "
            + " | ".join(f"{LABELS[m]} ±{TARGETS[m]:g}%" for m in TARGETS)
            + " | all five, pooled | single runs with all five |")
    lines = [head, "|" + "---|" * (len(TARGETS) + 5)]
    for row in pooled.itertuples(index=False):
        cells = []
        for metric in TARGETS:
            value = getattr(row, metric)
            text = "n/a" if value != value else f"{value:+.1f}%"
            cells.append(text if abs(value) <= TARGETS[metric] else f"**{text}**")
        lines.append(f"| {row.policy} | {row.rate:g} | {row.windows} | " + " | ".join(cells)
                     + f" | {'yes' if row.within else 'no'} | {row.runs_within} of {row.windows} |")
    lines.append("")
    lines.append(f"configurations and rates within all five targets over their windows: "
                 f"{int(pooled.within.sum())} of {len(pooled)}; single runs: "
                 f"{int(pooled.runs_within.sum())} of {int(pooled.windows.sum())}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", type=Path, nargs="*",
                    help="validate.csv of each window (spectune validate --engine vllm --out; "
                         "default: the six windows measured on the EPYC VM, calibrated)")
    ap.add_argument("--plain", action="store_true",
                    help="without tables: the shipped windows simulated with the plain profile")
    args = ap.parse_args(argv)
    if args.plain and args.tables:
        ap.error("--plain picks the shipped windows' plain simulations: give tables or --plain")
    kind = "plain" if args.plain else "calibrated"
    tables = args.tables or [SHIPPED / f"{name}-{kind}.csv" for name in SHIPPED_WINDOWS]
    repeated = sorted({str(t) for t in tables if tables.count(t) > 1})
    if repeated:
        ap.error(f"{', '.join(repeated)} given twice: each window counts once")
    try:
        print(markdown(pool([read_window(path) for path in tables])))
    except WindowsError as exc:
        print(f"vllm_windows: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

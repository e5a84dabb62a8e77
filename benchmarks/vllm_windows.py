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
    python benchmarks/vllm_windows.py          # the ten calibrated windows shipped
    python benchmarks/vllm_windows.py --plain  # ... simulated with the plain profile
    python benchmarks/vllm_windows.py --ranking --anchor fixed:k=2  # the loop over them

`--ranking` prints instead, per rate, vLLM's mean E2E of each configuration over the windows
that served all of them, and with `--predicted` (a CSV of policy, rate, e2e_mean_s: what
`spectune tune` predicted) the Kendall tau of the prediction's order against vLLM's. With
`--anchor CONFIG` it compares instead every configuration with the anchor in each window that
served both, so that configurations served in different windows rank against each other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.vllm_calibration import kendall_tau  # noqa: E402
from benchmarks.vllm_ranking import pair_tau  # noqa: E402

#: the validation targets (docs/vllm.md): the largest |error| in percent each metric may have
TARGETS = {"ttft_mean_s": 10.0, "tpot_mean_s": 5.0, "e2e_mean_s": 5.0, "e2e_p99_s": 10.0,
           "emitted_per_step": 1.0}
LABELS = {"ttft_mean_s": "TTFT mean", "tpot_mean_s": "TPOT mean", "e2e_mean_s": "E2E mean",
          "e2e_p99_s": "E2E p99", "emitted_per_step": "tokens/step"}
COLUMNS = ("policy", "rate", "metric", "simulated", "measured")
#: the windows measured on the EPYC VM (docs/vllm.md): seeds 0-3 (loop 2's seven
#: configurations), seeds 4-7 (the two tables beside k = 0, 1, 2) seed 8 (the exported table
#: beside k = 0, 2, 3, 4, 6) and seed 9 (the two tables beside k = 1, 2, 3)
SHIPPED = Path(__file__).resolve().parent / "results" / "vllm-epyc"
SHIPPED_WINDOWS = ("matched", "matched-s1", "matched-s2", "matched-s3", "tables-s4", "tables-s5",
                   "tables-s6", "tables-s7", "loop-s8", "loop-s9")


#: what `spectune tune` predicted for every configuration the shipped windows served
SHIPPED_PREDICTED = SHIPPED / "loop-predicted.csv"


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
    return table[table.measured.notna()]  # (a value not simulated is left to `pool`)


def pool(windows: list[pd.DataFrame]) -> pd.DataFrame:
    """Per (configuration, rate) in order of first appearance: the windows that served it, each
    target metric's error of the mean simulated against the mean measured (percent), whether
    all five are within their targets, and how many single runs met all five."""
    tagged = pd.concat([w.assign(window=i) for i, w in enumerate(windows)], ignore_index=True)
    # a metric one side lacks in a window is that window's gap, not pooled one-sided
    tagged = tagged[tagged.simulated.notna() & tagged.measured.notna()]
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


#: pairs whose measured values lie closer than this (percent) are left out of the second tau:
#: one window set resolves about this much (docs/vllm.md)
APART_PCT = 4.0


def ranking(windows: list[pd.DataFrame], predicted: dict[tuple[str, float], float]) -> str:
    """Per rate, over the windows that served every configuration served at that rate: each
    configuration's measured mean E2E (the windows' mean) against the best, the mean of its
    ratio to each window's best (each window weighing alike, whatever its load), and the
    prediction where given, with Kendall tau of the prediction against both orders."""
    e2e = _e2e_by_window(windows)
    lines = []
    for rate, at in e2e.groupby("rate", sort=True):
        configs = list(dict.fromkeys(at.policy))
        served = at.groupby("window").policy.apply(set)
        common = [w for w, names in served.items() if names >= set(configs)]
        if not common:
            lines.append(f"rate {rate:g}: no window served all {len(configs)} configurations")
            continue
        table = at[at.window.isin(common)].pivot(index="policy", columns="window",
                                                 values="measured").loc[configs]
        mean = table.mean(axis=1)
        ratio = (table / table.min(axis=0)).mean(axis=1)
        lines.append(f"rate {rate:g} req/s: {len(common)} windows served all {len(configs)}")
        lines.append(f"  {'configuration':<52} {'mean E2E':>9} {'vs best':>8} "
                     f"{'mean ratio':>11} {'predicted':>10}")
        for name in configs:
            guess = predicted.get((name, float(rate)))
            behind = (mean[name] / mean.min() - 1) * 100
            lines.append(f"  {name:<52} {mean[name]:>8.3f}s {behind:>+7.1f}%"
                         f" {(ratio[name] - 1) * 100:>+10.1f}% "
                         + _predicted_cell(guess))
        guesses = [predicted.get((name, float(rate))) for name in configs]
        lines += _tau_lines(configs, guesses, list(mean), bool(predicted),
                            " against the mean E2E", ("against the mean ratio", list(ratio)))
    return "\n".join(lines)


def anchored(windows: list[pd.DataFrame], predicted: dict[tuple[str, float], float],
             anchor: str) -> str:
    """Per rate, over every window that served `anchor`: each configuration's mean E2E over
    the anchor's in the same window, the geometric mean over the windows that served both.
    A window's questions, arrivals and hour move every configuration it serves alike, and
    the ratio takes them out, so configurations never served together compare (through the
    anchor), and every window counts, not only those that served all. What the ratio keeps
    is each run's own server (one per configuration, the anchor's too in every ratio of its
    window), whose speed the windows average. Listed in order of first appearance."""
    e2e = _e2e_by_window(windows)
    if anchor not in set(e2e.policy):
        raise WindowsError(f"no window served the anchor {anchor}; they served: "
                           + ", ".join(dict.fromkeys(e2e.policy)))
    if not (e2e.measured > 0).all():
        bad = e2e[~(e2e.measured > 0)].iloc[0]
        raise WindowsError(f"{bad.policy} at {bad.rate:g} req/s: a measured mean E2E of "
                           f"{bad.measured}, where a ratio needs a positive one")
    lines = []
    for rate, at in e2e.groupby("rate", sort=True):
        table = at.pivot(index="policy", columns="window", values="measured")
        if anchor not in table.index:
            lines.append(f"rate {rate:g}: no window served the anchor {anchor}")
            continue
        configs = list(dict.fromkeys(at.policy))
        ratios = table / table.loc[anchor]  # NaN where a window lacks one of the two
        served = ratios.notna().sum(axis=1)
        geo = np.exp(np.log(ratios).mean(axis=1))
        best = geo.min()
        lines.append(f"rate {rate:g} req/s: {int(served[anchor])} windows served {anchor}")
        lines.append(f"  {'configuration':<52} {'windows':>7} {'vs anchor':>10} {'vs best':>8} "
                     f"{'predicted':>10}")
        ranked = [name for name in configs if served[name] > 0]
        for name in ranked:
            guess = predicted.get((name, float(rate)))
            lines.append(f"  {name:<52} {int(served[name]):>7} {(geo[name] - 1) * 100:>+9.1f}% "
                         f"{(geo[name] / best - 1) * 100:>+7.1f}% "
                         + _predicted_cell(guess))
        apart = [name for name in configs if served[name] == 0]
        if apart:
            lines.append(f"  never served in a window with {anchor}, so not compared: "
                         + ", ".join(apart))
        guesses = [predicted.get((name, float(rate))) for name in ranked]
        if len(ranked) < 2:
            lines.append("  no Kendall tau: one configuration compared")
        else:
            lines += _tau_lines(ranked, guesses, [float(geo[name]) for name in ranked],
                                bool(predicted))
    return "\n".join(lines)


def _e2e_by_window(windows: list[pd.DataFrame]) -> pd.DataFrame:
    """The windows' mean E2E rows, each tagged with its window's place."""
    return pd.concat([w[w.metric == "e2e_mean_s"].assign(window=i)
                      for i, w in enumerate(windows)], ignore_index=True)


def _tau_lines(names: list[str], guesses: list, measured: list[float], given: bool,
               against: str = "", also: tuple[str, list[float]] | None = None) -> list[str]:
    """The prediction's Kendall tau against `measured` (and over the pairs measured more than
    APART_PCT apart; `also`: a second order, labelled, to score it against), or which
    configurations it lacks; nothing where no prediction was `given`."""
    if all(g is not None for g in guesses):
        second = f", {kendall_tau(guesses, also[1]):.2f} {also[0]}" if also else ""
        return [f"  Kendall tau of the prediction: {kendall_tau(guesses, measured):.2f}{against} "
                f"({pair_tau(guesses, measured, APART_PCT)[0]:.2f} over the pairs more than "
                f"{APART_PCT:g}% apart){second}"]
    if given:
        return ["  no Kendall tau: no prediction for " + ", ".join(
            name for name, guess in zip(names, guesses) if guess is None)]
    return []


def _predicted_cell(guess: float | None) -> str:
    """A configuration's predicted mean E2E in the tables' last column ("-": none)."""
    return f"{guess:>9.3f}s" if guess is not None else f"{'-':>10}"


def read_predicted(path: Path) -> dict[tuple[str, float], float]:
    """A CSV of policy, rate, e2e_mean_s (lines starting with # are comments)."""
    try:
        table = pd.read_csv(path, comment="#")
        rows = [(str(p), float(r), float(v))
                for p, r, v in zip(table.policy, table.rate, table.e2e_mean_s)]
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, pd.errors.ParserError,
            pd.errors.EmptyDataError) as exc:
        raise WindowsError(f"{path}: not a CSV of policy, rate, e2e_mean_s ({exc})") from None
    out: dict[tuple[str, float], float] = {}
    for policy, rate, value in rows:
        if not value > 0:
            raise WindowsError(f"{path}: {policy} at {rate:g} req/s: no positive mean E2E")
        if (policy, rate) in out:
            raise WindowsError(f"{path}: {policy} at {rate:g} req/s appears twice")
        out[(policy, rate)] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", type=Path, nargs="*",
                    help="validate.csv of each window (spectune validate --engine vllm --out; "
                         "default: the ten windows measured on the EPYC VM, calibrated)")
    ap.add_argument("--plain", action="store_true",
                    help="without tables: the shipped windows simulated with the plain profile")
    ap.add_argument("--ranking", action="store_true",
                    help="vLLM's mean E2E per configuration and rate over the windows that "
                         "served all of them, instead of the targets")
    ap.add_argument("--predicted", type=Path,
                    help="with --ranking: a CSV of policy, rate, e2e_mean_s predicted by a tune")
    ap.add_argument("--anchor", metavar="CONFIGURATION",
                    help="with --ranking: over every window that served this configuration, "
                         "each one's mean E2E over the anchor's in the same window (geometric "
                         "mean over windows), instead of the windows that served all")
    args = ap.parse_args(argv)
    if (args.predicted or args.anchor) and not args.ranking:
        ap.error("--predicted and --anchor are read with --ranking")
    if args.plain and args.tables:
        ap.error("--plain picks the shipped windows' plain simulations: give tables or --plain")
    if args.ranking and not args.tables and not args.anchor:
        ap.error("--ranking compares windows that served the same configurations: give their "
                 "validate.csv (the shipped tables' windows: benchmarks/results/vllm-epyc/"
                 "tables-s4-calibrated.csv to tables-s7-calibrated.csv), or rank the shipped "
                 "windows through a configuration they all served (--anchor fixed:k=2)")
    if args.anchor and not args.tables and args.predicted is None:
        args.predicted = SHIPPED_PREDICTED  # the shipped windows, against the tune's prediction
    kind = "plain" if args.plain else "calibrated"
    tables = args.tables or [SHIPPED / f"{name}-{kind}.csv" for name in SHIPPED_WINDOWS]
    repeated = sorted({str(t) for t in tables if tables.count(t) > 1})
    if repeated:
        ap.error(f"{', '.join(repeated)} given twice: each window counts once")
    try:
        windows = [read_window(path) for path in tables]
        if args.ranking:
            predicted = read_predicted(args.predicted) if args.predicted else {}
            print(anchored(windows, predicted, args.anchor) if args.anchor
                  else ranking(windows, predicted))
        else:
            print(markdown(pool(windows)))
    except WindowsError as exc:
        print(f"vllm_windows: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

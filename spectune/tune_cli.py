"""`spectune tune` on the command line: flags, the recommendation table, JSON output."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from spectune.console import seconds
from spectune.tune import (
    SCENARIO_SHOWN,
    TUNE_SCENARIO,
    TuneSpec,
    replace_scenario_defaults,
    run_tune,
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    from simulator import SchedulerConfig
    from spectune.flags import add_dataclass_flags
    from spectune.simulate import SimulationSpec

    p = subparsers.add_parser(
        "tune", help="find the best speculation policy and parameters per request rate",
        description="Search each policy's parameters at each request rate over several seeds "
        "(successive halving), recommend the best with a 95% confidence interval, export the "
        "engines' draft-length tables (vLLM, TensorRT-LLM, SGLang) and write an HTML report. "
        "With no options: the Azure conversation trace (300 requests per seed), Llama-3.1-8B "
        "on H100 (roofline) drafting by n-gram lookup, acceptance from the shipped n-gram "
        "recording of SmolLM2 on Spec-Bench.")
    add_dataclass_flags(p, SimulationSpec, "scenario: workload, models, acceptance, SLOs",
                        skip=("rate", "policy", "seed"), shown={
                            **SCENARIO_SHOWN, "requests": f"{TUNE_SCENARIO['requests']} per "
                            "seed (seed i: the i-th window of a trace)"})
    p.set_defaults(**{k: None for k in TUNE_SCENARIO})
    add_dataclass_flags(p, TuneSpec, "search", skip=("rates",))
    p.add_argument("--rates", nargs="+", type=float, default=None, metavar="REQ_PER_S",
                   help=f"request rates (default: {' '.join(f'{r:g}' for r in TuneSpec.rates)})")
    add_dataclass_flags(p, SchedulerConfig, "scheduler (mirror the live engine's settings)",
                        shown={"k_max": f"{SchedulerConfig.k_max}; unset, a fixed k may go past "
                               "it up to the stated cap when the best sits on it"})
    p.set_defaults(k_max=None)
    p.add_argument("--out", type=Path, default=Path("runs/tune"),
                   help="folder for tune.json, evals/ (a rerun resumes), samples/, exports/ "
                        "and report.html")
    p.add_argument("--no-report", dest="report", action="store_false",
                   help="do not write report.html")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(args: argparse.Namespace) -> int:
    from simulator import SchedulerConfig
    from spectune.evaluate import progress_bar
    from spectune.files import prepare_out, to_json
    from spectune.flags import dataclass_from_args
    from spectune.simulate import SimulationSpec

    given = {k for k in TUNE_SCENARIO if getattr(args, k) is not None}
    fill = {k: getattr(args, k) if k in given else SimulationSpec.__dataclass_fields__[k].default
            for k in TUNE_SCENARIO}
    scenario = dataclass_from_args(SimulationSpec, args, **fill)
    scenario = replace_scenario_defaults(scenario, given)
    spec = dataclass_from_args(TuneSpec, args, rates=tuple(args.rates) if args.rates
                               else TuneSpec.rates)
    k_max_given = args.k_max is not None
    scheduler = dataclass_from_args(SchedulerConfig, args, **(
        {} if k_max_given else {"k_max": SchedulerConfig.k_max}))
    prepare_out(args.out)
    bar = progress_bar("tune")
    result = run_tune(spec, scenario, scheduler, args.out, bar, k_max_given=k_max_given)
    if bar is not None:
        print(file=sys.stderr)
    report = None
    if args.report:
        from spectune.report import write_report

        report = str(write_report(args.out))
    if args.format == "json":
        recs = [{k: r[k] for k in ("rate", "policy", "params", "objective", "ci_low", "ci_high")}
                for r in result["recommendations"]]
        table = result.get("engine_table")
        print(to_json({"recommendations": recs, "report": report,
                       "exports": {k: str(args.out / v) for k, v in result["exports"].items()},
                       "engine_table": table and {
                           "schedule": table["schedule"], "rates": [
                               {k: r[k] for k in ("rate", "objective",
                                                  "worse_than_recommended_pct")}
                               for r in table["rates"]]}}))
        return 0
    print(format_table(result))
    if result["exports"]:
        print("\nengine configs: " + ", ".join(str(args.out / v)
                                             for v in result["exports"].values()))
    for engine, why in result.get("export_problems", {}).items():
        print(f"no {engine} config: {why}")
    if report:
        print(f"report: {report}")
    return 0


def _value(v: float | None, unit: str) -> str:
    """A value with its unit (seconds as console.seconds writes them)."""
    if unit == "s":
        return seconds(v)
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:,.0f} {unit}"


def interval_text(row: dict, unit: str) -> str:
    """"[low, high]", or why there is none ("no interval (1 seed)")."""
    if row.get("ci_low") is None or row.get("ci_high") is None:
        return row.get("ci_method") or "no interval"
    return f"[{_value(row['ci_low'], unit)}, {_value(row['ci_high'], unit)}]"


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def format_table(result: dict) -> str:
    """The recommendation per rate. Columns are as wide as their widest cell, and the policy's
    parameters get a line of their own: nothing is ever cut."""
    m = result["meta"]
    unit = m["unit"]
    slo = ", ".join(f"{k} <= {v:g} s" for k, v in m["slo"].items()) or "none"
    methods = sorted({r.get("ci_method") for r in result["recommendations"]
                      if r.get("ci_low") is not None} - {None})
    ci_what = f"95% CI: {'; '.join(methods)}" if methods else "no interval"
    lines = [f"workload     {m['workload']}",
             f"latency      {m['latency_model']}",
             f"acceptance   {m['acceptance']}",
             f"objective    {m['objective']} ({m['objective_metric']}, "
             f"{'lower' if m['direction'] == 'min' else 'higher'} is better); SLO: {slo}; "
             f"{_seeds(len(m['seeds']))}, {ci_what}",
             f"search       {m['spec']['search']}: {m['simulations']} simulations "
             f"({m['reused_from_cache']} reused), {m['wall_s']:.0f} s", ""]
    fixed = {r["rate"]: r for r in result.get("best_fixed", [])}
    rows = []
    for r in result["recommendations"]:
        base = r["baseline"]["objective"]
        change = (f"{(r['objective'] - base) / base * 100:+.0f}%"
                  if base and math.isfinite(base) else "-")
        bf = fixed.get(r["rate"])
        rows.append((f"{r['rate']:g}", _value(r["objective"], unit), interval_text(r, unit),
                     _value(base, unit), change,
                     f"k={bf['params']['k']} ({_value(bf['objective'], unit)})" if bf else "-",
                     r["label"]))
    header = ("rate", "objective", "95% CI", "k=0", "vs k=0", "best fixed k")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]

    def line(cells) -> str:
        return "  ".join(c.rjust(w) if i < 5 else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines += [line(header), "-" * len(line(header))]
    for row in rows:
        lines += [line(row[:6]), f"{'':>{widths[0]}}  recommended: {row[6]}"]
    lines += _engine_table(result, unit)
    lines += _notes(result)
    return "\n".join(lines)


#: policies whose k an engine's config can hold (one k, or a k per batch size); the others
#: decide per request or per step (auto, goodput, ...), which no engine's config expresses
ENGINE_POLICIES = ("fixed", "batch_adaptive")


def _engine_table(result: dict, unit: str) -> list[str]:
    """The table the engine configs hold, priced at every rate against the recommendation."""
    from spectune.export_schedule import ranges_text

    table = result.get("engine_table")
    if not table:
        return []
    rows = [(f"{r['rate']:g}", _value(r["objective"], unit),
             "-" if r["worse_than_recommended_pct"] is None
             else f"{r['worse_than_recommended_pct']:+.1f}%") for r in table["rates"]]
    header = ("rate", "objective", "worse than recommended")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["", f"engine configs' table (batch size: k): {ranges_text(table['schedule'])}",
             "  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["-" * len(lines[-1])]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    beyond = [r for r in result["recommendations"] if r["policy"] not in ENGINE_POLICIES]
    if beyond:
        names = ", ".join(dict.fromkeys(r["label"] for r in beyond))
        rates = ", ".join(f"{r['rate']:g}" for r in beyond)
        lines.append(f"(at {rates} req/s the recommendation, {names}, changes k while serving, "
                     "per request or step by step, which no engine's config can hold: the "
                     "configs hold this table)")
    return lines


def _notes(result: dict) -> list[str]:
    """What the user must know about the search space (edges the best value sits on)."""
    notes = result.get("notes", [])
    return ["", *(f"note: {n}" for n in notes)] if notes else []

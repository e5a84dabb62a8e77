"""`spectune report FOLDER`: one self-contained HTML page of charts from what tune, plan and
validate wrote there, to look at (or mail) instead of reading JSON.

plotly.js is inlined once, so the page opens offline; bad input stops with a ReportError that
says which file is wrong and what to run, never with an empty page.
"""

from __future__ import annotations

import argparse
import html
import json
import numbers
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from spectune import charts

KNOWN = ("tune.json", "plan.json", "validate.json")
REQUEST_COLUMNS = ("request_id", "arrival_s", "first_token_s", "finish_s", "output_tokens")
TRACE_COLUMNS = ("time_s", "request_id", "k")
CONFIG = {"displaylogo": False, "responsive": True}


class ReportError(ValueError):
    """Bad or missing input: the message names the file and what to run."""


@dataclass
class Section:
    """One job's part of the page: a heading, where its numbers come from, charts and tables."""

    heading: str
    source: str
    parts: list[go.Figure | str] = field(default_factory=list)


def write_report(folder: Path, out: Path | None = None, title: str | None = None) -> Path:
    """Build the page from `folder` and write it atomically (default FOLDER/report.html)."""
    folder = Path(folder)
    docs = load_folder(folder)
    builders = {"tune.json": tune_section, "plan.json": plan_section,
                "validate.json": validate_section}
    sections = []
    for name, doc in docs.items():
        try:
            sections.append(builders[name](folder, doc))
        except (TypeError, KeyError, AttributeError) as exc:  # e.g. text where a number belongs
            raise ReportError(f"{folder / name}: unexpected content ({exc!r}); rewrite it with "
                              f"spectune {name.removesuffix('.json')} --out {folder}") from None
    page = render_page(title or f"spectune report: {folder.resolve().name}", sections)
    out = Path(out) if out is not None else folder / "report.html"
    _write_atomic(out, page)
    return out


# -- reading ------------------------------------------------------------------------------------


def load_folder(folder: Path) -> dict[str, dict]:
    """The job results present in `folder`, parsed; at least one, or a ReportError."""
    hint = f"run spectune tune/plan/validate --out {folder} first"
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such folder; {hint}")
    docs = {}
    for name in KNOWN:
        path = folder / name
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
                              f"it may be cut short or edited: run spectune "
                              f"{name.removesuffix('.json')} --out {folder} again") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"{path}: cannot read it ({exc})") from None
        if not isinstance(doc, dict):
            raise ReportError(f"{path}: expected a JSON object, found {type(doc).__name__}")
        docs[name] = doc
    if not docs:
        raise ReportError(f"{folder}: no tune.json, plan.json or validate.json; {hint}")
    return docs


def _need(doc: dict, key: str, kind: type, path: Path) -> Any:
    """doc[key] of the expected type, or a ReportError naming the file and the key."""
    value = doc.get(key)
    if not isinstance(value, kind):
        raise ReportError(f"{path}: missing or malformed '{key}' (expected a {kind.__name__}); "
                          f"rewrite it with spectune {path.stem} --out {path.parent}")
    return value


def _frame(items: list, columns: tuple[str, ...], where: str) -> pd.DataFrame:
    """A list of JSON objects as a DataFrame that has at least `columns`."""
    if not all(isinstance(i, dict) for i in items):
        raise ReportError(f"{where}: every entry must be a JSON object")
    return _has(pd.DataFrame(items), columns, where) if items else pd.DataFrame(items)


def _has(frame: pd.DataFrame, columns: tuple[str, ...], where: str) -> pd.DataFrame:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ReportError(f"{where}: no column {', '.join(missing)}; rewrite it with the "
                          "spectune job that made it")
    return frame


def read_csv(folder: Path, rel: Any, columns: tuple[str, ...], where: str) -> pd.DataFrame:
    """A CSV that a JSON file points to, checked for the columns the charts use."""
    if not isinstance(rel, str) or not rel:
        raise ReportError(f"{where}: expected a path relative to {folder}, found {rel!r}")
    path = folder / rel
    if not path.is_file():
        raise ReportError(f"{path}: named in {where} but missing; restore it or run the job "
                          f"again with --out {folder}")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not a readable CSV ({exc}); run the job again") from None
    return _has(frame, columns, f"{path} (named in {where})")


# -- sections -----------------------------------------------------------------------------------


def tune_section(folder: Path, doc: dict) -> Section:
    """Curves, heat map, k traces, CDFs and the recommendations of `spectune tune`."""
    path = folder / "tune.json"
    where = str(path)
    meta = _need(doc, "meta", dict, path)
    cands = _frame(_need(doc, "candidates", list, path),
                   ("rate", "policy", "label", "objective"), f"{where} candidates")
    recs = _frame(doc.get("recommendations") or [], ("rate", "label", "objective"),
                  f"{where} recommendations")
    slo = meta.get("slo") or {}
    metric, direction = meta.get("objective_metric", "objective"), meta.get("direction", "min")
    section = Section("Tuning: which policy and setting per arrival rate", tune_source(meta))
    if len(cands):
        cands = _with_ci(cands)
        best = charts.best_per_policy(cands, direction)
        section.parts += [charts.latency_vs_rate(best, metric, slo),
                          charts.objective_heatmap(best, metric, direction)]
    samples = _need(doc, "samples", list, path) if "samples" in doc else []
    traces, requests = _samples(folder, samples, f"{where} samples")
    if traces:
        section.parts.append(charts.k_over_time(traces))
    if requests:
        section.parts.append(charts.latency_cdfs(requests))
    if len(recs):
        section.parts.append(recommendations_table(recs, metric))
    exports = doc.get("exports") or {}
    if isinstance(exports, dict) and exports:
        listed = ", ".join(f"{html.escape(k)}: <code>{html.escape(str(v))}</code>"
                           for k, v in exports.items())
        section.parts.append(f"<p>Engine settings for the recommendations: {listed}</p>")
    return section


def _with_ci(cands: pd.DataFrame) -> pd.DataFrame:
    """Missing interval bounds (one seed) collapse to the point: no bar rather than an error."""
    for col in ("ci_low", "ci_high"):
        given = cands[col] if col in cands else pd.Series(float("nan"), index=cands.index)
        cands[col] = pd.to_numeric(given, errors="coerce").fillna(cands["objective"])
    if "metrics" not in cands:
        cands["metrics"] = [{} for _ in range(len(cands))]
    return cands


def _samples(folder: Path, samples: list, where: str) -> tuple[list, list]:
    """(title, k trace) and (title, requests) of each sample run that has them."""
    found: dict[str, list] = {"k_trace_csv": [], "requests_csv": []}
    columns = {"k_trace_csv": TRACE_COLUMNS, "requests_csv": REQUEST_COLUMNS}
    for i, s in enumerate(samples):
        name = f"{_dict(s).get('label', '?')} at {_num(_dict(s).get('rate'), 'g')} req/s"
        for key in (k for k in found if k in _dict(s)):
            found[key].append((name, read_csv(folder, s[key], columns[key], f"{where}[{i}].{key}")))
    return found["k_trace_csv"], found["requests_csv"]


def plan_section(folder: Path, doc: dict) -> Section:
    """Capacity per replica and attainment curves of `spectune plan`."""
    path = folder / "plan.json"
    where = str(path)
    meta = _need(doc, "meta", dict, path)
    plans = _frame(_need(doc, "plans", list, path),
                   ("label", "hardware", "max_rate_per_replica"), f"{where} plans")
    curves = _frame(doc.get("curves") or [], ("label", "hardware", "rate", "slo_attainment"),
                    f"{where} curves")
    section = Section("Capacity planning: replicas needed per policy and hardware",
                      plan_source(meta))
    for col in ("replicas_needed", "cost_per_hour"):
        if len(plans) and col not in plans:
            plans[col] = None
    if len(plans) and plans["max_rate_per_replica"].notna().any():
        section.parts.append(charts.capacity_bars(plans, meta.get("target_rate")))
    if len(curves):
        section.parts.append(charts.attainment_curves(curves, meta.get("attainment_target")))
    if len(plans):
        section.parts.append(plans_table(plans))
    return section


def validate_section(folder: Path, doc: dict) -> Section:
    """Simulated against measured, from `spectune validate`."""
    path = folder / "validate.json"
    where = str(path)
    rows = _frame(_need(doc, "rows", list, path),
                  ("policy", "rate", "metric", "simulated", "measured"), f"{where} rows")
    section = Section("Validation: simulator against the live engine",
                      validate_source(doc.get("meta") or {}))
    if len(rows):
        if "error_pct" not in rows:
            rows["error_pct"] = (rows["simulated"] - rows["measured"]) / rows["measured"] * 100
        rows = rows.dropna(subset=["simulated", "measured"])
        section.parts += [charts.validate_scatter(rows), errors_table(rows)]
    return section


# -- text and tables ----------------------------------------------------------------------------


def _esc(v: Any) -> str:
    return html.escape(str(v))


def _num(v: Any, fmt: str = ".3g") -> str:
    """A number for a sentence or a table cell; '-' where it is missing (null, NaN, text)."""
    return format(v, fmt) if isinstance(v, numbers.Real) and v == v else "-"


def _money(v: Any) -> str:
    return "-" if _num(v) == "-" else f"${v:,.2f}"


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _slo_text(slo: dict) -> str:
    bounds = [f"{k.removesuffix('_s').upper()} &le; {v:g} s" for k, v in slo.items()
              if isinstance(v, numbers.Real)]
    return ", ".join(bounds) or "none"


def _meta_text(meta: dict, *keys: str) -> dict[str, str]:
    return {k: _esc(meta.get(k, "?")) for k in keys}


def tune_source(meta: dict) -> str:
    m = _meta_text(meta, "workload", "latency_model", "acceptance", "objective",
                   "objective_metric", "seeds", "created")
    better = {"min": "lower", "max": "higher"}.get(meta.get("direction"), "?")
    return (f"Simulated workload <b>{m['workload']}</b> with latency model "
            f"{m['latency_model']} and acceptance {m['acceptance']}. Objective: "
            f"{m['objective']} ({m['objective_metric']}, {better} is better) over seeds "
            f"{m['seeds']}; intervals are across seeds. SLO: {_slo_text(_dict(meta.get('slo')))}."
            f" Made {m['created']} in {_num(meta.get('wall_s'))} s.")


def plan_source(meta: dict) -> str:
    m = _meta_text(meta, "workload", "acceptance", "created")
    rate = meta.get("target_rate")
    target = (f"target rate {_num(rate)} req/s" if isinstance(rate, numbers.Real)
              else "no target rate, so no replica counts")
    return (f"Simulated workload <b>{m['workload']}</b> with acceptance {m['acceptance']}. A "
            f"replica's capacity is the highest rate at which at least "
            f"{_num(meta.get('attainment_target'), '.1%')} of requests meet the SLO "
            f"({_slo_text(_dict(meta.get('slo')))}); {target}. Made {m['created']} in "
            f"{_num(meta.get('wall_s'))} s.")


def validate_source(meta: dict) -> str:
    m = _meta_text(meta, "model", "drafter", "profile")
    drift = _esc(_dict(meta.get("drift")).get("note", "?"))
    return (f"Live runs of {m['model']} with drafter {m['drafter']}, each simulated with the "
            f"same workload, scheduler and acceptance. Latency profile: {m['profile']}. Drift: "
            f"{drift}. Error = (simulated - measured) / measured.")


def table(rows: list[dict], caption: str) -> str:
    """Formatted cells as an HTML table with a caption (pandas escapes the cells)."""
    body = pd.DataFrame(rows).to_html(index=False, border=0, na_rep="-")
    return body.replace("<thead>", f"<caption>{_esc(caption)}</caption><thead>", 1)


def recommendations_table(recs: pd.DataFrame, metric: str) -> str:
    rows = []
    for r in recs.sort_values("rate").to_dict("records"):
        m, base = _dict(r.get("metrics")), _dict(r.get("baseline"))
        b = base.get("objective")
        change = (r["objective"] - b) / b if isinstance(b, numbers.Real) and b else None
        rows.append({"rate (req/s)": _num(r["rate"]), "recommended": r["label"],
                     f"{metric} [95% CI]": f"{_num(r['objective'])} [{_num(r.get('ci_low'))}, "
                     f"{_num(r.get('ci_high'))}]",
                     "baseline": f"{base.get('label', '-')}: {_num(b)}",
                     "change": _num(change, "+.1%"), "p99 E2E (s)": _num(m.get("e2e_p99_s")),
                     "p99 TPOT (s)": _num(m.get("tpot_p99_s")),
                     "SLO attainment": _num(m.get("slo_attainment"), ".1%"),
                     "goodput (tokens/s)": _num(m.get("goodput_tokens_per_s"), ",.0f")})
    return table(rows, "Recommendations per arrival rate")


def plans_table(plans: pd.DataFrame) -> str:
    rows = []
    for p in plans.to_dict("records"):
        checks = {s: _dict(_dict(p.get("checks")).get(s)) for s in ("below", "above")}
        rows.append({"policy": p["label"], "hardware": p["hardware"],
                     "max rate per replica (req/s)": _num(p["max_rate_per_replica"]),
                     "replicas needed": _num(p.get("replicas_needed"), "g"),
                     "cost per hour": _money(p.get("cost_per_hour")),
                     **{f"check just {s}": f"{_num(c.get('rate'))} req/s: "
                        f"{_num(c.get('slo_attainment'), '.1%')}" for s, c in checks.items()}})
    return table(rows, "Plans (checks: SLO attainment simulated either side of the capacity)")


def errors_table(rows: pd.DataFrame) -> str:
    err = rows.assign(abs_err=rows["error_pct"].abs()).groupby("metric", sort=False)["abs_err"]
    return table([{"metric": charts.metric_title(m), "mean |error| (%)": _num(g.mean(), ".1f"),
                   "worst |error| (%)": _num(g.max(), ".1f"), "runs": g.count()}
                  for m, g in err], "Error per metric across policies and rates")


# -- page ---------------------------------------------------------------------------------------

STYLE = """body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;
margin:24px auto;max-width:1320px;color:#222;padding:0 16px}h1{font-size:1.6em}
h2{margin-top:2em;border-bottom:1px solid #ddd}p.src{color:#444;max-width:75em}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}caption{text-align:left;
font-weight:600;padding:4px 0}th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f4f4f4}td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}.chart{margin:1em 0}"""


def render_page(title: str, sections: list[Section]) -> str:
    """One HTML document: plotly.js inline in the first chart only, the rest reuse it."""
    body, first = [], True
    for s in sections:
        body.append(f"<h2>{_esc(s.heading)}</h2><h3>Where these numbers come from</h3>"
                    f"<p class=\"src\">{s.source}</p>")
        for part in s.parts:
            if isinstance(part, go.Figure):
                div = part.to_html(full_html=False, include_plotlyjs=first, config=CONFIG)
                body.append(f"<div class=\"chart\">{div}</div>")
                first = False
            else:
                body.append(part)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{_esc(title)}</h1>{''.join(body)}</body></html>\n")


def _write_atomic(out: Path, text: str) -> None:
    """Temp file in the same folder, then os.replace: never a half-written report."""
    if not out.parent.is_dir():
        raise ReportError(f"--out {out}: folder {out.parent} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- CLI ----------------------------------------------------------------------------------------


def add_report_parser(sub) -> argparse.ArgumentParser:
    """Register `spectune report` on the CLI's subparsers."""
    p = sub.add_parser("report", help="one HTML page of charts from tune/plan/validate output",
                       description="Read tune.json, plan.json and/or validate.json (and the "
                       "sample CSVs they name) from FOLDER and write one self-contained HTML "
                       "page of charts (opens offline).")
    p.add_argument("folder", type=Path, metavar="FOLDER",
                   help="the --out folder of spectune tune, plan or validate")
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="where to write the page (default: FOLDER/report.html)")
    p.add_argument("--title", default=None, help="page title (default: from the folder name)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(handler=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    print(write_report(args.folder, args.out, args.title))
    return 0

"""`spectune report FOLDER`: one self-contained HTML page of charts from what tune, plan and
validate wrote there, to look at (or mail) instead of reading JSON.

plotly.js is inlined once, so the page opens offline; bad input stops with a ReportError that
says which file is wrong and what to run, never with an empty page.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from spectune import charts, charts_samples, charts_speedup
from spectune.report_html import (
    Section,
    _dict,
    _num,
    errors_table,
    plan_source,
    plans_table,
    recommendations_table,
    render_page,
    tune_source,
    validate_source,
)

KNOWN = ("tune.json", "plan.json", "validate.json")
REQUEST_COLUMNS = ("request_id", "arrival_s", "first_token_s", "finish_s", "output_tokens")
TRACE_COLUMNS = ("time_s", "request_id", "k")
DRAFTS_COLUMNS = ("time_s", "request_id", "drafted")


class ReportError(ValueError):
    """Bad or missing input: the message names the file and what to run."""


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
    if folder.is_file() and folder.name in KNOWN:
        raise ReportError(f"{folder}: a file; give its folder: spectune report {folder.parent}")
    if folder.exists() and not folder.is_dir():
        raise ReportError(f"{folder}: a file, not a folder; give a folder written by spectune "
                          f"tune, plan or validate (with {', '.join(KNOWN)})")
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
        section.parts += rate_charts(cands, metric, direction, slo)
    samples = _need(doc, "samples", list, path) if "samples" in doc else []
    traces, requests = _samples(folder, samples, f"{where} samples")
    if traces:
        section.parts.append(charts_samples.k_over_time(traces))
    if requests:
        section.parts.append(charts_samples.latency_cdfs(requests))
    if len(recs):
        section.parts.append(recommendations_table(recs, metric))
    exports = doc.get("exports") or {}
    if isinstance(exports, dict) and exports:
        listed = ", ".join(f"{html.escape(k)}: <code>{html.escape(str(v))}</code>"
                           for k, v in exports.items())
        table = _engine_table(doc, metric, meta.get("unit", ""))
        section.parts.append(f"<p>Engine settings: {listed}{table}</p>")
    section.parts += _listed("Not written", [f"{engine}: {why}" for engine, why in
                                             (doc.get("export_problems") or {}).items()])
    section.parts += _listed("Notes on the search", doc.get("notes") or [])
    return section


def _engine_table(doc: dict, metric: str, unit: str) -> str:
    """What the engine settings hold (a k per batch size) and what they are predicted to give."""
    from spectune.export_schedule import ranges_text
    from spectune.tune import against, figure

    table = doc.get("engine_table")
    if not isinstance(table, dict) or not table.get("rates"):
        return ""
    priced = "; ".join(f"{r['rate']:g} req/s: {figure(r['objective'], unit)} "
                       f"({against(r['worse_than_recommended_pct'])})" for r in table["rates"])
    steps = html.escape(ranges_text(table["schedule"]))
    return (f". They hold one table of k by batch size ({steps}), built from the best fixed k "
            f"at each rate; its {html.escape(metric)}, simulated on the same seeds: "
            f"{html.escape(priced)}")


def _listed(title: str, items: list) -> list[str]:
    """An HTML list under a bold title; nothing for no items."""
    if not items:
        return []
    rows = "".join(f"<li>{html.escape(str(item))}</li>" for item in items)
    return [f"<p><b>{html.escape(title)}</b></p><ul>{rows}</ul>"]


def rate_charts(cands: pd.DataFrame, metric: str, direction: str, slo: dict) -> list:
    """Per rate: each policy's best with k=0 beside it, the speed-up over k=0, the heat map.
    k=0 has its own line because it is the comparison a reader wants first, also where it is
    not the best fixed k. `cands`: tune.json's candidates as a frame."""
    cands = _with_ci(cands.copy())
    best = charts.best_per_policy(cands, direction)
    baseline = charts.baseline_per_rate(cands)
    parts = [charts.latency_vs_rate(best, metric, slo, baseline)]
    speed = charts_speedup.speedups(best, baseline, direction)
    if len(speed):
        parts.append(charts_speedup.speedup_vs_rate(speed, metric, direction))
    return [*parts, charts.objective_heatmap(best, metric, direction)]


def _with_ci(cands: pd.DataFrame) -> pd.DataFrame:
    """Missing interval bounds (one seed) collapse to the point: no bar rather than an error."""
    for col in ("ci_low", "ci_high"):
        given = cands[col] if col in cands else pd.Series(float("nan"), index=cands.index)
        cands[col] = pd.to_numeric(given, errors="coerce").fillna(cands["objective"])
    if "metrics" not in cands:
        cands["metrics"] = [{} for _ in range(len(cands))]
    return cands


def _samples(folder: Path, samples: list, where: str) -> tuple[list, list]:
    """(title, k trace) and (title, requests) of each sample run that has them. The k trace is
    drafts.csv (k drafted per step) where the run wrote one, else k_trace.csv (k chosen);
    runs that never drafted (k=0) have no k to show."""
    traces, requests = [], []
    for i, s in enumerate(map(_dict, samples)):
        name = f"{s.get('label', '?')} at {_num(s.get('rate'), 'g')} req/s"
        key = next((k for k in ("drafts_csv", "k_trace_csv") if k in s), None)
        if key is not None:
            columns = DRAFTS_COLUMNS if key == "drafts_csv" else TRACE_COLUMNS
            trace = read_csv(folder, s[key], columns, f"{where}[{i}].{key}")
            if trace[charts_samples.k_column(trace)].any():
                traces.append((name, trace))
        if "requests_csv" in s:
            requests.append((name, read_csv(folder, s["requests_csv"], REQUEST_COLUMNS,
                                            f"{where}[{i}].requests_csv")))
    return traces, requests


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

"""The report's HTML: where-the-numbers-come-from sentences, tables and the page itself.

Every table and sentence formats missing values as '-', never as 'nan' or a traceback, and
escapes what came from files (labels, paths) before it reaches the page.
"""

from __future__ import annotations

import html
import numbers
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from spectune import charts

CONFIG = {"displaylogo": False, "responsive": True}


@dataclass
class Section:
    """One job's part of the page: a heading, where its numbers come from, charts and tables."""

    heading: str
    source: str
    parts: list[go.Figure | str] = field(default_factory=list)



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
    m = _meta_text(meta, "model", "drafter", "profile", "weights")
    drift = _esc(_dict(meta.get("drift")).get("note", "?"))
    replay = _dict(meta.get("replay"))
    acceptance = (f" Acceptance replayed from {_esc(replay.get('acceptance', '?'))} "
                  f"({_esc(replay.get('source', '?'))}) in the live runs and the simulations."
                  if replay else "")
    return (f"Live runs of {m['model']} ({m['weights']} weights) with drafter {m['drafter']}, "
            f"each simulated with the same workload, scheduler and acceptance.{acceptance} "
            f"Latency profile: {m['profile']}. Drift: {drift}. Error = (simulated - measured) "
            f"/ measured.")


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

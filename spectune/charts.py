"""Plotly figures for `spectune report`, from plain data (dicts, DataFrames), no file access.

Each function answers one question a reader would rather see than read; `report.py` decides
which apply. Long series are thinned so the page stays small and fast to open.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

#: at most this many points per trace: a browser draws thousands fast, millions slowly
MAX_POINTS = 2000
PALETTE = qualitative.Plotly + qualitative.D3
LATENCY_KEYS = ("ttft", "tpot", "e2e")
WHAT = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def metric_title(metric: str) -> str:
    """'e2e_p99_s' -> 'p99 E2E (s)': axis titles that carry their unit."""
    parts = metric.split("_")
    if parts[0] in WHAT and len(parts) == 3 and parts[2] == "s":
        return f"{parts[1]} {WHAT[parts[0]]} (s)"
    named = {"throughput_tokens_per_s": "throughput (tokens/s)",
             "goodput_tokens_per_s": "goodput (tokens/s)",
             "slo_attainment": "SLO attainment (share of requests)",
             "mean_k": "mean k (drafted tokens)", "emitted_per_step": "emitted tokens per step",
             "drafted_per_step": "drafted tokens per step",
             "mean_emitted_per_step": "emitted tokens per step"}
    return named.get(metric, metric.replace("_", " "))


def colours(keys: Iterable[str]) -> dict[str, str]:
    """One fixed colour per key, so a policy looks the same in every chart."""
    return {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(dict.fromkeys(keys))}


def thin(frame: pd.DataFrame, limit: int = MAX_POINTS) -> pd.DataFrame:
    """Every n-th row (keeping the last) when a series is longer than `limit`."""
    if len(frame) <= limit:
        return frame
    idx = np.unique(np.r_[np.linspace(0, len(frame) - 1, limit).astype(int), len(frame) - 1])
    return frame.iloc[idx]


def _fmt(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.3g}"


def small(text: str) -> str:
    """A title's second line: how to read the chart, in a smaller font."""
    return f"<span style='font-size:12px'>{text}</span>"


def layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    """Shared look; a two-line title (how to read the chart) gets room above the panels."""
    top = 110 if "<br>" in title else 80
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      margin={"t": top, "l": 70, "r": 30, "b": 60},
                      legend={"title": {"text": ""}}, hoverlabel={"namelength": -1})
    return fig


# -- tune ---------------------------------------------------------------------------------------

BASELINE_LABEL = "fixed(k=0)"
BASELINE_NAME = "plain decoding, fixed(k=0)"
#: k=0 is the reference every policy is read against: dark, dashed, crosses
BASELINE_STYLE = {"color": "#222222", "dash": "dash", "symbol": "x"}
#: a marker and a dash per policy, on top of its colour, so lines that coincide stay told apart
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "star", "hexagon", "triangle-down")
DASHES = ("solid", "dot", "dashdot", "longdash", "longdashdot")
#: an error bar reaching past this many times the largest point is cut at the panel's top
BAR_CUT = 2.5
def seed_count(seeds) -> int:
    """A row's number of seeds: tune writes a count; a list of seed ids counts by its length."""
    if isinstance(seeds, (list, tuple)):
        return len(seeds)
    return int(seeds) if isinstance(seeds, numbers.Real) and math.isfinite(seeds) else 0


def full_seed(cands: pd.DataFrame) -> pd.DataFrame:
    """The rows that ran on every seed of their rate. Successive halving drops candidates after
    the first seed; their means are over fewer trace windows, so ranking them with the
    survivors (or dividing k=0 by them) would compare workloads, not policies."""
    if "seeds" not in cands or not len(cands):
        return cands
    n = cands["seeds"].map(seed_count)
    return cands[n == n.groupby(cands["rate"]).transform("max")]


def is_baseline(cands: pd.DataFrame) -> pd.Series:
    """Plain decoding: fixed with k=0, by its parameters or, where they are missing, its label."""
    params = cands["params"] if "params" in cands else pd.Series(None, index=cands.index)
    k0 = params.map(lambda p: isinstance(p, dict) and p.get("k") == 0)
    return ((cands["policy"] == "fixed") & k0) | (cands["label"] == BASELINE_LABEL)


def best_per_policy(cands: pd.DataFrame, direction: str) -> pd.DataFrame:
    """The best candidate of each policy at each rate, among those that ran on every seed: a
    policy's curve at its own best setting."""
    ok = full_seed(cands.dropna(subset=["objective"]))
    pick = ok.groupby(["policy", "rate"])["objective"]
    idx = pick.idxmin() if direction == "min" else pick.idxmax()
    return ok.loc[idx.values].sort_values(["policy", "rate"]).reset_index(drop=True)


def baseline_per_rate(cands: pd.DataFrame) -> pd.DataFrame:
    """k=0 at each rate (its row that ran on every seed), by rate: the line every chart keeps,
    whether or not it is the best fixed k."""
    ok = full_seed(cands.dropna(subset=["objective"]))
    base = ok[is_baseline(ok)].drop_duplicates("rate")
    return base.sort_values("rate").reset_index(drop=True)


def series_styles(policies: Iterable[str]) -> dict[str, dict]:
    """Colour, marker and dash per policy, plus k=0's: the same in every tune chart."""
    styles = {p: {"color": c, "symbol": SYMBOLS[i % len(SYMBOLS)], "dash": DASHES[i % len(DASHES)]}
              for i, (p, c) in enumerate(colours(policies).items())}
    styles[BASELINE_NAME] = BASELINE_STYLE
    return styles


def dodge(rates: Iterable[float], n: int) -> list[float]:
    """x offsets that set n series at the same rates side by side, so coinciding points and
    their error bars stay visible: 2% of the rate span apart, a third of the closest two
    rates' gap at most in all. Hover shows the true rate."""
    r = np.unique(np.asarray(list(rates), dtype=float))
    if not len(r) or n < 2:
        return [0.0] * n
    step = 0.02 * ((r[-1] - r[0]) if len(r) > 1 else r[0])
    if len(r) > 1:
        step = min(step, float(np.diff(r).min()) / 3 / (n - 1))
    return [(i - (n - 1) / 2) * step for i in range(n)]


def axis_top(points: Iterable[float], highs: Iterable[float]) -> float | None:
    """A y-axis top for a panel where an error bar would squash the curves to a flat line (a
    wide interval from two seeds, an unbounded ratio): BAR_CUT times the largest point, the
    longer bars running off the top. None: plotly's own range shows everything."""
    p, h = np.asarray(list(points), dtype=float), np.asarray(list(highs), dtype=float)
    p, h = p[np.isfinite(p)], h[~np.isnan(h)]
    if not len(p) or not len(h) or p.max() <= 0 or h.max() <= BAR_CUT * p.max():
        return None
    return BAR_CUT * p.max() * 1.05


def _series(best: pd.DataFrame, baseline: pd.DataFrame | None) -> list[tuple[str, pd.DataFrame]]:
    """(name, rows by rate) per policy, then k=0's."""
    out = list(best.groupby("policy", sort=False))
    if baseline is not None and len(baseline):
        out.append((BASELINE_NAME, baseline))
    return out


def line_trace(g: pd.DataFrame, name: str, style: dict, dx: float) -> dict:
    """What a rate-axis trace of one series has in common in every panel."""
    return {"x": g["rate"] + dx, "customdata": g["rate"], "text": g["label"], "name": name,
            "legendgroup": name, "mode": "lines+markers",
            "line": {"color": style["color"], "dash": style["dash"], "width": 2},
            "marker": {"symbol": style["symbol"], "size": 9, "color": style["color"],
                       "line": {"width": 1, "color": "white"}}}


def _ci_text(frames: Iterable[pd.DataFrame]) -> str:
    """'95% CI' with its method where tune.json names one (e.g. log-normal over seeds)."""
    methods = set()
    for g in frames:
        if "ci_method" in g:
            methods.update(m for m in g["ci_method"] if isinstance(m, str) and "no interval"
                           not in m)
    return "95% CI" + (f", {' / '.join(sorted(methods))}" if methods else "")


def latency_vs_rate(best: pd.DataFrame, objective_metric: str, slo: dict,
                    baseline: pd.DataFrame | None = None) -> go.Figure:
    """Objective (with its confidence interval) and tail latencies against load, per policy and
    for plain decoding (k=0, dashed), with the SLO as a horizontal line where it applies."""
    panels = list(dict.fromkeys([objective_metric, "e2e_p99_s", "tpot_p99_s"]))
    if slo.get("ttft_s") is not None and "ttft_p99_s" not in panels:
        panels.append("ttft_p99_s")
    cols = min(len(panels), 2)
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[metric_title(p) for p in panels],
                        horizontal_spacing=0.08, vertical_spacing=0.14)
    series = _series(best, baseline)
    style = series_styles(best["policy"])
    offsets = dodge(pd.concat([g["rate"] for _, g in series]), len(series))
    cut = False
    for i, metric in enumerate(panels):
        r, c = divmod(i, cols)
        for (name, g), dx in zip(series, offsets):
            y = g["objective"] if metric == objective_metric else g["metrics"].map(
                lambda m, k=metric: m.get(k) if isinstance(m, dict) else None)
            err = None
            if metric == objective_metric:
                err = {"type": "data", "array": g["ci_high"] - g["objective"],
                       "arrayminus": g["objective"] - g["ci_low"], "thickness": 1.5, "width": 5}
            fig.add_scatter(y=y, error_y=err, showlegend=i == 0, row=r + 1, col=c + 1,
                            **line_trace(g, name, style[name], dx),
                            hovertemplate="%{text}<br>rate %{customdata:g} req/s<br>%{y:.4g}"
                            "<extra></extra>")
        _slo_line(fig, metric, slo, r + 1, c + 1)
        top = None if metric != objective_metric else axis_top(
            pd.concat([g["objective"] for _, g in series]),
            pd.concat([g["ci_high"] for _, g in series]))
        cut = cut or top is not None
        fig.update_xaxes(title_text="arrival rate (req/s)", row=r + 1, col=c + 1)
        fig.update_yaxes(title_text=metric_title(metric), rangemode="tozero", row=r + 1, col=c + 1,
                         range=None if top is None else [0, top])
    note = "; bars cut at the top run beyond it" if cut else ""
    bars = small(f"bars: {_ci_text(g for _, g in series)}{note}")
    return layout(fig, "Latency vs arrival rate (best setting of each policy, and plain "
                   f"decoding k=0 dashed)<br>{bars}", 360 * rows + 100)


def _slo_line(fig: go.Figure, metric: str, slo: dict, row: int, col: int) -> None:
    """The SLO threshold on the panel of the latency it bounds (ttft_s on TTFT, tpot_s on TPOT)."""
    key = metric.split("_")[0]
    bound = slo.get(f"{key}_s") if key in ("ttft", "tpot") else None
    if bound is not None:
        fig.add_hline(y=bound, line={"dash": "dash", "color": "crimson", "width": 1.5},
                      annotation_text=f"SLO {WHAT[key]} {bound:g} s", row=row, col=col)


def objective_heatmap(best: pd.DataFrame, objective_metric: str, direction: str) -> go.Figure:
    """Policy x rate at a glance: which policy wins where (the best setting of each)."""
    table = best.pivot_table(index="policy", columns="rate", values="objective", aggfunc="first")
    text = [[_fmt(v) for v in row] for row in table.to_numpy(dtype=float)]
    better = "lower" if direction == "min" else "higher"
    scale = "Viridis_r" if direction == "min" else "Viridis"
    fig = go.Figure(go.Heatmap(
        z=table.to_numpy(dtype=float), x=[f"{r:g}" for r in table.columns],
        y=list(table.index), text=text, texttemplate="%{text}", colorscale=scale,
        colorbar={"title": {"text": metric_title(objective_metric)}},
        hovertemplate="%{y} at %{x} req/s<br>%{z:.4g}<extra></extra>"))
    fig.update_xaxes(title_text="arrival rate (req/s)", type="category")
    fig.update_yaxes(title_text="policy")
    return layout(fig, f"Objective by policy and rate: {metric_title(objective_metric)}, "
                   f"{better} is better", 120 + 60 * max(len(table.index), 3))


# -- plan ---------------------------------------------------------------------------------------


def capacity_bars(plans: pd.DataFrame, target_rate: float | None) -> go.Figure:
    """How much load one replica takes within the SLO, and so how many replicas (and what cost)
    the target rate needs, per policy and hardware."""
    fig = go.Figure()
    colour = colours(plans["hardware"])
    for hw, g in plans.groupby("hardware", sort=False):
        fig.add_bar(x=g["label"], y=g["max_rate_per_replica"], name=hw,
                    marker_color=colour[hw], text=[_capacity_text(p) for p in g.itertuples()],
                    textposition="outside", cliponaxis=False,
                    hovertemplate="%{x} on " + hw + "<br>%{y:.3g} req/s per replica"
                    "<extra></extra>")
    target = f" (target {target_rate:g} req/s)" if target_rate else ""
    fig.update_layout(barmode="group", uniformtext={"minsize": 9})
    fig.update_xaxes(title_text="policy")
    fig.update_yaxes(title_text="max rate per replica within SLO (req/s)", rangemode="tozero")
    return layout(fig, f"Capacity per replica{target}", 460)


def _capacity_text(p) -> str:
    bits = [f"{p.max_rate_per_replica:.3g} req/s"]
    if _present(p.replicas_needed):
        bits.append(f"{int(p.replicas_needed)} replicas")
    if _present(getattr(p, "cost_per_hour", None)):
        bits.append(f"${p.cost_per_hour:,.2f}/h")
    return "<br>".join(bits)


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def attainment_curves(curves: pd.DataFrame, target: float | None) -> go.Figure:
    """Where each policy falls off the SLO as load grows; the capacity is where it crosses
    the target."""
    fig = go.Figure()
    curves = curves.assign(name=curves["label"] + " on " + curves["hardware"])
    colour = colours(curves["name"])
    for name, g in curves.sort_values("rate").groupby("name", sort=False):
        fig.add_scatter(x=g["rate"], y=g["slo_attainment"], mode="lines+markers", name=name,
                        line={"color": colour[name]},
                        hovertemplate=f"{name}<br>%{{x:g}} req/s: %{{y:.2%}} within SLO"
                        "<extra></extra>")
    if target is not None:
        fig.add_hline(y=target, line={"dash": "dash", "color": "crimson", "width": 1.5},
                      annotation_text=f"target {target:.1%}")
    fig.update_xaxes(title_text="arrival rate per replica (req/s)")
    fig.update_yaxes(title_text="SLO attainment (share of requests)", tickformat=".0%")
    return layout(fig, "SLO attainment vs arrival rate", 460)


# -- validate -----------------------------------------------------------------------------------

FAMILIES = (("latency", "latency (s)", True), ("per_step", "tokens per step", False),
            ("throughput", "throughput (tokens/s)", False))


def metric_family(metric: str) -> str:
    if metric.endswith("_per_s"):
        return "throughput"
    return "latency" if metric.endswith("_s") else "per_step"


def validate_scatter(rows: pd.DataFrame) -> go.Figure:
    """Does the simulator agree with the live engine? Points on the diagonal agree; the band is
    +/-10%."""
    rows = rows.assign(family=rows["metric"].map(metric_family))
    present = [f for f in FAMILIES if (rows["family"] == f[0]).any()]
    fig = make_subplots(rows=1, cols=len(present), subplot_titles=[t for _, t, _ in present],
                        horizontal_spacing=0.08)
    colour = colours(rows["metric"])
    for col, (family, title, log) in enumerate(present, start=1):
        part = rows[rows["family"] == family]
        _diagonal(fig, part, log, col)
        for metric, g in part.groupby("metric", sort=False):
            fig.add_scatter(x=g["measured"], y=g["simulated"], mode="markers",
                            name=metric_title(metric),
                            marker={"color": colour[metric], "size": 9}, row=1, col=col,
                            customdata=g[["policy", "rate", "error_pct"]].to_numpy(),
                            hovertemplate=f"{metric}<br>%{{customdata[0]}} at "
                            "%{customdata[1]:g} req/s<br>measured %{x:.4g}, simulated "
                            "%{y:.4g}<br>error %{customdata[2]:+.1f}%<extra></extra>")
        kind = "log" if log else "linear"
        fig.update_xaxes(title_text=f"measured {title}", type=kind, row=1, col=col)
        fig.update_yaxes(title_text=f"simulated {title}", type=kind, row=1, col=col)
    fig.update_layout(legend={"traceorder": "normal"})  # fill="tonexty" would reverse it
    return layout(fig, "Simulated vs measured (diagonal: agreement; band: +/-10%)", 480)


def _diagonal(fig: go.Figure, part: pd.DataFrame, log: bool, col: int) -> None:
    """y = x and a +/-10% band over the data's range."""
    vals = pd.concat([part["measured"], part["simulated"]]).to_numpy(dtype=float)
    vals = vals[np.isfinite(vals) & ((vals > 0) if log else True)]
    if not len(vals):
        return
    lo, hi = vals.min() * 0.8, vals.max() * 1.2
    x = np.geomspace(lo, hi, 50) if log and lo > 0 else np.linspace(min(lo, 0), hi, 50)
    band = {"mode": "lines", "line": {"width": 0}, "hoverinfo": "skip", "showlegend": False,
            "legendgroup": "band"}
    fig.add_scatter(x=x, y=x * 0.9, row=1, col=col, **band)
    fig.add_scatter(x=x, y=x * 1.1, fill="tonexty", fillcolor="rgba(120,120,120,0.15)",
                    row=1, col=col, **band)
    fig.add_scatter(x=x, y=x, mode="lines", line={"color": "grey", "dash": "dot"},
                    name="y = x", showlegend=col == 1, hoverinfo="skip", row=1, col=col)

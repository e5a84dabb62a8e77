"""Plotly figures for `spectune report`, from plain data (dicts, DataFrames), no file access.

Each function answers one question a reader would rather see than read; `report.py` decides
which apply. Long series are thinned so the page stays small and fast to open.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

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


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      margin={"t": 80, "l": 70, "r": 30, "b": 60},
                      legend={"title": {"text": ""}}, hoverlabel={"namelength": -1})
    return fig


# -- tune ---------------------------------------------------------------------------------------


def best_per_policy(cands: pd.DataFrame, direction: str) -> pd.DataFrame:
    """The best candidate of each policy at each rate: a policy's curve at its own best setting."""
    ok = cands.dropna(subset=["objective"])
    pick = ok.groupby(["policy", "rate"])["objective"]
    idx = pick.idxmin() if direction == "min" else pick.idxmax()
    return ok.loc[idx.values].sort_values(["policy", "rate"]).reset_index(drop=True)


def latency_vs_rate(best: pd.DataFrame, objective_metric: str, slo: dict) -> go.Figure:
    """Objective (with its confidence interval) and tail latencies against load, per policy,
    with the SLO as a horizontal line where it applies."""
    panels = list(dict.fromkeys([objective_metric, "e2e_p99_s", "tpot_p99_s"]))
    if slo.get("ttft_s") is not None and "ttft_p99_s" not in panels:
        panels.append("ttft_p99_s")
    cols = min(len(panels), 2)
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[metric_title(p) for p in panels],
                        horizontal_spacing=0.08, vertical_spacing=0.14)
    colour = colours(best["policy"])
    for i, metric in enumerate(panels):
        r, c = divmod(i, cols)
        for policy, g in best.groupby("policy", sort=False):
            y = g["objective"] if metric == objective_metric else g["metrics"].map(
                lambda m, k=metric: m.get(k) if isinstance(m, dict) else None)
            err = None
            if metric == objective_metric:
                err = {"type": "data", "array": g["ci_high"] - g["objective"],
                       "arrayminus": g["objective"] - g["ci_low"], "thickness": 1.2}
            fig.add_scatter(x=g["rate"], y=y, error_y=err, name=policy, legendgroup=policy,
                            showlegend=i == 0, mode="lines+markers", text=g["label"],
                            line={"color": colour[policy]}, row=r + 1, col=c + 1,
                            hovertemplate="%{text}<br>rate %{x:g} req/s<br>%{y:.4g}<extra></extra>")
        _slo_line(fig, metric, slo, r + 1, c + 1)
        fig.update_xaxes(title_text="arrival rate (req/s)", row=r + 1, col=c + 1)
        fig.update_yaxes(title_text=metric_title(metric), rangemode="tozero", row=r + 1, col=c + 1)
    return _layout(fig, "Latency vs arrival rate (best setting of each policy; bars: 95% CI)",
                   360 * rows + 80)


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
    return _layout(fig, f"Objective by policy and rate: {metric_title(objective_metric)}, "
                   f"{better} is better", 120 + 60 * max(len(table.index), 3))


def k_over_time(traces: Sequence[tuple[str, pd.DataFrame]], per_sample: int = 8) -> go.Figure:
    """How the policy's draft length k moves as the batch fills and drains, for a few requests
    of each sample run (step lines: k holds until the next decision)."""
    fig = make_subplots(rows=len(traces), cols=1, subplot_titles=[t for t, _ in traces],
                        vertical_spacing=0.3 / max(len(traces), 1))
    for row, (_, trace) in enumerate(traces, start=1):
        ids = pick_requests(trace, per_sample)
        colour = colours(str(i) for i in ids)
        for rid in ids:
            g = _changes(trace[trace["request_id"] == rid].sort_values("time_s"))
            fig.add_scatter(x=g["time_s"], y=g["k"], mode="lines", line_shape="hv",
                            name=f"request {rid}", line={"color": colour[str(rid)]},
                            showlegend=False, row=row, col=1,
                            hovertemplate=f"request {rid}<br>t %{{x:.3f}} s<br>k %{{y}}"
                            "<extra></extra>")
        fig.update_xaxes(title_text="time (s)", row=row, col=1)
        fig.update_yaxes(title_text="k (draft tokens)", rangemode="tozero", row=row, col=1)
    return _layout(fig, "Draft length k over time (one colour per sample request; hover for "
                   "its id)",
                   280 * len(traces) + 100)


def pick_requests(trace: pd.DataFrame, n: int) -> list:
    """Up to n request ids spread over the run (by first decision), preferring ones with
    several steps so their lines show something."""
    first = trace.groupby("request_id")["time_s"].agg(["min", "size"]).sort_values("min")
    many = first[first["size"] >= 3]
    pool = many if len(many) >= n else first
    spots = np.unique(np.linspace(0, len(pool) - 1, min(n, len(pool))).astype(int))
    return list(pool.index[spots])


def _changes(g: pd.DataFrame) -> pd.DataFrame:
    """Only the steps where k changes (and the last): the same step line, far fewer points."""
    keep = g["k"].ne(g["k"].shift()).to_numpy().copy()
    keep[-1:] = True
    return thin(g[keep])


def latency_cdfs(samples: Sequence[tuple[str, pd.DataFrame]]) -> go.Figure:
    """The whole latency distribution of each sample run, not just its mean and p99."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{WHAT[k]} CDF" for k in LATENCY_KEYS],
                        horizontal_spacing=0.06)
    colour = colours(name for name, _ in samples)
    for name, req in samples:
        lat = request_latencies(req)
        for col, key in enumerate(LATENCY_KEYS, start=1):
            x = np.sort(lat[key].dropna().to_numpy())
            if not len(x):
                continue
            cdf = pd.DataFrame({"x": x, "y": np.arange(1, len(x) + 1) / len(x)})
            cdf = thin(cdf)
            fig.add_scatter(x=cdf["x"], y=cdf["y"], mode="lines", name=name, legendgroup=name,
                            showlegend=col == 1, line={"color": colour[name]}, row=1, col=col,
                            hovertemplate=f"{name}<br>%{{x:.4g}} s: %{{y:.1%}} of requests"
                            "<extra></extra>")
            fig.update_xaxes(title_text=f"{WHAT[key]} (s)", row=1, col=col)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    fig.update_yaxes(title_text="share of requests at or below", row=1, col=1)
    return _layout(fig, "Latency distributions of the sample runs", 430)


def request_latencies(req: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT and E2E per request from requests.csv (TPOT only for > 1 output token)."""
    many = req["output_tokens"] > 1
    tpot = (req["finish_s"] - req["first_token_s"]) / (req["output_tokens"] - 1)
    return pd.DataFrame({"ttft": req["first_token_s"] - req["arrival_s"],
                         "tpot": tpot.where(many), "e2e": req["finish_s"] - req["arrival_s"]})


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
    return _layout(fig, f"Capacity per replica{target}", 460)


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
    return _layout(fig, "SLO attainment vs arrival rate", 460)


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
    return _layout(fig, "Simulated vs measured (diagonal: agreement; band: +/-10%)", 480)


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

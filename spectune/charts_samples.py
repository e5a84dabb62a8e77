"""Charts of a tune's sample runs: the k each request actually drafted over time (beside the k
its policy chose), and the latency distributions of the recommended policy and plain decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spectune.charts import LATENCY_KEYS, WHAT, colours, layout, small, thin


def k_column(trace: pd.DataFrame) -> str:
    """'drafted' where the sample recorded it; older samples have only the policy's k."""
    return "drafted" if "drafted" in trace else "k"


def k_over_time(traces: Sequence[tuple[str, pd.DataFrame]], per_sample: int = 8,
                bins: int = 60) -> go.Figure:
    """How many tokens requests really drafted per step as the batch fills and drains: dots for
    a few requests of each sample run, a line for the mean over all of them. Drafted, not the
    policy's nominal k: an n-gram drafter proposes only what it matched (a fixed k=10 drafts
    0 or 10, about 6 on average), a stop rule cuts chains; the policy's mean choice is the
    dotted line where it differs."""
    fig = make_subplots(rows=len(traces), cols=1,
                        subplot_titles=[_k_title(t, trace) for t, trace in traces],
                        vertical_spacing=0.3 / max(len(traces), 1))
    for row, (_, trace) in enumerate(traces, start=1):
        col = k_column(trace)
        ids = pick_requests(trace, per_sample)
        colour = colours(str(i) for i in ids)
        for rid in ids:
            g = thin(trace[trace["request_id"] == rid].sort_values("time_s"))
            fig.add_scatter(x=g["time_s"], y=g[col], mode="markers", name=f"request {rid}",
                            marker={"color": colour[str(rid)], "size": 5, "opacity": 0.7},
                            showlegend=False, row=row, col=1,
                            hovertemplate=f"request {rid}<br>t %{{x:.3f}} s<br>{col} %{{y}}"
                            "<extra></extra>")
        for name, mean, line in _k_means(trace, col, bins):
            fig.add_scatter(x=mean["time_s"], y=mean[name], mode="lines", name=_K_NAMES[name],
                            legendgroup=name, showlegend=row == 1, line=line, row=row, col=1,
                            hovertemplate=f"{_K_NAMES[name]}<br>t %{{x:.3f}} s: %{{y:.2f}}"
                            "<extra></extra>")
        fig.update_xaxes(title_text="time (s)", row=row, col=1)
        fig.update_yaxes(title_text="k drafted" if col == "drafted" else
                         "k chosen (drafted not recorded)", rangemode="tozero", row=row, col=1)
    return layout(fig, "Draft length k over time: tokens drafted per step<br>" + small(
        f"dots: {per_sample} sample requests, one colour each (hover for the id); lines: mean "
        f"over all requests' steps in each of {bins} time slices"), 300 * len(traces) + 120)


_K_NAMES = {"drafted": "mean k drafted", "k": "mean k the policy chose"}


def _k_means(trace: pd.DataFrame, col: str, bins: int) -> list[tuple[str, pd.DataFrame, dict]]:
    """(column, its mean per time slice, line style): drafted (solid), and the policy's choice
    (dotted) where it differs from what was drafted."""
    cols = [col] + (["k"] if col == "drafted" and "k" in trace
                    and not trace["k"].equals(trace["drafted"]) else [])
    t = trace["time_s"].to_numpy(dtype=float)
    if not len(t):
        return []
    edges = np.linspace(t.min(), t.max(), bins + 1)
    slot = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    means = trace[cols].groupby(slot).mean().reindex(range(bins))  # empty slice: a gap
    means["time_s"] = (edges[:-1] + edges[1:]) / 2
    styles = {"drafted": {"color": "#222222", "width": 2.5},
              "k": {"color": "#777777", "width": 2, "dash": "dot"}}
    return [(c, means, styles[c]) for c in cols]


def _k_title(title: str, trace: pd.DataFrame) -> str:
    """The sample's name with its mean drafted k per step and the policy's mean choice."""
    if not len(trace) or not {"drafted", "k"} <= set(trace.columns):
        return title
    return (f"{title}: {trace['drafted'].mean():.3g} drafted per step on average "
            f"(the policy chose {trace['k'].mean():.3g})")


def pick_requests(trace: pd.DataFrame, n: int) -> list:
    """Up to n request ids spread over the run (by first decision), preferring ones with
    several steps so their lines show something."""
    first = trace.groupby("request_id")["time_s"].agg(["min", "size"]).sort_values("min")
    many = first[first["size"] >= 3]
    pool = many if len(many) >= n else first
    spots = np.unique(np.linspace(0, len(pool) - 1, min(n, len(pool))).astype(int))
    return list(pool.index[spots])


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
    return layout(fig, "Latency distributions of the sample runs", 430)


def request_latencies(req: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT and E2E per request from requests.csv (TPOT only for > 1 output token)."""
    many = req["output_tokens"] > 1
    tpot = (req["finish_s"] - req["first_token_s"]) / (req["output_tokens"] - 1)
    return pd.DataFrame({"ttft": req["first_token_s"] - req["arrival_s"],
                         "tpot": tpot.where(many), "e2e": req["finish_s"] - req["arrival_s"]})

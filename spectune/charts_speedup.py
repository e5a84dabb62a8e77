"""The speed-up over plain decoding, fixed(k=0), per rate: the ratio of k=0's objective to each
policy's best, with an interval over seeds (paired where per-seed values exist, else the two
intervals divided end to end, and said so).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from spectune.charts import (
    BASELINE_NAME,
    BASELINE_STYLE,
    axis_top,
    dodge,
    layout,
    line_trace,
    metric_title,
    series_styles,
    small,
)

PAIRED = ("paired: both ran on the same seeds, so the ratio of their means gets its interval "
          "from the per-seed pairs (delta method, Student t)")
CONSERVATIVE = ("conservative: the two 95% intervals divided end to end; it holds whenever "
                "both do, but is wider than a paired interval (no per-seed values in tune.json)")
SPEEDUP_COLUMNS = ("rate", "policy", "label", "speedup", "low", "high", "method")


def speedups(best: pd.DataFrame, baseline: pd.DataFrame, direction: str) -> pd.DataFrame:
    """Each policy's best candidate against k=0 at the same rate: k=0's objective over the
    policy's where lower is better (latency), the policy's over k=0's where higher is
    (goodput); above 1 the policy beats plain decoding. With its interval and how it was got."""
    base = {r["rate"]: r for r in baseline.to_dict("records")}
    rows = []
    for p in best.to_dict("records"):
        b = base.get(p["rate"])
        if b is None:
            continue
        num, den = (b, p) if direction == "min" else (p, b)
        low, high, method = speedup_interval(num, den)
        rows.append({"rate": p["rate"], "policy": p["policy"], "label": p["label"],
                     "speedup": _ratio(num["objective"], den["objective"]), "low": low,
                     "high": high, "method": method})
    return pd.DataFrame(rows, columns=list(SPEEDUP_COLUMNS))


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def _seed_values(row: dict) -> list[float]:
    """Per-seed objective values in seed order, where tune.json has them ('per_seed') and all
    are finite numbers (a seed where no request met the SLO has none): else none at all."""
    values = row.get("per_seed")
    if not isinstance(values, list) or not all(isinstance(v, numbers.Real) for v in values):
        return []
    return [float(v) for v in values] if all(map(math.isfinite, values)) else []


def speedup_interval(num: dict, den: dict, level: float = 0.95) -> tuple[float, float, str]:
    """The interval of num's objective / den's: paired where both carry per-seed values (the
    seeds are common random numbers, so most of the noise cancels), else conservative
    bounds from the two intervals."""
    a, b = _seed_values(num), _seed_values(den)
    n = min(len(a), len(b))
    if n >= 2:
        return (*paired_ratio_interval(a[:n], b[:n], level), PAIRED)
    return (*bounds_ratio_interval(num, den), CONSERVATIVE)


def paired_ratio_interval(a: Sequence[float], b: Sequence[float],
                          level: float = 0.95) -> tuple[float, float]:
    """Interval of mean(a) / mean(b) from pairs (a_i, b_i) on the same seed: the ratio
    estimator's linearisation, R +- t * sd(a_i - R b_i) / (sqrt(n) mean(b)), clipped at 0."""
    from scipy.stats import t

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or y.mean() <= 0:
        return math.nan, math.nan
    r = x.mean() / y.mean()
    half = (t.ppf(0.5 + level / 2, len(x) - 1) * (x - r * y).std(ddof=1)
            / (math.sqrt(len(x)) * y.mean()))
    return max(r - half, 0.0), r + half


def bounds_ratio_interval(num: dict, den: dict) -> tuple[float, float]:
    """[num low / den high, num high / den low]: covers the ratio whenever both intervals
    cover their means; unbounded above when den's interval reaches 0."""
    lo_n, hi_n = _bound(num, "ci_low"), _bound(num, "ci_high")
    lo_d, hi_d = _bound(den, "ci_low"), _bound(den, "ci_high")
    if not all(map(math.isfinite, (lo_n, hi_n, lo_d, hi_d))) or hi_d <= 0:
        return math.nan, math.nan
    return max(lo_n, 0.0) / hi_d, (hi_n / lo_d if lo_d > 0 else math.inf)


def _bound(row: dict, key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, numbers.Real) else math.nan


def speedup_vs_rate(speed: pd.DataFrame, objective_metric: str, direction: str) -> go.Figure:
    """Is speculation worth it at this load? Each policy's best setting against plain decoding,
    per rate, with the interval of the ratio; the dashed line at 1 is k=0 itself."""
    fig = go.Figure()
    style = series_styles(speed["policy"])
    groups = list(speed.groupby("policy", sort=False))
    offsets = dodge(speed["rate"], len(groups) + 1)  # k=0's slot kept: the same x as above
    top = axis_top(speed["speedup"], speed["high"])
    for (policy, g), dx in zip(groups, offsets):
        high = g["high"].where(np.isfinite(g["high"]), 10 * (top or g["speedup"].max()))
        fig.add_scatter(y=g["speedup"], **line_trace(g, policy, style[policy], dx),
                        error_y={"type": "data", "array": high - g["speedup"],
                                 "arrayminus": g["speedup"] - g["low"], "thickness": 1.5,
                                 "width": 5},
                        hovertemplate="%{text}<br>rate %{customdata:g} req/s<br>speed-up "
                        "%{y:.3g}x<extra></extra>")
    fig.add_hline(y=1, line={"dash": "dash", "color": BASELINE_STYLE["color"], "width": 1.5},
                  annotation_text="1 = " + BASELINE_NAME, annotation_position="bottom right")
    better = "lower" if direction == "min" else "higher"
    ratio = ("k=0's / the policy's" if direction == "min" else "the policy's / k=0's")
    methods = "; ".join(dict.fromkeys(m for m in speed["method"] if isinstance(m, str)))
    fig.update_xaxes(title_text="arrival rate (req/s)")
    fig.update_yaxes(title_text=f"speed-up over k=0 (x), {ratio}", rangemode="tozero",
                     range=None if top is None else [0, top])
    note = "; bars cut at the top run beyond it" if top is not None else ""
    return layout(fig, f"Speed-up over plain decoding, fixed(k=0): {ratio} "
                   f"{metric_title(objective_metric)} ({better} is better), above 1 the "
                   f"policy wins<br>{small(f'bars: 95% interval, {methods}{note}')}", 500)

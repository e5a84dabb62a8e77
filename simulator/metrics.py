"""Serving metrics from the records: TTFT, TPOT, E2E, throughput, goodput, SLO attainment.

Definitions (per request): TTFT = first token - arrival; TPOT = (finish - first token) /
(output tokens - 1), for requests of at least 2 output tokens; E2E = finish - arrival.
Throughput counts output tokens from the first arrival to the last finish. Goodput counts only
the tokens of requests that met every SLO given. Mean emitted per step and mean k are over
request-steps (one request in one decode iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.logs import StepTotals

QUANTILES = {"mean": None, "p50": 50, "p90": 90, "p99": 99}


@dataclass(frozen=True)
class Slo:
    """Latency objectives; None means no objective on that metric."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"SLO {name} must be > 0 seconds, got {v}")

    def met(self, requests: pd.DataFrame) -> np.ndarray:
        ok = np.ones(len(requests), dtype=bool)
        per_request = latencies(requests)
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            limit = getattr(self, name)
            if limit is not None:
                values = per_request[name].to_numpy()
                ok &= np.nan_to_num(values, nan=0.0) <= limit
        return ok


def latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-request TTFT, TPOT and E2E in seconds."""
    out_tokens = requests["output_tokens"].to_numpy()
    decode_s = (requests["finish_s"] - requests["first_token_s"]).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tokens > 1, decode_s / (out_tokens - 1), np.nan)
    return pd.DataFrame({
        "ttft_s": (requests["first_token_s"] - requests["arrival_s"]).to_numpy(),
        "tpot_s": tpot,
        "e2e_s": (requests["finish_s"] - requests["arrival_s"]).to_numpy(),
    })


def distribution(values: np.ndarray) -> dict[str, float]:
    """Mean and percentiles, ignoring NaN (e.g. TPOT of one-token requests)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return {key: float("nan") for key in QUANTILES}
    return {key: float(v.mean()) if q is None else float(np.percentile(v, q))
            for key, q in QUANTILES.items()}


def summarize(requests: pd.DataFrame, steps: pd.DataFrame | StepTotals,
              slo: Slo | None = None) -> dict:
    """The summary that `spectune simulate --format json` prints; `steps` the step records or
    their totals (a run that did not keep its steps)."""
    finished = requests["finish_s"].notna().to_numpy()
    done = requests if finished.all() else requests[finished]  # no copy of a finished run
    per = latencies(done)
    span = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else 0.0
    tokens = float(done["output_tokens"].sum())
    totals = steps if isinstance(steps, StepTotals) else StepTotals.from_frame(steps)
    request_steps = float(totals.request_steps)
    decode_iterations = totals.decode_iterations
    summary = {
        "requests": len(done),
        "unfinished_requests": int(len(requests) - len(done)),
        "duration_s": span,
        "throughput_tokens_per_s": tokens / span if span > 0 else float("nan"),
        "throughput_requests_per_s": len(done) / span if span > 0 else float("nan"),
        "ttft_s": distribution(per["ttft_s"].to_numpy()),
        "tpot_s": distribution(per["tpot_s"].to_numpy()),
        "e2e_s": distribution(per["e2e_s"].to_numpy()),
        "mean_emitted_per_step": float(totals.emitted) / request_steps
        if request_steps else float("nan"),
        "mean_k": float(totals.drafted) / request_steps if request_steps else float("nan"),
        "mean_batch_size": request_steps / decode_iterations if decode_iterations
        else float("nan"),
        "iterations": totals.iterations,
    }
    if slo is not None:
        met = slo.met(done)
        summary["slo"] = {k: v for k, v in slo.__dict__.items() if v is not None}
        summary["slo_attainment"] = float(met.mean()) if len(done) else float("nan")
        good_tokens = float(done["output_tokens"].to_numpy()[met].sum())
        summary["goodput_tokens_per_s"] = good_tokens / span if span > 0 else float("nan")
    return summary


def time_average_held(steps: pd.DataFrame, horizon_s: float) -> float:
    """Mean number of requests held by the replicas over [0, horizon_s], from the step records.

    Each iteration contributes (requests held when it started) x (its duration); idle time holds
    none. Compared with lambda·mean(E2E) from the request records, this checks Little's law
    (L = lambda W) across two independent paths through the engine's bookkeeping.
    """
    return float((steps["held"] * steps["duration_s"]).sum()) / horizon_s

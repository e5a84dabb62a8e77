"""Metrics on literal records: TTFT/TPOT/E2E, throughput, SLO attainment and goodput."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from simulator.logs import STEP_COLUMNS
from simulator.metrics import Slo, distribution, latencies, summarize


def _requests():
    return pd.DataFrame({
        "request_id": [0, 1, 2],
        "replica": [0, 0, 0],
        "arrival_s": [0.0, 1.0, 2.0],
        "admitted_s": [0.0, 1.0, 2.5],
        "first_token_s": [0.5, 1.2, 3.0],
        "finish_s": [2.5, 1.2, 5.0],
        "prompt_tokens": [10, 10, 10],
        "output_tokens": [5, 1, 3],
        "steps": [2, 0, 2],
        "drafted": [8, 0, 8],
        "accepted": [2, 0, 0],
    })


def _steps():
    rows = [  # decode iterations only matter for emitted/k
        dict(decode_seqs=2, drafted=8, emitted=5),
        dict(decode_seqs=2, drafted=8, emitted=2),
    ]
    frame = pd.DataFrame([{c: 0 for c in STEP_COLUMNS} | r for r in rows])
    frame["duration_s"] = 0.1
    return frame


def test_per_request_latencies():
    per = latencies(_requests())
    assert per["ttft_s"].tolist() == pytest.approx([0.5, 0.2, 1.0])
    assert per["e2e_s"].tolist() == pytest.approx([2.5, 0.2, 3.0])
    tpot = per["tpot_s"].tolist()
    assert tpot[0] == pytest.approx(2.0 / 4) and math.isnan(tpot[1]) and tpot[2] == 1.0


def test_summary_figures():
    s = summarize(_requests(), _steps())
    assert s["requests"] == 3
    assert s["duration_s"] == 5.0
    assert s["throughput_tokens_per_s"] == pytest.approx(9 / 5.0)
    assert s["e2e_s"]["mean"] == pytest.approx((2.5 + 0.2 + 3.0) / 3)
    assert s["tpot_s"]["mean"] == pytest.approx((0.5 + 1.0) / 2)  # the 1-token request has none
    assert s["mean_emitted_per_step"] == pytest.approx(7 / 4)
    assert s["mean_k"] == 4.0
    assert s["mean_batch_size"] == 2.0


def test_slo_attainment_and_goodput():
    s = summarize(_requests(), _steps(), Slo(ttft_s=0.6, tpot_s=0.75))
    # request 0 meets both; 1 meets TTFT and has no TPOT; 2 misses both
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    assert s["goodput_tokens_per_s"] == pytest.approx((5 + 1) / 5.0)


def test_distribution_percentiles():
    d = distribution([1.0, 2.0, 3.0, 4.0, float("nan")])
    assert d == {"mean": 2.5, "p50": 2.5, "p90": pytest.approx(3.7), "p99": pytest.approx(3.97)}


def test_slo_rejects_non_positive_objectives():
    with pytest.raises(ValueError, match="ttft_s"):
        Slo(ttft_s=0)

"""Workload: validation, row views and slicing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from traces import Request, TraceError, Workload


def make(arrival=(0.0, 1.0, 3.0), prompt=(10, 20, 30), output=(1, 2, 3), ids=None, **kw):
    return Workload(
        arrival_s=np.asarray(arrival, dtype=float),
        prompt_tokens=np.asarray(prompt),
        output_tokens=np.asarray(output),
        request_ids=np.arange(len(arrival)) if ids is None else np.asarray(ids),
        source=kw.pop("source", "test"),
        **kw,
    )


def test_rows_and_columns_agree():
    w = make(prompts=("a", "b", "c"), categories=("x", "y", "x"))
    assert len(w) == 3
    assert w[1] == Request(1, 1.0, 20, 2, "b", "y")
    assert w[-1].arrival_s == 3.0
    assert list(w) == [w[0], w[1], w[2]]
    assert w.arrival_s.dtype == np.float64 and w.prompt_tokens.dtype == np.int64
    with pytest.raises(IndexError):
        w[3]


def test_columns_are_copied_and_read_only():
    arrival = np.array([0.0, 1.0])
    w = make(arrival=arrival, prompt=(1, 1), output=(1, 1))
    arrival[1] = 5.0
    assert w.arrival_s[1] == 1.0
    with pytest.raises(ValueError):
        w.arrival_s[0] = 2.0


def test_rate_and_duration():
    assert make().duration_s == 3.0
    assert make().mean_rate_per_s == pytest.approx(2 / 3)
    assert make(arrival=(5.0,), prompt=(1,), output=(1,)).mean_rate_per_s == 0.0
    assert math.isinf(make(arrival=(2.0, 2.0), prompt=(1, 1), output=(1, 1)).mean_rate_per_s)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arrival": (), "prompt": (), "output": ()}, "no requests"),
        ({"prompt": (1, 2)}, "column lengths differ"),
        ({"output": (1, 0, 3)}, r"output_tokens of request index 1 is 0; .* >= 1"),
        ({"prompt": (1, -4, 3)}, "prompt_tokens of request index 1 is -4"),
        ({"arrival": (0.0, math.nan, 3.0)}, "request index 1 is nan; .* finite"),
        ({"arrival": (0.0, math.inf, 3.0)}, "request index 1 is inf"),
        ({"arrival": (-1.0, 0.0, 3.0)}, "request index 0 is -1.0; .* >= 0"),
        ({"arrival": (0.0, 4.0, 3.0)}, r"request index 2 \(3.0\) is earlier .* sort requests"),
        ({"prompt": (1.5, 2.0, 3.0)}, "prompt_tokens must hold integers"),
        ({"ids": (7, 8, 7)}, "request id 7 is used by request indices 0 and 2"),
        ({"prompts": ("a", "b")}, "prompts has 2 entries for 3 requests"),
        ({"categories": ("a", 1, "c")}, "categories entry for request index 1 is int"),
    ],
)
def test_invalid_workloads_raise_trace_error(kwargs, message):
    with pytest.raises(TraceError, match=message):
        make(**kwargs)


def test_trace_error_is_a_value_error():
    assert issubclass(TraceError, ValueError)


def test_head_within_and_shift():
    w = make(arrival=(10.0, 11.0, 12.5, 20.0), prompt=(1, 2, 3, 4), output=(1, 1, 1, 1),
             source="src")
    assert len(w.head(2)) == 2 and w.head(2).source == "src, first 2 requests"
    assert w.head(10) is w
    assert list(w.within(2.5).prompt_tokens) == [1, 2]
    assert len(w.within(2.6)) == 3
    shifted = w.shifted_to_zero()
    assert shifted.arrival_s[0] == 0.0 and shifted.duration_s == w.duration_s
    with pytest.raises(TraceError, match=r"head\(n\) must be an integer >= 1"):
        w.head(0)
    with pytest.raises(TraceError, match=r"within\(duration_s\) must be a finite number > 0"):
        w.within(0)


@given(
    gaps=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=40),
    n=st.integers(1, 50),
    window=st.floats(0.001, 500),
)
def test_slicing_properties(gaps, n, window):
    arrival = np.cumsum(gaps)
    ones = np.ones(len(gaps), dtype=np.int64)
    w = make(arrival=arrival, prompt=ones, output=ones)
    assert len(w.head(n)) == min(n, len(w))
    kept = w.within(window)
    assert len(kept) == int(np.sum(arrival - arrival[0] < window))
    assert np.array_equal(w.shifted_to_zero().arrival_s, arrival - arrival[0])

"""Synthetic arrivals, length samplers and rate rescaling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import (
    EmpiricalLengths,
    FixedLengths,
    TraceError,
    Workload,
    builtin_workload,
    gamma_arrivals,
    parse_lengths,
    poisson_arrivals,
    rescale_to_rate,
    save_workload,
    synthetic_workload,
)
from traces.synthetic import LognormalLengths


def rng(seed=1234):
    return np.random.default_rng(seed)


def test_poisson_rate_and_start():
    arrival = poisson_arrivals(5.0, 20_000, rng())
    assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0)
    assert (arrival.size - 1) / arrival[-1] == pytest.approx(5.0, rel=0.03)
    gaps = np.diff(arrival)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_rate_and_cv(cv):
    arrival = gamma_arrivals(3.0, cv, 20_000, rng())
    gaps = np.diff(arrival)
    assert arrival[0] == 0.0
    rate = 1 / gaps.mean()
    assert rate == pytest.approx(3.0, rel=0.05 if cv > 2 else 0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_single_arrival():
    assert list(poisson_arrivals(1.0, 1, rng())) == [0.0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: poisson_arrivals(0.0, 10, rng()), "rate_per_s must be a finite number > 0"),
        (lambda: poisson_arrivals(float("inf"), 10, rng()), "rate_per_s must be a finite"),
        (lambda: poisson_arrivals(-1, 10, rng()), r"rate_per_s .* \(got -1\)"),
        (lambda: poisson_arrivals(1.0, 0, rng()), "n must be an integer >= 1"),
        (lambda: poisson_arrivals(1.0, 2.5, rng()), "n must be an integer >= 1"),
        (lambda: gamma_arrivals(1.0, 0.0, 10, rng()), "cv must be a finite number > 0"),
        (lambda: gamma_arrivals(1.0, float("nan"), 10, rng()), "cv must be a finite number > 0"),
        (lambda: FixedLengths(0, 5), "FixedLengths prompt tokens must be an integer >= 1"),
        (lambda: synthetic_workload("uniform", 1.0, 5, "fixed:1,1", rng()),
         "unknown arrival kind 'uniform'; use 'poisson' or 'gamma'"),
        (lambda: synthetic_workload("poisson", 1.0, 5, "fixed:1,1", rng(), cv=2.0),
         "cv=2.0 given for Poisson arrivals"),
    ],
)
def test_argument_errors(call, message):
    with pytest.raises(TraceError, match=message):
        call()


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match=r"numpy\.random\.Generator"):
        poisson_arrivals(1.0, 3, 42)


def test_empirical_lengths_resample_whole_pairs():
    w = builtin_workload("azure-code")
    prompt, output = EmpiricalLengths(w).sample(5_000, rng())
    pairs = set(zip(w.prompt_tokens.tolist(), w.output_tokens.tolist(), strict=True))
    assert set(zip(prompt.tolist(), output.tolist(), strict=True)) <= pairs
    assert output.mean() == pytest.approx(w.output_tokens.mean(), rel=0.15)


def test_fixed_and_lognormal_lengths():
    prompt, output = FixedLengths(100, 7).sample(4, rng())
    assert list(prompt) == [100] * 4 and list(output) == [7] * 4
    prompt, output = LognormalLengths(500, 200, 0.5).sample(50_000, rng())
    assert prompt.min() >= 1 and prompt.dtype == np.int64
    assert prompt.mean() == pytest.approx(500, rel=0.02)
    assert output.mean() == pytest.approx(200, rel=0.02)


def test_parse_lengths(tmp_path):
    assert parse_lengths("fixed:128,64") == FixedLengths(128, 64)
    assert parse_lengths("azure-conv").workload is builtin_workload("azure-conv")
    assert isinstance(parse_lengths("lognormal:100,50,0.8"), LognormalLengths)
    path = tmp_path / "w.csv"
    save_workload(builtin_workload("azure-code").head(10), path)
    sampler = parse_lengths(str(path))
    assert isinstance(sampler, EmpiricalLengths) and len(sampler.workload) == 10


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fixed:128", "bad length spec 'fixed:128'; use a built-in workload name"),
        ("fixed:1.5,2", "bad length spec"),
        ("fixed:a,b", "non-numeric value"),
        ("fixed:0,5", "FixedLengths prompt tokens must be an integer >= 1"),
        ("lognormal:1,2", "bad length spec"),
        ("sharegpt", r"unknown length spec 'sharegpt' \(not a known name or an existing file\); "
                     "use a built-in workload name .*azure-conv, azure-code.*fixed:PROMPT,OUTPUT"),
    ],
)
def test_parse_lengths_errors(spec, message):
    with pytest.raises(TraceError, match=message):
        parse_lengths(spec)


def test_synthetic_workload_is_reproducible_and_labelled():
    a = synthetic_workload("gamma", 4.0, 500, "azure-conv", rng(7), cv=2.0)
    b = synthetic_workload("gamma", 4.0, 500, "azure-conv", rng(7), cv=2.0)
    c = synthetic_workload("gamma", 4.0, 500, "azure-conv", rng(8), cv=2.0)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert len(a) == 500 and a.arrival_s[0] == 0.0
    assert "gamma arrivals at 4 req/s (cv 2)" in a.source
    assert "Azure LLM inference trace 2023 (conv)" in a.source
    p = synthetic_workload("poisson", 2.0, 3, FixedLengths(5, 6), rng())
    assert "Poisson arrivals at 2 req/s" in p.source and "fixed 5 prompt / 6 output" in p.source


def test_rescale_hits_target_and_keeps_shape():
    w = builtin_workload("azure-conv").head(2_000)
    for target in (0.5, 5.53, 40.0):
        r = rescale_to_rate(w, target)
        assert r.mean_rate_per_s == pytest.approx(target, rel=1e-12)
        assert "rescaled from" in r.source
        shape = np.diff(r.arrival_s) / np.diff(r.arrival_s).mean()
        assert np.allclose(shape, np.diff(w.arrival_s) / np.diff(w.arrival_s).mean())
        assert np.array_equal(r.output_tokens, w.output_tokens)


def test_rescale_errors():
    one = Workload(np.array([1.0]), np.array([1]), np.array([1]), np.array([0]), "one")
    with pytest.raises(TraceError, match="cannot rescale 'one'"):
        rescale_to_rate(one, 2.0)
    with pytest.raises(TraceError, match="rate_per_s must be a finite number > 0"):
        rescale_to_rate(builtin_workload("azure-code"), 0)


@settings(deadline=None)
@given(gaps=st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=50),
       start=st.floats(0, 1e4), target=st.floats(1e-3, 1e3))
def test_rescale_property(gaps, start, target):
    arrival = start + np.concatenate([[0.0], np.cumsum(gaps)])
    ones = np.ones(arrival.size, dtype=np.int64)
    w = Workload(arrival, ones, ones, np.arange(arrival.size), "h")
    r = rescale_to_rate(w, target)
    assert r.mean_rate_per_s == pytest.approx(target, rel=1e-9)
    assert r.arrival_s[0] == arrival[0]

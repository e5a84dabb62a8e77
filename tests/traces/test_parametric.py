"""Parametric acceptance: spec parsing and the statistics of the sampled traces."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import SIGNALS, ParametricAcceptance, TraceError, parametric_trace, parse_acceptance
from traces.parametric import BetaAcceptance, IidAcceptance, MarkovAcceptance


def rng(seed=0):
    return np.random.default_rng(seed)


def test_parse_forms():
    iid = parse_acceptance("iid:0.7")
    assert iid == IidAcceptance(0.7, "iid:0.7") and iid.mean_alpha == 0.7
    beta = parse_acceptance(" beta:2,3 ")
    assert isinstance(beta, BetaAcceptance) and beta.mean_alpha == pytest.approx(0.4)
    markov = parse_acceptance("markov:0.9,0.2,0.5@40")
    assert isinstance(markov, MarkovAcceptance)
    assert markov.alphas == (0.9, 0.2, 0.5) and markov.mean_segment == 40
    assert markov.mean_alpha == pytest.approx(1.6 / 3)
    for model in (iid, beta, markov):
        assert isinstance(model, ParametricAcceptance) and model.describe()
    assert "Beta(2, 3)" in beta.describe()
    assert parse_acceptance(iid) is iid


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0.7", r"unknown acceptance spec '0.7'; use 'iid:ALPHA' \(0 <= ALPHA <= 1\), 'beta:A,B'"),
        ("gauss:1", "unknown acceptance spec 'gauss:1'"),
        ("iid:1.2", r"iid alpha must be between 0 and 1 inclusive \(got 1.2\)"),
        ("iid:-0.1", "iid alpha must be between 0 and 1"),
        ("iid:0.5,0.6", "has 2 values"),
        ("iid:", "non-numeric value"),
        ("iid:nan", "non-finite value"),
        ("beta:2", "has 1 values"),
        ("beta:0,1", "beta A must be a finite number > 0"),
        ("beta:1,-2", "beta B must be a finite number > 0"),
        ("markov:0.9,0.2", r"lacks '@L'"),
        ("markov:0.9,1.5@10", "markov alpha must be between 0 and 1"),
        ("markov:0.9@0.5", "L must be >= 1 token"),
        ("markov:0.9@2,3", "needs one number after '@'"),
        ("markov:@10", "non-numeric value"),
    ],
)
def test_parse_errors(spec, message):
    with pytest.raises(TraceError, match=message):
        parse_acceptance(spec)


def chain_walk(trace, k):
    """Mean tokens emitted per decode step when always drafting k (start after prefill)."""
    emitted = steps = 0
    for request in trace.requests:
        run = request.run.tolist()
        g = 1
        while g < len(run):
            accepted = min(k, run[g])
            emitted += accepted + 1
            steps += 1
            g += accepted + 1
    return emitted / steps, steps


def test_iid_match_rate_and_chain_acceptance():
    trace = parametric_trace("iid:0.7", np.full(200, 2_001), rng(3))
    run = np.concatenate([r.run for r in trace.requests])
    assert np.mean(run > 0) == pytest.approx(0.7, abs=0.005)  # match[t] is run[t] > 0
    mean, steps = chain_walk(trace, 4)
    assert steps >= 100_000
    assert mean == pytest.approx((1 - 0.7**5) / 0.3, rel=0.01)


def test_beta_per_request_alpha():
    a, b = 2.0, 5.0
    trace = parametric_trace(f"beta:{a},{b}", np.full(4_000, 50), rng(1))
    alphas = np.array([r.accept_prob[0] for r in trace.requests])
    assert all(np.all(r.accept_prob == r.accept_prob[0]) for r in trace.requests)
    assert alphas.mean() == pytest.approx(a / (a + b), abs=0.01)
    assert alphas.std() == pytest.approx(math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1))), rel=0.1)


def test_markov_switches_between_regimes():
    trace = parametric_trace("markov:0.95,0.2@25", np.full(300, 400), rng(2))
    p = np.concatenate([r.accept_prob for r in trace.requests])
    assert set(np.unique(p).tolist()) == {np.float32(0.95), np.float32(0.2)}
    regimes = [set(np.unique(r.accept_prob).tolist()) for r in trace.requests]
    assert sum(len(s) == 2 for s in regimes) > 250  # most requests see both regimes
    starts = [0] + [i for i in range(1, p.size) if p[i] != p[i - 1]]
    # switches happen at half the segment starts (a new segment repeats the regime w.p. 1/2)
    assert p.size / len(starts) == pytest.approx(2 * 25, rel=0.15)
    match = np.concatenate([r.run for r in trace.requests]) > 0
    assert match[p > 0.5].mean() == pytest.approx(0.95, abs=0.01)
    assert match[p < 0.5].mean() == pytest.approx(0.2, abs=0.01)


def test_position_concentration_keeps_mean():
    trace = parametric_trace("iid:0.6", np.full(100, 1_000), rng(4), position_concentration=5.0)
    p = np.concatenate([r.accept_prob for r in trace.requests])
    assert p.mean() == pytest.approx(0.6, abs=0.005)
    assert p.var() == pytest.approx(0.6 * 0.4 / 6, rel=0.05)  # Beta(αc, (1-α)c) variance
    match = np.concatenate([r.run for r in trace.requests]) > 0
    assert match.mean() == pytest.approx(0.6, abs=0.005)
    edge = parametric_trace("iid:1", np.array([5]), rng(), position_concentration=2.0)
    assert edge.requests[0].run.tolist() == [5, 4, 3, 2, 1]


def test_proxy_signals():
    trace = parametric_trace("markov:0,0.5,1@3", np.full(50, 40), rng(5))
    r = np.concatenate([x.accept_prob for x in trace.requests])
    kl = np.concatenate([x.kl for x in trace.requests])
    top1 = np.concatenate([x.draft_top1 for x in trace.requests])
    ent = np.concatenate([x.draft_entropy for x in trace.requests])
    assert trace.signals_available() == frozenset(SIGNALS)
    assert all(x.dtype == np.float32 for x in (r, kl, top1, ent))
    assert np.array_equal(r, top1)
    half = r == 0.5
    assert np.allclose(kl[half], -math.log(1 - 0.25)) and np.allclose(ent[half], math.log(2))
    assert np.all(np.isinf(kl[r == 0])) and np.all(kl[r == 1] == 0)
    assert np.all(ent[(r == 0) | (r == 1)] == 0)
    assert "proxy" in trace.meta["signals"] and "Bretagnolle-Huber" in trace.meta["signals"]


def test_meta_and_extremes():
    trace = parametric_trace("iid:1.0", np.array([3, 300]), rng(), max_run=8)
    assert trace.meta["parametric"] is True and trace.meta["spec"] == "iid:1.0"
    assert trace.meta["max_run"] == 8 and trace.meta["position_concentration"] is None
    assert trace.requests[0].run.tolist() == [3, 2, 1]
    assert trace.requests[1].run.max() == 8 and trace.requests[1].run[-3:].tolist() == [3, 2, 1]
    zero = parametric_trace("iid:0", np.array([4]), rng())
    assert zero.requests[0].run.tolist() == [0, 0, 0, 0]
    assert [r.key for r in trace.requests] == ["0", "1"]


@settings(deadline=None, max_examples=30)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=20), st.floats(0, 1),
       st.integers(1, 10))
def test_runs_stay_inside_their_request(lengths, alpha, cap):
    trace = parametric_trace(f"iid:{alpha}", np.array(lengths), rng(), max_run=cap)
    for request, n in zip(trace.requests, lengths, strict=True):
        assert len(request) == n
        assert np.all(request.run <= np.minimum(n - np.arange(n), cap))


def test_same_seed_same_trace_different_seed_different():
    lengths = np.array([30, 1, 200, 45])
    for spec in ("iid:0.6", "beta:3,1", "markov:0.9,0.3@10"):
        a = parametric_trace(spec, lengths, rng(11), position_concentration=4.0)
        b = parametric_trace(spec, lengths, rng(11), position_concentration=4.0)
        c = parametric_trace(spec, lengths, rng(12), position_concentration=4.0)
        for name in ("run", *SIGNALS):
            assert all(np.array_equal(getattr(x, name), getattr(y, name))
                       for x, y in zip(a.requests, b.requests, strict=True))
        assert not all(np.array_equal(x.run, y.run)
                       for x, y in zip(a.requests, c.requests, strict=True))
        assert a.meta == b.meta


def test_round_trip_through_npz(tmp_path):
    from traces import SpeculationTrace

    trace = parametric_trace("beta:2,2", np.array([5, 9]), rng())
    trace.save(tmp_path / "p.npz")
    back = SpeculationTrace.load(tmp_path / "p.npz")
    assert back.meta["parametric"] is True
    assert np.array_equal(back.requests[1].kl, trace.requests[1].kl)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"output_tokens": np.array([], dtype=int)}, "output_tokens must be a non-empty 1-D"),
        ({"output_tokens": np.array([3, 0])}, "output_tokens of request index 1 is 0"),
        ({"output_tokens": np.array([3.0])}, "output_tokens must hold integers"),
        ({"max_run": 0}, "max_run must be an integer >= 1"),
        ({"position_concentration": 0.0}, "position_concentration must be a finite number > 0"),
        ({"spec": "iid"}, "unknown acceptance spec 'iid'"),
    ],
)
def test_parametric_trace_errors(kwargs, message):
    args = {"spec": "iid:0.5", "output_tokens": np.array([3]), "rng": rng()} | kwargs
    with pytest.raises(TraceError, match=message):
        parametric_trace(**args)


def test_concentration_suffix_varies_positions_but_keeps_the_mean():
    import numpy as np

    from traces import parametric_trace

    lengths = np.full(200, 500)
    flat = parametric_trace("beta:7,3", lengths, np.random.default_rng(0))
    varied = parametric_trace("beta:7,3~10", lengths, np.random.default_rng(0))
    assert varied.meta["position_concentration"] == 10
    assert varied.meta["spec"] == "beta:7,3~10"
    p_flat = np.concatenate([r.accept_prob for r in flat.requests])
    p_varied = np.concatenate([r.accept_prob for r in varied.requests])
    assert abs(p_varied.mean() - p_flat.mean()) < 0.01
    # within a request, the flat model's probability is constant; the varied one's is not
    assert np.ptp(flat.requests[0].accept_prob) == 0
    assert np.std(varied.requests[0].accept_prob) > 0.05


def test_bad_concentration_suffix():
    import numpy as np
    import pytest

    from traces import TraceError, parametric_trace

    with pytest.raises(TraceError, match="after '~' must be a positive number"):
        parametric_trace("iid:0.5~x", np.array([10]), np.random.default_rng(0))

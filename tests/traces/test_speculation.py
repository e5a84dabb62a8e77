"""Speculation traces: run lengths, validation and the .npz round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from traces import SIGNALS, RequestSpeculation, SpeculationTrace, TraceError, run_from_matches
from traces.speculation import runs_by_request


def naive_runs(match, cap=None):
    runs = [0] * len(match)
    following = 0
    for t in range(len(match) - 1, -1, -1):
        following = (1 + following) if match[t] else 0
        runs[t] = following
    return [min(r, cap) for r in runs] if cap is not None else runs


def test_run_from_matches_literal():
    match = np.array([1, 1, 0, 1, 1, 1, 0, 0, 1], dtype=bool)
    assert run_from_matches(match).tolist() == [2, 1, 0, 3, 2, 1, 0, 0, 1]
    assert run_from_matches(match, max_run=2).tolist() == [2, 1, 0, 2, 2, 1, 0, 0, 1]
    assert run_from_matches(np.array([], dtype=bool)).tolist() == []


@given(hnp.arrays(bool, st.integers(0, 300)), st.none() | st.integers(1, 20))
def test_run_from_matches_matches_naive_loop(match, cap):
    assert run_from_matches(match, max_run=cap).tolist() == naive_runs(match.tolist(), cap)


@given(st.lists(hnp.arrays(bool, st.integers(0, 40)), min_size=1, max_size=12))
def test_runs_never_cross_request_boundaries(requests):
    lengths = np.array([r.size for r in requests])
    got = runs_by_request(np.concatenate(requests), lengths)
    assert got.tolist() == [x for r in requests for x in naive_runs(r.tolist())]


def test_run_from_matches_rejects_bad_input():
    with pytest.raises(TraceError, match="match must be a 1-D array"):
        run_from_matches(np.zeros((2, 2), dtype=bool))
    with pytest.raises(TraceError, match="match must hold booleans"):
        run_from_matches(np.array([0.5, 1.0]))


def request(n=5, signals=True, key="q", category=None, seed=0):
    gen = np.random.default_rng(seed)
    run = run_from_matches(gen.random(n) < 0.7).astype(np.int16)
    values = {name: gen.random(n).astype(np.float32) for name in SIGNALS} if signals else {}
    return RequestSpeculation(run=run, key=key, category=category, **values)


def test_request_validation():
    r = request(4)
    assert len(r) == 4 and r.signals_present() == frozenset(SIGNALS)
    with pytest.raises(ValueError):
        r.run[0] = 3
    assert RequestSpeculation(run=np.array([2, 1], dtype=np.int64)).run.dtype == np.int32
    with pytest.raises(TraceError, match="run must be a non-empty 1-D array"):
        RequestSpeculation(run=np.array([], dtype=np.int32))
    with pytest.raises(TraceError, match="run has a negative value"):
        RequestSpeculation(run=np.array([1, -1]))
    with pytest.raises(TraceError, match="run must hold integers"):
        RequestSpeculation(run=np.array([1.0, 0.0]))
    with pytest.raises(TraceError, match=r"request 'k': kl has shape \(3,\) but run has \(2,\)"):
        RequestSpeculation(run=np.array([1, 0]), kl=np.zeros(3), key="k")


def test_trace_validation():
    with pytest.raises(TraceError, match="no requests"):
        SpeculationTrace(requests=())
    with pytest.raises(TraceError, match=r"requests\[1\] has signals \[\] but requests\[0\] has"):
        SpeculationTrace(requests=(request(), request(signals=False)))
    with pytest.raises(TraceError, match="meta is not JSON-serialisable"):
        SpeculationTrace(requests=(request(),), meta={"x": object()})
    trace = SpeculationTrace(requests=[request(), request()], meta={"a": 1})
    assert len(trace) == 2 and isinstance(trace.requests, tuple)
    assert trace.signals_available() == frozenset(SIGNALS)
    assert SpeculationTrace((request(signals=False),)).signals_available() == frozenset()


@pytest.mark.parametrize("signals", [True, False])
def test_save_load_round_trip(tmp_path, signals):
    requests = tuple(request(n, signals, key=f"q{n}", category=None if n % 2 else "code",
                             seed=n) for n in (1, 7, 30, 2))
    meta = {"drafter": "d", "target": "t", "temperature": 0.0, "max_run": 255,
            "parametric": False, "nested": {"list": [1, 2]}}
    trace = SpeculationTrace(requests, meta)
    path = tmp_path / "trace.npz"
    trace.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["trace.npz"]
    back = SpeculationTrace.load(path)
    assert back.meta == meta
    assert back.signals_available() == trace.signals_available()
    for a, b in zip(trace.requests, back.requests, strict=True):
        assert (a.key, a.category) == (b.key, b.category)
        assert np.array_equal(a.run, b.run)
        for name in SIGNALS:
            if signals:
                assert np.array_equal(getattr(a, name), getattr(b, name))
            else:
                assert getattr(b, name) is None
    with pytest.raises(ValueError):
        back.requests[0].run[0] = 1


@settings(deadline=None, max_examples=25)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=8), st.integers(0, 2**31))
def test_round_trip_property(tmp_path_factory, lengths, seed):
    trace = SpeculationTrace(tuple(request(n, seed=seed + n) for n in lengths), {"s": seed})
    path = tmp_path_factory.mktemp("spec") / "t.npz"
    trace.save(path)
    back = SpeculationTrace.load(path)
    assert [len(r) for r in back.requests] == lengths
    assert all(np.array_equal(a.run, b.run) and np.array_equal(a.kl, b.kl)
               for a, b in zip(trace.requests, back.requests, strict=True))


def good_arrays():
    return {
        "run": np.array([1, 0, 2, 1, 0], dtype=np.int16),
        "offsets": np.array([0, 2, 5]),
        "keys": np.array(["a", "b"]),
        "meta_json": np.array(json.dumps({"max_run": 4})),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.pop("offsets"), "missing array 'offsets'"),
        (lambda a: a.update(offsets=np.array([0, 2, 4])), "inconsistent offsets"),
        (lambda a: a.update(offsets=np.array([0, 2, 2, 5])), "inconsistent offsets"),
        (lambda a: a.update(run=np.array([1, 0, 2, -1, 0])),
         "negative run -1 at request 1, position 1"),
        (lambda a: a.update(run=np.array([1, 0, 9, 1, 0])), "a run of 9 exceeds meta max_run 4"),
        (lambda a: a.update(keys=np.array(["a"])), "'keys' has 1 entries for 2 requests"),
        (lambda a: a.update(kl=np.zeros(3)), "'kl' has shape"),
        (lambda a: a.update(meta_json=np.array("{nope")), "meta_json is not valid JSON"),
    ],
)
def test_load_rejects_damaged_files(tmp_path, change, message):
    arrays = good_arrays()
    change(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(TraceError, match=message):
        SpeculationTrace.load(path)


def test_load_accepts_hand_written_file(tmp_path):
    np.savez(tmp_path / "ok.npz", **good_arrays())
    trace = SpeculationTrace.load(tmp_path / "ok.npz")
    assert [r.run.tolist() for r in trace.requests] == [[1, 0], [2, 1, 0]]
    assert [r.category for r in trace.requests] == [None, None]


def test_load_missing_or_not_npz(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.npz: file not found"):
        SpeculationTrace.load(tmp_path / "nope.npz")
    text = tmp_path / "t.npz"
    text.write_text("hello")
    with pytest.raises(TraceError, match=r"t\.npz: not a speculation trace \.npz"):
        SpeculationTrace.load(text)
    objects = tmp_path / "o.npz"
    np.savez(objects, run=np.array([object()], dtype=object))
    with pytest.raises(TraceError, match=r"not a speculation trace \.npz"):
        SpeculationTrace.load(objects)


def test_from_concatenated_validates():
    trace = SpeculationTrace.from_concatenated(
        np.array([1, 0, 0]), np.array([0, 1, 3]), {"m": 1}, keys=["x", "y"],
        categories=["c", None], signals={"kl": np.array([0.1, 0.2, 0.3])},
    )
    assert trace.requests[1].kl.dtype == np.float32 and trace.requests[0].category == "c"
    assert trace.signals_available() == frozenset({"kl"})
    with pytest.raises(TraceError, match="unknown signal 'entropy'"):
        SpeculationTrace.from_concatenated(np.array([0]), np.array([0, 1]), {},
                                           signals={"entropy": np.zeros(1)})

"""A parametric trace drawn as it is read (millions of requests in bounded memory) holds the very
numbers of the trace drawn at once; what cannot be drawn so is refused with its estimate where it
cannot fit."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import SchedulerConfig, simulate
from simulator.acceptance import AcceptanceReplay
from spectune.simulate import SimulationSpec, build_inputs
from traces import TraceError
from traces import parametric as parametric_module
from traces.parametric import LazyParametricTrace, parametric_trace
from traces.speculation import SIGNALS


def lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 300, n)


@pytest.mark.parametrize("spec", ["iid:0.7", "beta:7,3", "beta:0.5,0.5"])
def test_the_lazy_trace_holds_the_eager_traces_numbers_in_any_order(spec):
    out = lengths(500)
    eager = parametric_trace(spec, out, np.random.default_rng(9), lazy=False)
    lazy = parametric_trace(spec, out, np.random.default_rng(9), lazy=True)
    assert isinstance(lazy, LazyParametricTrace)
    lazy._block, lazy._keep = 7, 2  # many blocks, most of them dropped and drawn again
    order = np.random.default_rng(1).permutation(len(out))
    for i in [*order, *order[:50]]:
        want, got = eager.requests[i], lazy.requests[i]
        assert np.array_equal(want.run, got.run) and want.run.dtype == got.run.dtype
        for name in SIGNALS:
            assert np.array_equal(getattr(want, name), getattr(got, name))
    assert lazy.meta == eager.meta
    assert lazy.signals_available() == eager.signals_available()
    assert np.array_equal(lazy.request_lengths(), eager.request_lengths())
    assert AcceptanceReplay(lazy, out).tiled is False


def test_a_simulation_on_the_lazy_trace_is_the_simulation_on_the_eager_one():
    spec = SimulationSpec(workload="poisson", rate=8.0, requests=300, acceptance="beta:7,3",
                          seed=4)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    out = inputs.workload.output_tokens
    runs = []
    for lazy in (False, True):
        trace = parametric_trace("beta:7,3", out, np.random.default_rng(2), lazy=lazy)
        if lazy:
            trace._block = 16
        runs.append(simulate(inputs.workload, inputs.latency, trace, inputs.policy,
                             inputs.kv_capacity_tokens))
    assert runs[0].requests.equals(runs[1].requests) and runs[0].steps.equals(runs[1].steps)


def test_big_workloads_draw_lazily_and_what_cannot_is_refused_with_an_estimate(monkeypatch):
    monkeypatch.setattr(parametric_module, "LAZY_POSITIONS", 1000)
    out = lengths(40)  # ~6000 positions: past the threshold
    assert isinstance(parametric_trace("iid:0.6", out, np.random.default_rng(0)),
                      LazyParametricTrace)
    assert not isinstance(parametric_trace("iid:0.6", out[:3], np.random.default_rng(0)),
                          LazyParametricTrace)
    # markov and '~C' are drawn at once: fine while they fit ...
    assert len(parametric_trace("markov:0.9,0.2@20", out, np.random.default_rng(0))) == 40
    # ... refused in one line, with the estimate, where they cannot
    monkeypatch.setattr(parametric_module, "available_memory_bytes", lambda: 100_000)
    with pytest.raises(TraceError, match=r"40 requests \(.* output positions\) need about "
                                         r".* GiB.* 0.0 GiB available; use iid or beta"):
        parametric_trace("beta:7,3~20", out, np.random.default_rng(0))
    with pytest.raises(TraceError, match="only iid and beta acceptance without '~C'"):
        parametric_trace("markov:0.9,0.2@20", out, np.random.default_rng(0), lazy=True)


def test_the_lazy_requests_read_one_at_a_time():
    trace = parametric_trace("iid:0.5", lengths(10), np.random.default_rng(0), lazy=True)
    assert len(trace.requests) == 10 and len(trace.requests[-1]) == lengths(10)[-1]
    with pytest.raises(IndexError):
        trace.requests[10]
    with pytest.raises(TypeError, match="one at a time"):
        trace.requests[2:4]

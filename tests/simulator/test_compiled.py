"""The compiled loops (simulator/compiled.py) against the numpy code they stand for: the same
walks, draft feeds and kept sums to the integer, on random requests, and the same records from
whole runs (a draft model's passes priced on the roofline to the bit, tensor parallel too);
`auto` loads them for long runs only; where numba is missing, or `SPECTUNE_KERNELS=numpy`,
runs take the numpy code; a bad `SPECTUNE_KERNELS` is refused in one line; the loops refuse
indices past their arrays instead of writing there."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from simulator import ConfigError, kernels
from simulator.batch_columns import BatchColumns
from simulator.draft_feed import next_feed
from simulator.replica import Replica
from simulator.request import RequestState, walk_chain

pytest.importorskip("numba")


@pytest.fixture
def loops(monkeypatch):
    """Switch between the two within a test: `loops(True)` compiled, `loops(False)` numpy
    (the process's choice restored after: later tests take what they would have)."""
    monkeypatch.setattr(kernels, "_loaded", kernels._loaded)
    monkeypatch.setattr(kernels, "_active", kernels._active)

    def use(compiled: bool):
        monkeypatch.setenv("SPECTUNE_KERNELS", "numba" if compiled else "numpy")
        return kernels.prepare(0)
    return use


def _request(rng, capped: bool, listed: bool = False) -> RequestState:
    output = int(rng.integers(1, 90))
    request = RequestState(0, 0, 0.0, int(rng.integers(1, 3000)), output)
    request.run = rng.integers(0, 12, output)
    cap = rng.integers(0, 9, output) if capped else None
    request.cap = cap.tolist() if listed and cap is not None else cap
    request.generated = int(rng.integers(1, output + 1))
    request.draft_feed = int(rng.integers(1, 5))
    return request


def _walked(request: RequestState, k: int) -> tuple:
    request.chain_k = -1  # no walk yet
    walk_chain(request, k)
    ks = None if request.chain_ks is None else request.chain_ks.tolist()
    return request.chain.tolist(), ks


@pytest.mark.parametrize("capped,listed", [(False, False), (True, False), (True, True)])
def test_walks_are_the_numpy_walks(loops, capped, listed):
    rng = np.random.default_rng(3 + capped + listed)
    for _ in range(400):
        request, k = _request(rng, capped, listed), int(rng.integers(0, 11))
        assert loops(True) is not None
        compiled = _walked(request, k)
        loops(False)
        assert compiled == _walked(request, k)


@pytest.mark.parametrize("rule", ["bonus", "committed", "one"])
@pytest.mark.parametrize("capped", [False, True])
def test_draft_feeds_are_next_feed_step_by_step(loops, rule, capped):
    rng = np.random.default_rng(11 + capped)
    replica = SimpleNamespace(catch_up=rule)
    for _ in range(300):
        request = _request(rng, capped)
        walk_chain(request, int(rng.integers(0, 9)))
        loops(True)
        compiled = Replica._walk_feeds(replica, request).tolist()
        loops(False)
        assert compiled == Replica._walk_feeds(replica, request).tolist()
        drafts = (request.chain_ks.tolist() if request.chain_ks is not None
                  else [request.chain_k] * (len(request.chain) - 1))
        feed, expected = request.draft_feed, [request.draft_feed]
        for d, before, after in zip(drafts, request.chain[:-1], request.chain[1:]):
            feed = next_feed(rule, feed, d, int(after - before))
            expected.append(feed)
        assert compiled == expected


@pytest.mark.parametrize("draft", [False, True])
@pytest.mark.parametrize("capped", [False, True])
def test_kept_sums_are_the_numpy_sums_through_adds_and_removes(loops, capped, draft):
    sums = {}
    for compiled in (True, False):
        loops(compiled)
        rng_run = np.random.default_rng(99 + capped + 2 * draft)
        columns = BatchColumns(capacity=16, k_max=10, draft=draft)  # small: it moves, grows
        live = []
        for _ in range(120):
            if rng_run.random() < 0.5 or not live:
                request = _request(rng_run, capped)
                walk_chain(request, int(rng_run.integers(0, 11)))
                request.chain_feeds = rng_run.integers(1, 6, len(request.chain))
                columns.add(request, request.chain_k)
                live.append((request, columns.now))
            if rng_run.random() < 0.3:  # a request leaves from where it has got to
                request, since = live.pop(int(rng_run.integers(len(live))))
                request.chain_at = min(columns.now - since, len(request.chain) - 1)
                columns.remove(request)
            columns.now += int(rng_run.integers(0, 3))
        sums[compiled] = (columns._origin, columns._sums.copy())
    assert sums[True][0] == sums[False][0]
    np.testing.assert_array_equal(sums[True][1], sums[False][1])
    assert sums[True][1].any()


@pytest.mark.parametrize("acceptance,more", [
    ("smollm2-ngram", {}),  # capped drafts: the draft passes summed in step order
    ("beta:7,3~20", {}),  # a fixed k: summed down the passes
    ("beta:7,3~20", {"target": "Llama-3.1-70B", "tp": 8, "draft_tp": "2"}),  # all-reduces
])
def test_a_run_gives_the_same_records_with_either(loops, acceptance, more):
    from policies import make_policy
    from simulator import ClusterConfig, SchedulerConfig
    from simulator.engine import simulate
    from spectune.simulate import SimulationSpec, build_inputs

    frames = {}
    for compiled in (True, False):
        loops(compiled)
        spec = SimulationSpec(workload="poisson", rate=12.0, requests=300, lengths="azure-conv",
                              acceptance=acceptance, seed=4, draft="Llama-68M", **more)
        scheduler = SchedulerConfig()
        inputs = build_inputs(spec, {"k": "4"}, scheduler)
        result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                          make_policy("fixed", {"k": 4}), inputs.kv_capacity_tokens, scheduler,
                          ClusterConfig(1, "least-loaded"))
        assert (kernels.compiled() is not None) == compiled
        frames[compiled] = (result.requests, result.steps)
    pd.testing.assert_frame_equal(frames[True][0], frames[False][0], check_exact=True)
    pd.testing.assert_frame_equal(frames[True][1], frames[False][1], check_exact=True)


def test_auto_loads_them_for_long_runs_only(monkeypatch):
    monkeypatch.setenv("SPECTUNE_KERNELS", "auto")
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "_active", None)
    assert kernels.prepare(kernels.AUTO_REQUESTS - 1) is None
    assert kernels.prepare(kernels.AUTO_REQUESTS) is not None
    assert kernels.prepare(1) is not None  # loaded once, every run takes them


def test_without_numba_runs_take_the_numpy_code(monkeypatch):
    monkeypatch.setenv("SPECTUNE_KERNELS", "numba")
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "_active", None)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    assert kernels.prepare(10**9) is None
    assert kernels.compiled() is None


def test_a_bad_choice_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(kernels, "_active", kernels._active)
    monkeypatch.setenv("SPECTUNE_KERNELS", "fortran")
    with pytest.raises(ConfigError, match="SPECTUNE_KERNELS='fortran': use one of auto"):
        kernels.prepare(1)


def test_the_loops_refuse_indices_past_their_arrays(loops):
    module = loops(True)
    none = np.zeros(0, dtype=np.int64)
    with pytest.raises(IndexError, match="past the request's acceptance run"):
        module.walk(np.zeros(3, dtype=np.int64), none, 0, 0, 5, 2)
    with pytest.raises(IndexError, match="longer than the kept sums"):
        module.add_shares(np.zeros((6, 4), dtype=np.int64), 0, np.arange(6), 0, none, 1, 1,
                          4, 0, False, none)
    with pytest.raises(IndexError, match="outside the kept sums' rows"):
        module.add_shares(np.zeros((7, 8), dtype=np.int64), 0, np.arange(4), 0,
                          np.array([0, 5, 1]), 5, 1, 4, 3, False, none)

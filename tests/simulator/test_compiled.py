"""The compiled loops (simulator/compiled.py) against the numpy code they stand for: the same
walks, draft feeds and kept sums to the integer, on random requests, and the same records from
whole runs (a draft model's passes priced on the roofline to the bit, tensor parallel too);
`auto` loads them for long runs only; where numba is missing, or `SPECTUNE_KERNELS=numpy`,
runs take the numpy code; a bad `SPECTUNE_KERNELS` is refused in one line; the loops refuse
indices past their arrays instead of writing there."""

from __future__ import annotations

import sys
import warnings
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from policies.auto import Auto
from policies.goodput import Goodput
from simulator import ConfigError, SchedulerConfig, kernels
from simulator.batch_columns import BatchColumns
from simulator.draft_feed import next_feed
from simulator.replica import Replica
from simulator.request import RequestState, walk_chain

pytest.importorskip("numba")


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


def test_stop_lengths_are_the_numpy_ones(loops):
    """A folded draft stop's lengths (`acceptance.stop_lengths`), compiled: the same integers,
    no stop at all and a stop at the last position among them."""
    from simulator.acceptance import UNCAPPED, stop_lengths

    compiled = loops(True)
    rng = np.random.default_rng(5)
    for n in [0, 1, 2, 7, 300] * 40:
        stops = rng.random(n) < rng.choice([0.0, 0.05, 0.5])
        assert compiled.stop_lengths(stops, UNCAPPED).tolist() == stop_lengths(stops).tolist()


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


@pytest.mark.parametrize("acceptance,more,policy,scheduler", [
    # capped drafts: the draft passes summed in step order
    ("smollm2-ngram", {}, "fixed", {}),
    ("beta:7,3~20", {}, "fixed", {}),  # a fixed k: summed down the passes
    ("beta:7,3~20", {"target": "Llama-3.1-70B", "tp": 8, "draft_tp": "2"}, "fixed", {}),
    ("smollm2-ngram", {"draft": "none"}, "fixed", {}),  # model-free: the verify steps
    ("smollm2-ngram", {"draft": "none"}, "fixed", {"scheduler": "vllm-v1"}),  # blocks kept
    ("beta:7,3~20", {"draft": "none"}, "fixed",
     {"chunked_prefill": True, "max_batched_tokens": 512}),
    ("beta:7,3~20", {}, "heuristic", {}),  # walked by the policy, a draft model's feeds
    ("smollm2-ngram", {"draft": "none"}, "goodput", {}),  # holds: walks replaced, removed
])
def test_a_run_gives_the_same_records_with_either(loops, acceptance, more, policy, scheduler):
    from policies import make_policy
    from simulator import ClusterConfig, SchedulerConfig
    from simulator.engine import simulate
    from spectune.simulate import SimulationSpec, build_inputs

    frames = {}
    for compiled in (True, False):
        loops(compiled)
        spec = SimulationSpec(workload="poisson", rate=12.0, requests=300, lengths="azure-conv",
                              acceptance=acceptance, seed=4, **{"draft": "Llama-68M", **more})
        config = SchedulerConfig(**scheduler)
        params = {"k": 4} if policy == "fixed" else {}
        inputs = build_inputs(spec, {key: str(v) for key, v in params.items()}, config)
        result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                          make_policy(policy, params), inputs.kv_capacity_tokens, config,
                          ClusterConfig(1, "least-loaded"))
        assert (kernels.compiled() is not None) == compiled
        frames[compiled] = (result.requests, result.steps)
    pd.testing.assert_frame_equal(frames[True][0], frames[False][0], check_exact=True)
    pd.testing.assert_frame_equal(frames[True][1], frames[False][1], check_exact=True)


@pytest.mark.parametrize("target,tp,compute_bound", [("Llama-3.1-8B", 1, False),
                                                     ("Llama-3.1-8B", 1, True),
                                                     ("Llama-3.1-70B", 4, True)])
def test_a_draft_model_step_is_priced_as_the_numpy_code_prices_it(loops, monkeypatch, target,
                                                                  tp, compute_bound):
    from dataclasses import replace

    import spectune.simulate
    from simulator.step_cost import StepCostModel
    from spectune.simulate import SimulationSpec, build_inputs

    if compute_bound:  # memory 10,000 times faster: the passes' causal pairs priced too
        gpu = spectune.simulate.get_gpu
        monkeypatch.setattr(spectune.simulate, "get_gpu", lambda name: replace(
            gpu(name), bandwidth_bytes_per_s=gpu(name).bandwidth_bytes_per_s * 1e4))
    spec = SimulationSpec(workload="poisson", rate=4.0, requests=5, lengths="azure-conv",
                          acceptance="iid:0.6", seed=0, draft="Llama-68M", target=target, tp=tp)
    cost = StepCostModel(build_inputs(spec, {}, SchedulerConfig()).latency)
    rng = np.random.default_rng(tp + compute_bound)
    for _ in range(80):
        b = int(rng.integers(1, 65))
        ks = rng.integers(0, 11, b).tolist()
        cached = rng.integers(1, 30_000, b).tolist()
        feeds = rng.integers(1, 7, b).tolist() if rng.random() < 0.7 else None
        times = []
        for compiled in (True, False):
            loops(compiled)
            times.append(float(cost.iteration_s(ks, cached, feeds=feeds)).hex())
        assert times[0] == times[1]


def test_loading_compiles_every_specialisation_a_run_calls(loops):
    """A loop called with argument types `warm` did not give compiles in the middle of a
    run (numba compiles per type signature: a read-only array, another layout): a second or
    more of a run's time spent there."""
    from numba.core.registry import CPUDispatcher

    from policies import compiled as policy_loops
    from policies import make_policy
    from simulator import ClusterConfig
    from simulator.engine import simulate
    from spectune.simulate import SimulationSpec, build_inputs

    simulator_loops = loops(True)
    from simulator import compiled_goodput, compiled_oracle, compiled_steps, compiled_walked

    def signatures():
        return {name: len(loop.signatures)
                for module in (simulator_loops, policy_loops, compiled_steps, compiled_walked,
                               compiled_goodput, compiled_oracle)
                for name, loop in vars(module).items() if isinstance(loop, CPUDispatcher)}
    warmed = signatures()
    chunked = {"chunked_prefill": True, "max_batched_tokens": 512}
    for acceptance, draft, policy, scheduler in [
            ("smollm2-ngram", "none", "auto", {}), ("beta:7,3~20", "Llama-68M", "auto", {}),
            ("beta:7,3~20", "none", "kld_variance", {}),
            ("smollm2-ngram", "Llama-68M", "fixed", {}),
            ("beta:7,3~20", "Llama-68M", "heuristic", {}),
            ("beta:7,3~20", "Llama-68M", "oracle", {}),
            ("smollm2-ngram", "none", "goodput", chunked),
            ("smollm2-ngram", "none", "gammatune_plus", {}),
            ("beta:7,3~20", "none", "gammatune", {}),
            ("smollm2-ngram", "none", "adaedl", {}),
            ("beta:7,3~20", "none", "adaedl", {}),
            ("smollm2-ngram", "none", "fixed", {"scheduler": "vllm-v1"}),
            ("smollm2-ngram", "none", "auto", {"scheduler": "vllm-v1"}),
            ("beta:7,3~20", "Llama-68M", "heuristic", {"scheduler": "vllm-v1"}),
            ("smollm2-ngram", "none", "gammatune_plus", {"scheduler": "vllm-v1"}),
            ("smollm2-ngram", "none", "adaedl", {"scheduler": "vllm-v1"}),
            ("smollm2-ngram", "none", "oracle", {"scheduler": "vllm-v1"}),
            ("smollm2-ngram", "none", "goodput", {"scheduler": "vllm-v1"}),
            ("smollm2-ngram", "none", "oracle", {}),
            ("beta:7,3~20", "Llama-68M", "goodput", {}),
            ("smollm2-ngram", "none", "goodput/per_request", {"scheduler": "vllm-v1"}),
            ("beta:7,3~20", "Llama-68M", "goodput/per_request", {}),
            ("beta:7,3~20", "none", "oracle/probabilities", {}),
            ("beta:7,3~20", "Llama-68M", "oracle/probabilities", {"scheduler": "vllm-v1"})]:
        spec = SimulationSpec(workload="poisson", rate=12.0, requests=60, lengths="azure-conv",
                              acceptance=acceptance, seed=1, draft=draft)
        config = SchedulerConfig(**scheduler)
        params = {"k": 4} if policy == "fixed" else {}
        inputs = build_inputs(spec, {key: str(v) for key, v in params.items()}, config)
        if "/" in policy:
            policy, params = {"goodput/per_request": ("goodput", {"per_request": "true"}),
                              "oracle/probabilities": ("oracle", {"knows": "probabilities"})
                              }[policy]
        simulate(inputs.workload, inputs.latency, inputs.acceptance, make_policy(policy, params),
                 inputs.kv_capacity_tokens, config, ClusterConfig(1, "least-loaded"))
    assert signatures() == warmed


def test_the_loops_cache_is_named_by_every_file_they_are_built_from():
    """numba's cache checks only each function's own file: `kernels.SOURCES` (hashed into the
    cache's folder name) lists every project module the compiled modules import at their top,
    their code or their constants, so an edit of any of them compiles the loops anew."""
    import ast
    from pathlib import Path

    root = Path(kernels.__file__).resolve().parents[1]
    compiled = sorted(str(path.relative_to(root)) for package in ("policies", "simulator")
                      for path in (root / package).glob("compiled*.py"))
    assert len(compiled) == 7 and set(compiled) <= set(kernels.SOURCES)
    for name in compiled:
        for node in ast.parse((root / name).read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in (
                    "policies", "simulator", "traces"):
                assert node.module.replace(".", "/") + ".py" in kernels.SOURCES, (name, node.module)
    names = [kernels.sources_hash()]
    kernels.SOURCES, saved = kernels.SOURCES[:-1], kernels.SOURCES
    try:
        names.append(kernels.sources_hash())
    finally:
        kernels.SOURCES = saved
    assert names[0] != names[1]
    assert Path(kernels._cache_dir()).name == f"numba-{names[0]}"


def test_auto_loads_them_for_long_runs_only(monkeypatch):
    monkeypatch.setenv("SPECTUNE_KERNELS", "auto")
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "_active", None)
    from policies import kernels as policy_kernels
    assert kernels.prepare(kernels.AUTO_REQUESTS - 1) is None
    assert policy_kernels.compiled() is None
    assert kernels.prepare(kernels.AUTO_REQUESTS) is not None
    assert policy_kernels.compiled() is not None  # auto's, with the simulator's
    assert kernels.prepare(1) is not None  # loaded once, every run takes them


def test_a_policy_that_steps_compiled_loads_them_for_shorter_runs(monkeypatch):
    from policies import make_policy
    from simulator import ClusterConfig, SchedulerConfig, whole_run
    from simulator.engine import simulate
    from spectune.simulate import SimulationSpec, build_inputs

    monkeypatch.setenv("SPECTUNE_KERNELS", "auto")
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "_active", None)
    n = Auto.compiled_steps
    assert kernels.prepare(n, (n - 1) / n) is None
    assert kernels.prepare(n, 1.0) is not None
    asked = []  # what a run asks for: its requests, and those stepped by such a policy
    monkeypatch.setattr(kernels, "prepare", lambda *args: asked.append(args))
    spec = SimulationSpec(workload="poisson", rate=4.0, requests=6, lengths="azure-conv",
                          acceptance="beta:7,3", seed=0)
    inputs = build_inputs(spec, {}, SchedulerConfig())
    for policy, params in (("auto", {}), ("goodput", {}), ("fixed", {}),
                           ("goodput", {"per_request": "true"})):
        simulate(inputs.workload, inputs.latency, inputs.acceptance, make_policy(policy, params),
                 inputs.kv_capacity_tokens, SchedulerConfig(), ClusterConfig(1, "least-loaded"))
    assert asked == [(6, 6 / Auto.compiled_steps), (6, 6 / Goodput.compiled_steps),
                     (6, 6 / whole_run.REPAYS_FROM[True]),  # (fixed: the whole run's loop)
                     (6, 6 / Goodput.compiled_steps_per_request)]  # (its plans: sooner)
    assert Goodput.compiled_steps_per_request < Goodput.compiled_steps


def test_a_walked_policy_loads_them_for_shorter_runs_under_vllms_scheduler(monkeypatch):
    """Under vLLM's scheduler a walked policy's engine steps run compiled only with the loops
    (else one at a time in Python), so a run repays them from fewer requests there."""
    from policies import make_policy
    from simulator import ClusterConfig
    from simulator.engine import simulate
    from simulator.stepped import PLANNED_REPAYS_FROM
    from spectune.simulate import SimulationSpec, build_inputs

    asked = []
    monkeypatch.setattr(kernels, "prepare", lambda *args: asked.append(args))
    spec = SimulationSpec(workload="poisson", rate=4.0, requests=6, lengths="azure-conv",
                          acceptance="beta:7,3", seed=0, draft="none")
    for scheduler in (SchedulerConfig(), SchedulerConfig(scheduler="vllm-v1")):
        inputs = build_inputs(spec, {}, scheduler)
        for policy in ("heuristic", "goodput"):
            simulate(inputs.workload, inputs.latency, inputs.acceptance,
                     make_policy(policy, {}), inputs.kv_capacity_tokens, scheduler,
                     ClusterConfig(1, "least-loaded"))
    # (goodput's runs stand under every scheduler: its own threshold under either)
    assert asked == [(6, 0.0), (6, 6 / Goodput.compiled_steps), (6, 6 / PLANNED_REPAYS_FROM),
                     (6, 6 / Goodput.compiled_steps)]


def test_a_sweep_asks_for_its_batchs_requests_and_those_auto_steps(monkeypatch, tmp_path):
    from spectune.evaluate import Runner, Task
    from spectune.search import Candidate
    from spectune.simulate import SimulationSpec

    asked = []
    monkeypatch.setattr(kernels, "prepare", lambda *args: asked.append(args))
    spec = SimulationSpec(requests=20, workload="azure-conv")
    tasks = [Task(spec, SchedulerConfig(), Candidate(policy, params), rate=4.0, seed=0)
             for policy, params in (("auto", ()), ("fixed", ()), ("batch_adaptive", ()),
                                    ("goodput", ()), ("goodput", (("per_request", "true"),)))]
    with Runner(tmp_path, jobs=1) as runner:
        runner.run(tasks)
    # (before its runs, each then asking for its own; goodput per request from its own)
    assert asked[0] == (100, Fraction(20, Auto.compiled_steps)
                        + Fraction(20, Goodput.compiled_steps)
                        + Fraction(20, Goodput.compiled_steps_per_request))
    asked.clear()  # (ten runs of 30 auto requests repay loading them, as one of 300)
    spec = SimulationSpec(requests=30, workload="azure-conv")
    with Runner(tmp_path / "ten", jobs=1) as runner:
        runner.run([Task(spec, SchedulerConfig(), Candidate("auto", ()), rate=4.0, seed=seed)
                    for seed in range(10)])
    assert asked[0] == (300, 1)


def test_without_numba_runs_take_the_numpy_code(monkeypatch):
    monkeypatch.setenv("SPECTUNE_KERNELS", "numba")
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "_active", None)
    monkeypatch.setattr(kernels, "_failed", [])
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    assert kernels.prepare(10**9) is None
    assert kernels.compiled() is None
    monkeypatch.setenv("SPECTUNE_KERNELS", "auto")  # and remembered: not looked for again
    monkeypatch.delitem(sys.modules, "numba")
    assert kernels.prepare(10**9) is None and kernels._failed == ["numba is not installed"]
    from policies import kernels as policy_kernels
    assert policy_kernels.compiled() is None  # auto too


def test_a_bad_choice_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(kernels, "_active", kernels._active)
    monkeypatch.setenv("SPECTUNE_KERNELS", "fortran")
    with pytest.raises(ConfigError, match="SPECTUNE_KERNELS='fortran': use one of auto"):
        kernels.prepare(1)


def test_the_loops_refuse_indices_past_their_arrays(loops):
    module = loops(True)
    none, ints = np.zeros(0, dtype=np.int64), np.zeros(5, dtype=np.int64)
    with pytest.raises(IndexError, match="past the request's acceptance run"):
        module.walk(np.zeros(3, dtype=np.int64), none, False, 0, 0, 5, 2)
    with pytest.raises(IndexError, match="past the request's acceptance run or caps"):
        module.walk(ints, none, True, 0, 0, 5, 2)  # capped, by an empty cap
    with pytest.raises(ValueError, match="negative cap"):  # it would not move forward
        module.walk(ints, np.array([5, -3, 5, 5, 5]), True, 0, 0, 5, 2)
    with pytest.raises(IndexError, match="longer than its drafts"):
        module.feeds(np.arange(5), np.ones(2, dtype=np.int64), True, 2, 1, 0)
    with pytest.raises(ValueError, match="negative drafts"):
        module.feeds(np.arange(3), np.array([1, -1]), True, 2, 1, 0)
    with pytest.raises(IndexError, match="longer than the kept sums"):
        module.add_shares(np.zeros((6, 4), dtype=np.int64), 0, np.arange(6), 0, none, False,
                          1, 1, 4, 0, False, none)
    with pytest.raises(IndexError, match="outside the kept sums' rows"):
        module.add_shares(np.zeros((7, 8), dtype=np.int64), 0, np.arange(4), 0,
                          np.array([0, 5, 1]), True, 5, 1, 4, 3, False, none)
    with pytest.raises(IndexError, match="other shapes"):
        module.chain_pass_times(np.ones((2, 3), dtype=np.int64), np.ones((2, 4), dtype=np.int64),
                                ints[:4], ints[:4], 1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0,
                                True)
    with pytest.raises(IndexError, match="other lengths"):
        module.verify_times(2, ints, ints[:4], ints, 1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0,
                            0.0)


def test_a_trace_with_a_negative_or_nan_proposal_count_is_refused():
    from traces import TraceError
    from traces.speculation import RequestSpeculation

    for bad in (-1.0, float("nan")):
        with pytest.raises(TraceError, match=r"proposable\[1\] is .*give a finite number >= 0"):
            RequestSpeculation(run=np.array([1, 2, 0]), proposable=np.array([2.0, bad, 1.0]),
                         key="r0")


def test_loops_that_cannot_load_fall_back_to_numpy_once_said(monkeypatch):
    from simulator import compiled as module

    def broken():
        raise RuntimeError("no LLVM target for this CPU")
    monkeypatch.setattr(module, "warm", broken)
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "_active", None)
    monkeypatch.setattr(kernels, "_failed", [])
    monkeypatch.setenv("SPECTUNE_KERNELS", "auto")
    with pytest.warns(UserWarning, match="could not load .*no LLVM target.*numpy code"):
        assert kernels.prepare(10**6) is None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert kernels.prepare(10**6) is None
    assert not said  # said once a process
    monkeypatch.setenv("SPECTUNE_KERNELS", "numba")
    with pytest.raises(ConfigError, match=r"SPECTUNE_KERNELS=numba: the compiled loops could "
                                          r"not load .*SPECTUNE_KERNELS=numpy"):
        kernels.prepare(1)


def test_finished_candidates_outside_the_batch_fall_back_to_a_scan():
    from simulator.scheduler import split_finished

    class Request:  # compared by identity, as RequestState is
        def __init__(self, done: bool) -> None:
            self.done = done
    running = [Request(d) for d in (False, True, False, True)]
    stranger = Request(True)
    def positions(candidates):
        keep, done = split_finished(running, candidates, lambda r: r.done)
        assert keep == [r for r in running if r not in done]
        return [running.index(r) for r in done]
    assert positions([running[3], running[1], running[3]]) == [1, 3]
    assert positions([stranger]) == [1, 3]

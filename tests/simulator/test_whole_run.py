"""A whole run in one compiled loop (simulator/whole_run.py, simulator/compiled_serve.py): the
plain scheduler with whole prompts or chunked prefill (model-free there), a policy that drafts
one k everywhere (fixed, confidence) or walks each request alone (heuristic, gammatune,
gammatune_plus, adaedl), a chain on the roofline (model-free or a draft model's), one replica
or several behind either router. Its
request and step records are the SimPy processes' to the bit (the compiled loops loaded for
both), with the drafter's caps (n-gram recordings) and without, k = 0 and k = k_max, tight KV
caches, a batch cap, token budgets, idle stretches, totals only; with windows, buffers and sums
small enough that every pause and growth is taken. Elsewhere the SimPy processes run."""

from __future__ import annotations

import json

import pytest

from policies import make_policy
from simulator import ClusterConfig, SchedulerConfig, simulate, whole_run
from simulator import engine as engine_module
from spectune.simulate import SimulationSpec, build_inputs

pytest.importorskip("numba")

CHUNKED = {"chunked_prefill": True, "max_batched_tokens": 2048}
#: (acceptance, rate, requests, fixed's k or another policy, scheduler settings, KV tokens or
#: None, lengths[, draft[, replicas and router]])
CASES = [
    ("smollm2-ngram", 20.0, 600, 4, {}, None, "azure-conv"),
    ("smollm2-ngram", 2.0, 150, 6, {}, None, "azure-conv"),  # idle stretches
    ("smollm2-ngram", 16.0, 500, 3, {"k_max": 3}, None, "azure-conv"),  # drafts up to k_max
    ("smollm2-eagle-ngram", 24.0, 500, 3, {"k_max": 3}, None, "azure-code"),
    ("iid:0.7", 20.0, 600, 4, {}, None, "azure-conv"),
    ("beta:7,3~20", 30.0, 500, 5, {"k_max": 6}, None, "azure-conv"),
    ("smollm2-ngram", 20.0, 400, 0, {}, None, "azure-conv"),
    ("iid:0.6", 40.0, 600, 4, {"max_num_seqs": 16}, 30_000, "azure-conv"),
    ("smollm2-ngram", 40.0, 600, 4, {"max_batched_tokens": 8192}, 60_000, "azure-conv"),
    ("iid:0.7", 60.0, 600, 4, {}, None, "lognormal:400,6,1.2"),  # many of 1 or 2 tokens
    ("smollm2-ngram", 20.0, 600, 4, {}, None, "azure-conv", "Llama-68M"),
    ("beta:7,3~20", 20.0, 600, 4, {}, None, "azure-conv", "Llama-68M"),
    ("smollm2-ngram", 30.0, 500, 8, {}, None, "azure-conv", "Llama-68M"),
    ("iid:0.7", 3.0, 200, 3, {}, None, "azure-conv", "Llama-68M"),
    ("smollm2-ngram", 20.0, 400, 0, {}, None, "azure-conv", "Llama-68M"),
    ("beta:7,3~20", 40.0, 600, 5, {"max_num_seqs": 24}, 40_000, "azure-conv", "Llama-68M"),
    # 8 passes or more: a one-step segment's passes summed pairwise, as numpy sums a (P, 1) array
    ("beta:7,3~20", 30.0, 600, 10, {"k_max": 10}, None, "azure-conv", "Llama-68M"),
    ("iid:0.8", 40.0, 600, 10, {"k_max": 10}, None, "azure-conv", "Llama-68M"),
    ("smollm2-ngram", 60.0, 900, 4, {}, None, "azure-conv", "none", 3, "least-loaded"),
    ("smollm2-ngram", 60.0, 900, 4, {}, None, "azure-conv", "none", 3, "round-robin"),
    ("iid:0.7", 40.0, 900, 4, {}, None, "azure-conv", "none", 3, "round-robin"),  # uncapped
    ("smollm2-ngram", 6.0, 300, 6, {}, None, "azure-conv", "none", 3, "least-loaded"),
    ("beta:7,3~20", 50.0, 900, 4, {}, None, "azure-conv", "Llama-68M", 4, "least-loaded"),
    ("smollm2-ngram", 30.0, 900, 4, {}, None, "azure-conv", "Llama-68M", 3, "round-robin"),
    ("iid:0.6", 80.0, 900, 4, {"max_num_seqs": 16}, 30_000, "azure-conv", "none", 3,
     "least-loaded"),
    ("iid:0.7", 200.0, 900, 3, {}, None, "lognormal:400,6,1.2", "none", 5, "least-loaded"),
    ("smollm2-ngram", 20.0, 600, 4, CHUNKED, None, "azure-conv"),
    ("iid:0.7", 20.0, 600, 4, CHUNKED, None, "azure-conv"),
    ("iid:0.7", 2.0, 150, 3, {**CHUNKED, "max_batched_tokens": 512}, None, "azure-conv"),
    ("beta:7,3~20", 40.0, 600, 5, {**CHUNKED, "max_batched_tokens": 1024, "max_num_seqs": 24},
     40_000, "azure-conv"),
    ("smollm2-ngram", 20.0, 400, 0, CHUNKED, None, "azure-conv"),
    ("iid:0.7", 60.0, 600, 4, {**CHUNKED, "max_batched_tokens": 256}, None,
     "lognormal:400,6,1.2"),
    ("smollm2-ngram", 60.0, 900, 4, {**CHUNKED, "max_batched_tokens": 4096}, None,
     "azure-conv", "none", 3, "least-loaded"),
    ("iid:0.7", 40.0, 900, 4, CHUNKED, None, "azure-conv", "none", 3, "round-robin"),
    # confidence: k = min(max_k, k_max) throughout, its stop folded into the caps
    ("beta:7,3~20", 20.0, 600, "confidence", {}, None, "azure-conv", "Llama-68M"),
    ("beta:7,3~20", 8.0, 600, "confidence", {"k_max": 4}, None, "azure-conv", "Llama-68M"),
    ("smollm2-eagle-ngram", 20.0, 900, "confidence", {}, None, "azure-conv", "Llama-68M", 3,
     "least-loaded"),
    ("beta:7,3~20", 20.0, 600, "confidence", CHUNKED, None, "azure-conv"),
    # walked policies: each request's walk by its walker, given to the loop
    ("beta:7,3~20", 20.0, 600, "heuristic", {}, None, "azure-conv", "Llama-68M"),
    ("smollm2-ngram", 20.0, 600, "gammatune", {}, None, "azure-conv"),
    ("beta:7,3~20", 8.0, 500, "gammatune_plus", {}, None, "azure-conv", "Llama-68M"),
    ("smollm2-eagle-ngram", 20.0, 600, "adaedl", {}, None, "azure-conv", "Llama-68M"),
    ("iid:0.7", 40.0, 900, "heuristic", {}, None, "azure-conv", "none", 3, "least-loaded"),
    ("smollm2-ngram", 20.0, 600, "heuristic", CHUNKED, None, "azure-conv"),
    # batch_adaptive: k by the batch's size, every running request walked anew where it moves
    ("smollm2-ngram", 20.0, 600, "batch_adaptive", {}, None, "azure-conv"),
    ("smollm2-ngram", 20.0, 600, "batch_adaptive", {}, None, "azure-conv", "Llama-68M"),
    ("iid:0.7", 40.0, 900, "batch_adaptive:[[1, 4, 6], [5, 16, 3], [17, 64, 1]]", {}, None,
     "azure-conv", "none", 3, "least-loaded"),
    ("smollm2-ngram", 20.0, 600, "batch_adaptive:[[1, 8, 5], [9, 30, 2]]", CHUNKED, None,
     "azure-conv"),
    ("beta:7,3~20", 20.0, 600, "batch_adaptive:[[1, 3, 10], [4, 20, 4]]", {"k_max": 10}, None,
     "azure-conv", "Llama-68M"),
]


def _run(case, whole: bool, keep_steps: bool = True):
    """The case's run, in the whole run's loop or (`whole` False) in the SimPy process."""
    acceptance, rate, n, k, settings, kv, lengths, *more = case
    draft, replicas, router = _rest(more)
    spec = SimulationSpec(workload="poisson", rate=rate, requests=n, lengths=lengths,
                          acceptance=acceptance, seed=3, draft=draft)
    scheduler = SchedulerConfig(**settings)
    inputs = build_inputs(spec, {}, scheduler)
    policy = _policy(k)
    with pytest.MonkeyPatch.context() as patch:
        if not whole:
            patch.setattr(engine_module, "takes_whole_run", lambda *args: False)
        return simulate(inputs.workload, inputs.latency, inputs.acceptance, policy,
                        kv or inputs.kv_capacity_tokens,
                        scheduler, ClusterConfig(replicas, router), keep_steps=keep_steps)


def _policy(k):
    """Fixed's k, a policy's name, or batch_adaptive:SCHEDULE (its vLLM ranges, as JSON)."""
    if not isinstance(k, str):
        return make_policy("fixed", {"k": k})
    name, _, schedule = k.partition(":")
    return make_policy(name, {"schedule": json.loads(schedule)} if schedule else {})


def _rest(more: list) -> tuple:
    """A case's draft, replicas and router (by default: none, 1, least-loaded)."""
    defaults = ("none", 1, "least-loaded")
    return (*more, *defaults[len(more):])


def _name(case) -> str:
    draft, replicas, router = _rest(case[7:])
    k = case[3].replace(" ", "") if isinstance(case[3], str) else f"k{case[3]}"
    return (f"{case[0]}-{case[1]:g}-{k}" + ("-draft" if draft != "none" else "")
            + ("-chunked" if case[4].get("chunked_prefill") else "")
            + (f"-{replicas}-{router}" if replicas > 1 else ""))


@pytest.mark.parametrize("case", CASES, ids=[_name(case) for case in CASES])
def test_whole_run_matches_the_process(case, monkeypatch, loops):
    loops(True)
    small = {"BUFFER": 7, "CHUNK": 5, "SUMS": 3}  # every pause and growth, many times
    for name, value in small.items():
        monkeypatch.setattr(whole_run, name, value)
    from simulator import compiled_serve

    serve, statuses = compiled_serve.serve, []

    def counted(*args):
        status, sums = serve(*args)
        statuses.append(status)
        return status, sums

    monkeypatch.setattr(compiled_serve, "serve", counted)
    whole, process = _run(case, True), _run(case, False)
    for status in (compiled_serve.FLUSH, compiled_serve.NEED_RUNS):
        assert statuses.count(status) > 5
    assert whole.meta["whole_run"] and not process.meta["whole_run"]
    assert whole.meta["fast_path"] and process.meta["fast_path"]
    assert len(process.steps) > 200
    assert whole.requests.equals(process.requests)
    assert whole.steps.equals(process.steps)
    assert whole.totals == process.totals


def test_totals_only(loops):
    loops(True)
    whole, process = _run(CASES[0], True, False), _run(CASES[0], False, False)
    assert whole.meta["whole_run"] and whole.steps.empty
    assert whole.requests.equals(process.requests)
    assert whole.totals == process.totals and whole.totals.iterations > 600


ELSEWHERE = {  # what the loop does not stand for: (scheduler, draft, policy, simulate's)
    "vllm-v1": (SchedulerConfig(scheduler="vllm-v1"), "none", ("fixed", {"k": 3}), {}),
    "chunked draft": (SchedulerConfig(**CHUNKED), "Llama-68M", ("fixed", {"k": 3}), {}),
    "sticky batch_adaptive": (SchedulerConfig(), "none",
                              ("batch_adaptive", {"disable_by_batch_size": 4}), {}),
    "auto": (SchedulerConfig(), "none", ("auto", {}), {}),
    "oracle": (SchedulerConfig(), "none", ("oracle", {}), {}),
    "carried over": (SchedulerConfig(), "none", ("heuristic", {"carry_over": True}), {}),
    "no fast path": (SchedulerConfig(), "none", ("fixed", {"k": 3}), {"fast_path": False}),
    "streamed steps": (SchedulerConfig(), "none", ("fixed", {"k": 3}),
                       {"steps_sink": lambda frame: None}),
    "numpy": (SchedulerConfig(), "none", ("fixed", {"k": 3}), {}),
}


@pytest.mark.parametrize("what", sorted(ELSEWHERE))
def test_elsewhere_the_processes_run(what, loops):
    """Where the loop does not give the processes' records (or the loops are not loaded); a
    walked policy whose walks read another request's (heuristic's start carried over from the
    last finished request) among them."""
    loops(what != "numpy")
    scheduler, draft, policy, options = ELSEWHERE[what]
    spec = SimulationSpec(workload="poisson", rate=8.0, requests=60, lengths="azure-conv",
                          acceptance="iid:0.7", seed=1, draft=draft)
    inputs = build_inputs(spec, {}, scheduler)
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance, make_policy(*policy),
                      inputs.kv_capacity_tokens, scheduler, ClusterConfig(2), **options)
    assert result.meta["whole_run"] is False


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_passes_match(tp, loops):
    """A target on several GPUs: its passes' all-reduces priced as the processes price them."""
    loops(True)
    results = []
    for whole in (True, False):
        spec = SimulationSpec(workload="poisson", rate=20.0, requests=500, lengths="azure-conv",
                              acceptance="beta:7,3~20", seed=3, tp=tp,
                              draft="Llama-68M" if tp == 2 else "none")
        scheduler = SchedulerConfig(**CHUNKED) if tp == 4 else SchedulerConfig()
        inputs = build_inputs(spec, {}, scheduler)
        with pytest.MonkeyPatch.context() as patch:
            if not whole:
                patch.setattr(engine_module, "takes_whole_run", lambda *args: False)
            results.append(simulate(inputs.workload, inputs.latency, inputs.acceptance,
                                    make_policy("fixed", {"k": 4}), inputs.kv_capacity_tokens,
                                    scheduler))
    whole, process = results
    assert whole.meta["whole_run"] and not process.meta["whole_run"]
    assert whole.requests.equals(process.requests) and whole.steps.equals(process.steps)


def test_a_run_it_would_take_loads_the_loops_from_fewer_requests(monkeypatch, loops):
    """SPECTUNE_KERNELS=auto: a run the whole run would take loads the compiled loops from
    `REPAYS_FROM` requests (a draft model's chain from fewer), far below `AUTO_REQUESTS`."""
    from simulator import kernels

    loops(True)  # (loaded once in this process; the choice restored after the test)
    monkeypatch.setenv("SPECTUNE_KERNELS", "auto")
    monkeypatch.setattr(whole_run, "REPAYS_FROM", {True: 50, False: 80})
    scheduler = SchedulerConfig()
    taken = {}
    for draft in ("none", "Llama-68M"):
        for requests in (60, 90):
            monkeypatch.setattr(kernels, "_loaded", None)  # (a fresh process's state)
            monkeypatch.setattr(kernels, "_active", None)
            spec = SimulationSpec(workload="poisson", rate=8.0, requests=requests,
                                  lengths="azure-conv", acceptance="iid:0.7", seed=1,
                                  draft=draft)
            inputs = build_inputs(spec, {}, scheduler)
            result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                              make_policy("fixed", {"k": 3}), inputs.kv_capacity_tokens,
                              scheduler)
            taken[draft, requests] = result.meta["whole_run"]
    assert taken == {("none", 60): False, ("none", 90): True, ("Llama-68M", 60): True,
                     ("Llama-68M", 90): True}


def test_a_policy_is_trusted_with_its_constant_k_only_where_it_chose():
    """`Policy.constant_k` is read only from the class that also defines `choose`: a
    subclass that chooses otherwise does not inherit its parent's constant k."""
    from policies.fixed import Fixed

    class Alternating(Fixed):
        def choose(self, ctx):
            return [self.k * (ctx.step_index % 2)] * len(ctx.requests)

    assert whole_run.constant_k(Fixed(k=3), 8) == 3
    assert whole_run.constant_k(Fixed(k=9), 8) is None  # (the engine refuses it)
    assert whole_run.constant_k(make_policy("confidence", {"max_k": 20}), 8) == 8
    assert whole_run.constant_k(Alternating(k=3), 8) is None
    assert whole_run.constant_k(make_policy("batch_adaptive", {}), 8) is None


def test_a_policy_is_trusted_with_its_k_by_batch_only_where_it_chose(loops):
    """`Policy.k_by_batch` likewise: batch_adaptive's table, not a subclass's that chooses
    otherwise, nor the sticky one's (its k depends on each request's history)."""
    from policies.batch_adaptive import BatchAdaptive

    class Halved(BatchAdaptive):
        def choose(self, ctx):
            return [k // 2 for k in super().choose(ctx)]

    def table(policy):
        spec = SimulationSpec(workload="poisson", rate=8.0, requests=20, lengths="azure-conv",
                              acceptance="iid:0.7", seed=1, draft="none")
        scheduler = SchedulerConfig(max_num_seqs=6)
        inputs = build_inputs(spec, {}, scheduler)
        result = simulate(inputs.workload, inputs.latency, inputs.acceptance, policy,
                          inputs.kv_capacity_tokens, scheduler)
        return result.meta["whole_run"]

    loops(True)
    schedule = [[1, 2, 5], [3, 6, 1]]
    assert BatchAdaptive(schedule=schedule).k_by_batch(None, 8, 6) == [0, 5, 5, 1, 1, 1, 1]
    assert table(BatchAdaptive(schedule=schedule))
    assert not table(Halved(schedule=schedule))
    assert BatchAdaptive(schedule=schedule, disable_by_batch_size=3).k_by_batch(None, 8, 6) is None

"""The walked policies (heuristic, gammatune, gammatune_plus, adaedl, and the oracle that knows
outcomes on a model-free chain), the oracle that knows probabilities and goodput (its batch
plan, or per request) under vLLM's scheduler:
a steady batch's engine steps run many at a time in one compiled loop, and the policy part of
each engine step taken one at a time is compiled (simulator/compiled_walked.py), with the same
records, to the bit, and the same policy state after every run and every step, as the step
path's `Replica._planned_iteration`; with the drafter's caps (n-gram, a folded stop), a draft
model's chain, several replicas, a tight KV cache that preempts and budgets that trim, and the
policies' parameters moved; goodput's and the oracles' decode steps under the plain scheduler
(whole prompts, chunked prefill) in runs too, their steps with prompt chunks choosing and
verifying compiled. Also each policy's per-step rules against its Python, and where
the runs do not stand for it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from support.preemptions import counted_preemptions

from policies import make_policy
from policies.adaedl import AdaEDL
from policies.gammatune import GammaTune
from policies.goodput import Goodput
from policies.heuristic import Heuristic
from policies.oracle import Oracle
from simulator import ClusterConfig, SchedulerConfig, simulate, stepped
from simulator.replica import Replica
from spectune.simulate import SimulationSpec, build_inputs

pytest.importorskip("numba")


def _state(policy, rid: int) -> tuple:
    """A request's state in the policy, as its Python keeps it (None where it keeps none),
    floats as bits."""
    def bits(x):
        return None if x is None else np.float64(x).tobytes()
    if isinstance(policy, Heuristic):
        return (policy._k.get(rid),)
    if isinstance(policy, GammaTune):
        return policy._g.get(rid), bits(policy._g_hat.get(rid))
    if isinstance(policy, AdaEDL):
        return bits(policy._lambda.get(rid)), bits(policy._rate.get(rid))
    if isinstance(policy, Goodput) and policy.per_request:  # (the request's and the batch's)
        totals = policy._totals_r.get(rid)
        return (bits(policy._alpha_r.get(rid)), None if totals is None else tuple(totals),
                policy._plan_r.get(rid), policy._calls, policy._k_new, policy._probing)
    if isinstance(policy, Goodput):  # (the batch's, not the request's)
        return (bits(policy.alpha_hat), tuple(policy._totals), policy._calls, policy._k,
                policy._probing)
    return ()  # (the oracle: none)


def _run(spec, scheduler, policy, params, replicas, fast_path=True):
    inputs = build_inputs(spec, {}, scheduler)
    return simulate(inputs.workload, inputs.latency, inputs.acceptance,
                    make_policy(policy, params), inputs.kv_capacity_tokens, scheduler,
                    ClusterConfig(replicas), fast_path=fast_path)


def _both(monkeypatch, loops, spec, scheduler, policy, params, replicas):
    """The run with compiled runs of engine steps, and every engine step taken one at a time
    (the step path: `fast_path` off; the compiled loops loaded for both); how many runs the
    first took, and how many steps one at a time. After every run and every step the first
    took one at a time, the states of the batch's requests are checked against the step
    path's after the same step."""
    loops(True)
    runs, single = [], []
    compiled_steps, planned = Replica._compiled_steps, Replica._planned_iteration
    after_fast, after_slow = {}, {}

    def run(self):
        ids = [request.request_id for request in self.scheduler.running]
        before = len(single)
        yield from compiled_steps(self)
        if len(single) == before:  # (else its first step did not fit: stepped)
            runs.append(len(ids))
        after_fast[self.index, self.scheduler.step_index] = {
            rid: _state(self.policy, rid) for rid in ids}

    def one(self, *args, **kwargs):
        ids = [request.request_id for request in self.scheduler.running]
        single.append(1)
        yield from planned(self, *args, **kwargs)
        after_slow[self.index, self.scheduler.step_index] = {
            rid: _state(self.policy, rid) for rid in ids}
    monkeypatch.setattr(Replica, "_compiled_steps", run)
    monkeypatch.setattr(Replica, "_planned_iteration", one)
    fast = _run(spec, scheduler, policy, params, replicas)
    taken, one_at_a_time = len(runs), len(single)
    after_fast.update(after_slow)
    after_slow.clear()
    slow = _run(spec, scheduler, policy, params, replicas, fast_path=False)  # (every step alone)
    for at, states in after_fast.items():
        assert states.items() <= after_slow[at].items(), at
    return fast, slow, taken, one_at_a_time


def _counted(monkeypatch, loop: str = "walked_steps") -> list:
    """What each call of one of compiled_walked's loops returned, as they are called (a run's
    (why it ended, steps taken))."""
    from simulator import compiled_walked

    calls, kernel = [], getattr(compiled_walked, loop)

    def counted(*args):
        result = kernel(*args)
        calls.append(result)
        return result
    monkeypatch.setattr(compiled_walked, loop, counted)
    return calls


CASES = [  # (policy, parameters, acceptance, lengths, rate, draft, replicas, scheduler's settings)
    ("heuristic", {}, "smollm2-ngram", "azure-conv", 12.0, "none", 1, {}),
    ("heuristic", {"carry_over": "true", "k_init": "2", "grow": "1"}, "beta:7,3~20",
     "azure-conv", 8.0, "Llama-68M", 1, {}),
    ("heuristic", {}, "beta:7,3~20", "fixed:200,300", 4.0, "none", 1,
     {"kv_capacity_tokens": 3000}),
    ("heuristic", {}, "beta:9,1~20", "fixed:20,300", 4.0, "none", 1, {"max_batched_tokens": 40}),
    ("gammatune", {}, "smollm2-eagle-ngram", "azure-conv", 20.0, "none", 3, {}),
    ("gammatune", {"delta": "2", "eta": "0.5"}, "smollm2-eagle-ngram", "fixed:20,300", 4.0,
     "none", 1, {"max_batched_tokens": 36}),
    ("gammatune_plus", {}, "smollm2-ngram", "azure-conv", 12.0, "none", 1, {}),
    ("gammatune_plus", {"tau": "0.6"}, "smollm2-ngram", "azure-conv", 20.0, "none", 2,
     {"max_num_seqs": 16}),
    ("adaedl", {}, "smollm2-ngram", "azure-conv", 12.0, "none", 1, {}),
    ("adaedl", {"gamma": "0.8", "max_k": "6"}, "smollm2-eagle-ngram", "azure-conv", 8.0,
     "Llama-68M", 1, {}),
    ("adaedl", {}, "smollm2-ngram", "fixed:200,300", 4.0, "none", 1, {"kv_capacity_tokens": 3000}),
    ("oracle", {}, "smollm2-ngram", "azure-conv", 12.0, "none", 1, {}),
    ("oracle", {"k_max": "6"}, "beta:7,3~20", "fixed:200,300", 4.0, "none", 1,
     {"kv_capacity_tokens": 3000}),
    ("oracle", {}, "smollm2-eagle-ngram", "fixed:20,300", 8.0, "none", 2,
     {"max_batched_tokens": 24}),
    ("goodput", {}, "smollm2-ngram", "azure-conv", 12.0, "none", 1, {}),
    ("goodput", {"kv_headroom": "2.0"}, "beta:7,3~20", "azure-conv", 8.0, "Llama-68M", 2, {}),
    ("goodput", {"replan_every": "5", "faithful": "true", "initial_alpha": "0.3"},
     "smollm2-eagle-ngram", "azure-conv", 20.0, "none", 3, {}),
    ("goodput", {"replan_every": "3", "kv_headroom": "1.5"}, "beta:7,3~20", "fixed:200,300",
     4.0, "none", 1, {"kv_capacity_tokens": 3000}),
    ("goodput", {"k0_bonus": "1.3", "replan_every": "4"}, "beta:3.5,6.5~20", "azure-conv",
     8.0, "none", 1, {}),  # (plans of 0, each re-plan probing)
    ("goodput", {"replan_every": "2"}, "beta:7,3~20", "fixed:20,300", 3.0, "none", 1,
     {"max_batched_tokens": 24}),
    ("oracle", {"knows": "probabilities"}, "beta:7,3~20", "azure-conv", 12.0, "none", 1, {}),
    ("oracle", {"knows": "probabilities", "k_max": "6"}, "beta:3.5,6.5~20", "azure-conv", 8.0,
     "Llama-68M", 2, {}),
    ("oracle", {"knows": "probabilities"}, "beta:7,3~20", "fixed:200,300", 4.0, "none", 1,
     {"kv_capacity_tokens": 3000}),
    ("oracle", {"knows": "probabilities"}, "beta:7,3~20", "fixed:20,300", 3.0, "none", 1,
     {"max_batched_tokens": 40}),
    ("goodput", {"per_request": "true"}, "smollm2-ngram", "azure-conv", 12.0, "none", 1, {}),
    ("goodput", {"per_request": "true", "replan_every": "3"}, "beta:7,3~20", "azure-conv", 8.0,
     "Llama-68M", 2, {}),
    ("goodput", {"per_request": "true", "replan_every": "4", "faithful": "true",
                 "initial_alpha": "0.3"}, "smollm2-eagle-ngram", "azure-conv", 20.0, "none", 3,
     {}),
    ("goodput", {"per_request": "true", "kv_headroom": "1.5", "k_max": "5"}, "beta:7,3~20",
     "fixed:200,300", 4.0, "none", 1, {"kv_capacity_tokens": 3000}),
    ("goodput", {"per_request": "true", "k0_bonus": "1.3", "replan_every": "2"},
     "beta:3.5,6.5~20", "azure-conv", 8.0, "none", 1, {}),
    ("goodput", {"per_request": "true"}, "beta:7,3~20", "fixed:20,300", 3.0, "none", 1,
     {"max_batched_tokens": 40}),
]


@pytest.mark.parametrize("policy,params,acceptance,lengths,rate,draft,replicas,settings", CASES,
                         ids=[f"{p}-{a}-{lg}-{r}-{d}-{n}-" + (",".join((*q, *s)) or "default")
                              for p, q, a, lg, r, d, n, s in CASES])
def test_walked_policies_engine_steps_in_runs(monkeypatch, loops, policy, params, acceptance,
                                              lengths, rate, draft, replicas, settings):
    """A steady batch's engine steps run at once, up to the first the budget would trim or the
    free blocks could not hold (preempting); the others one at a time, their choice, observe
    and proposals compiled: the same records and states. With a tight KV cache and a small
    budget, runs end at both (and a run whose first step does not fit is stepped)."""
    from simulator import compiled_steps

    loops(True)  # (loaded before counting: loading warms the loops up with calls)
    ends, proposed = _counted(monkeypatch), _counted(monkeypatch, "walked_propose")
    preempting = counted_preemptions(monkeypatch)
    spec = SimulationSpec(workload="poisson", rate=rate, requests=150, lengths=lengths,
                          acceptance=acceptance, draft=draft, seed=4)
    scheduler = SchedulerConfig(scheduler="vllm-v1", **settings)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, scheduler, policy, params,
                                            replicas)
    decode_steps = int(((fast.steps["decode_seqs"] > 0) & (fast.steps["prefill_seqs"] == 0)).sum())
    assert runs and one_at_a_time and sum(n for _, n in ends) > decode_steps / 3
    assert len(proposed) == one_at_a_time  # every step taken alone has its policy part compiled
    if settings.get("kv_capacity_tokens") or settings.get("max_batched_tokens"):
        # a run cut before it (but goodput's under a budget: one k for the batch, re-planned
        # every few steps, and a batch that is the same through a run: none cut here)
        assert any(why == compiled_steps.ROOM and n for why, n in ends) or (
            policy == "goodput" and not settings.get("kv_capacity_tokens"))
        assert any(why == compiled_steps.ROOM and not n for why, n in ends)  # stepped
    assert bool(preempting) == bool(settings.get("kv_capacity_tokens"))
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    if params.get("k0_bonus") == "1.3":  # (its probes were taken, in runs among them)
        assert fast.steps["max_k"].eq(1).sum() > 20


def test_the_per_step_rules_are_the_policies_python(loops):
    """heuristic's, gammatune's and adaedl's next state after a step, and adaedl's stop, as
    their Python gives them (the same integers, and floats to the bit), over many states and
    outcomes, NaN entropies among them."""
    loops(True)
    from policies import compiled as policy_loops
    from simulator.compiled_walked import _adaedl_stop

    rng = np.random.default_rng(7)
    heuristic, gammatune = Heuristic(grow=2, shrink=3), GammaTune(delta=2, eta=0.35)
    adaedl = AdaEDL(gamma=0.7, target_acceptance=0.55)
    for _ in range(2000):
        k, drafted = int(rng.integers(1, 20)), int(rng.integers(1, 12))
        accepted = int(rng.integers(0, drafted + 1))
        ceiling = int(rng.integers(1, 20))
        assert policy_loops.heuristic_next(k, drafted, accepted, 2, 3, ceiling) == \
            heuristic._next(k, drafted, accepted, ceiling)
        g, g_hat = int(rng.integers(1, 11)), float(rng.uniform(1, 10))
        ours = policy_loops.gammatune_next(g, g_hat, drafted, accepted, 2, 0.35,
                                           gammatune.g_min, gammatune.g_max, 1e-9)
        want = gammatune._next(g, g_hat, drafted, accepted)
        assert ours[0] == want[0] and np.float64(ours[1]).tobytes() == \
            np.float64(want[1]).tobytes()
        lam, rate = float(rng.uniform(0, 1)), float(rng.uniform(0, 1))
        adaedl._lambda[0], adaedl._rate[0] = lam, rate
        want_lam = adaedl._observe_one(0, drafted, accepted, 8)
        got_lam, got_rate = policy_loops.adaedl_next(
            lam, rate, drafted, accepted, 8, adaedl.beta1, adaedl.beta2, adaedl.epsilon, 0.55)
        assert (np.float64(got_lam).tobytes(), np.float64(got_rate).tobytes()) == \
            (np.float64(want_lam).tobytes(), np.float64(adaedl._rate[0]).tobytes())
    entropy = rng.uniform(0, 2, 400)
    entropy[rng.integers(0, 400, 40)] = math.nan
    for _ in range(500):
        g, k, last = int(rng.integers(0, 390)), int(rng.integers(0, 10)), 399
        lam = float(rng.uniform(0.2, 1))
        adaedl._lambda[5] = lam
        rows = entropy[np.minimum(g + np.arange(max(k, 1)), last)][None, :]

        class View:
            request_id = 5
        want = adaedl.stop_chains([View()], [k], np.empty((1, 0)), rows)[0]
        assert _adaedl_stop(k, lam, 0.7, entropy, 0, g, last) == want


def test_where_the_runs_stand_for_each_policy(loops):
    """Under the plain scheduler the fast path walks them (no runs), but the oracle's and
    goodput's runs take their steps under every scheduler; a subclass, the numpy code, the
    oracle that knows outcomes and prices a draft model's passes, goodput with another
    estimate, step."""
    from simulator.step_cost import StepCostModel

    spec = SimulationSpec(workload="poisson", rate=8.0, requests=3, lengths="azure-conv",
                          acceptance="smollm2-ngram", seed=1, draft="none")
    cost = StepCostModel(build_inputs(spec, {}, SchedulerConfig()).latency, speculating=True)

    class Mine(Heuristic):
        pass
    loops(True)
    for policy in (Heuristic(), GammaTune(), make_policy("gammatune_plus", {}), AdaEDL()):
        assert stepped.steps_at_once(policy, cost, None, True, True, 10)
        assert not stepped.steps_at_once(policy, cost, None, False, True, 10)
        assert not stepped.prefers_runs(policy)
    for policy in (Oracle(), Goodput()):  # (under every scheduler, for their checked walks
        for planned in (True, False):  # or held segments)
            assert stepped.steps_at_once(policy, cost, None, planned, True, 10)
        assert stepped.prefers_runs(policy)
    assert not stepped.steps_at_once(Mine(), cost, None, True, True, 10)
    for planned in (True, False):  # (knowing probabilities: from its store's chances)
        assert stepped.steps_at_once(Oracle(knows="probabilities"), cost, None, planned, True,
                                     10)
    assert stepped.trace_store(Oracle(knows="probabilities"), False).signal == "accept_prob"
    assert stepped.trace_store(Oracle(), False).signal == ""
    for planned in (True, False):
        assert stepped.steps_at_once(Goodput(per_request=True), cost, None, planned, True, 10)
    assert not stepped.steps_at_once(Goodput(ema_input="step"), cost, None, True, True, 10)
    assert not stepped.steps_at_once(Goodput(), cost, cost, True, True, 10)  # (validate's)
    drafted = SimulationSpec(workload="poisson", rate=8.0, requests=3, lengths="azure-conv",
                             acceptance="smollm2-ngram", seed=1)  # (Llama-68M)
    with_model = StepCostModel(build_inputs(drafted, {}, SchedulerConfig()).latency,
                               speculating=True)
    assert stepped.steps_at_once(Heuristic(), with_model, None, True, True, 10)
    assert not stepped.steps_at_once(Oracle(), with_model, None, True, True, 10)
    assert stepped.steps_at_once(Oracle(knows="probabilities"), with_model, None, True, True, 10)
    assert stepped.steps_at_once(Goodput(), with_model, None, True, True, 10)
    loops(False)
    assert not stepped.steps_at_once(Heuristic(), cost, None, True, True, 10)


@pytest.mark.parametrize("settings,replicas,params,draft", [
    ({}, 1, {}, "none"), ({}, 3, {"replan_every": "5", "faithful": "true"}, "none"),
    ({}, 1, {}, "Llama-68M"),
    ({"chunked_prefill": True, "max_batched_tokens": 2048}, 1, {}, "none"),
    ({"chunked_prefill": True, "max_batched_tokens": 512}, 2, {"initial_alpha": "0.3"},
     "Llama-68M"),
    ({"max_num_seqs": 8, "kv_capacity_tokens": 60000}, 1, {"kv_headroom": "3.0"}, "none"),
    ({}, 1, {"per_request": "true"}, "none"),
    ({"chunked_prefill": True, "max_batched_tokens": 512}, 2,
     {"per_request": "true", "replan_every": "3"}, "Llama-68M")])
def test_goodputs_decode_steps_in_runs_under_the_plain_scheduler(monkeypatch, loops, settings,
                                                                 replicas, params, draft):
    """goodput's decode steps (no prompt to chunk) under the plain scheduler run at once, each
    verifying the ks chosen before it, instead of its held segments: the same records and
    estimate as every step taken one at a time, with whole prompts and chunked prefill, a
    draft model (its plan priced as `steps_s` prices its ks), admission held by the batch size
    and a KV cache its headroom reads; per request too. Under chunked prefill its steps with
    prompt chunks choose and verify compiled (`walked_choose`, `walked_verify`)."""
    loops(True)
    ends, chosen = _counted(monkeypatch), _counted(monkeypatch, "walked_choose")
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=150, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft=draft, seed=4)
    scheduler = SchedulerConfig(**settings)
    policies = []

    def run(fast_path):
        inputs = build_inputs(spec, {}, scheduler)
        policies.append(make_policy("goodput", params))
        return simulate(inputs.workload, inputs.latency, inputs.acceptance, policies[-1],
                        inputs.kv_capacity_tokens, scheduler, ClusterConfig(replicas),
                        fast_path=fast_path)
    fast = run(True)
    steps = sum(n for _, n in ends)
    slow = run(False)
    assert fast.meta["steps_at_once"] and steps > len(fast.steps) / 2
    # (under chunked prefill its steps with prompt chunks choose and verify compiled)
    assert bool(chosen) == bool(settings.get("chunked_prefill"))
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert _state(policies[0], 0) == _state(policies[1], 0)


@pytest.mark.parametrize("acceptance,lengths,rate,hardware,settings,params", [
    ("smollm2-ngram", "azure-conv", 14.0, "H100", {}, {}),
    ("beta:6,3~20", "azure-conv", 14.0, "H100",
     {"chunked_prefill": True, "max_batched_tokens": 2048}, {"k_max": "4"}),
    # (long prompts at batch ~200 on an A100: a deeper cap can cost more than it brings, so
    # some steps cap the runs, tests/simulator/test_fast_path_oracle.py)
    ("beta:7,3~20", "azure-code", 60.0, "A100", {"max_num_seqs": 256}, {})])
def test_the_oracles_decode_steps_in_runs_under_the_plain_scheduler(monkeypatch, loops,
                                                                    acceptance, lengths, rate,
                                                                    hardware, settings, params):
    """The oracle's decode steps under the plain scheduler run at once, each priced at every
    cap of its batch's runs, instead of its checked walks: the step path's records (on the
    A100, with steps whose best cap is below the longest run: checked on the step path)."""
    from policies import oracle

    loops(True)
    runs, capped = _counted(monkeypatch), []
    best_cap = oracle._best_cap

    def best(sums, runs, contexts, top):
        cap = best_cap(sums, runs, contexts, top)
        capped.append(cap < top)
        return cap
    monkeypatch.setattr(oracle, "_best_cap", best)
    spec = SimulationSpec(workload="poisson", rate=rate, requests=200, lengths=lengths,
                          acceptance=acceptance, draft="none", seed=4, hardware=hardware)
    scheduler = SchedulerConfig(**settings)
    fast = _run(spec, scheduler, "oracle", params, 1)
    slow = _run(spec, scheduler, "oracle", params, 1, fast_path=False)
    assert fast.meta["steps_at_once"] and not fast.meta["fast_path"]
    assert sum(n for _, n in runs) > len(fast.steps) / 2
    assert any(capped) == (hardware == "A100")
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


@pytest.mark.parametrize("acceptance,settings,draft", [
    ("beta:7,3~20", {}, "none"), ("iid:0.6", {}, "Llama-68M"),
    ("beta:3.5,6.5~20", {"chunked_prefill": True, "max_batched_tokens": 1024}, "none")])
def test_the_calibrated_oracles_decode_steps_in_runs_under_the_plain_scheduler(
        monkeypatch, loops, acceptance, settings, draft):
    """The oracle that knows probabilities: its decode steps under the plain scheduler run at
    once (each step's draft counts ranked and priced compiled, with a draft model's passes
    too), the step path's records to the bit."""

    loops(True)
    runs = _counted(monkeypatch)
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=120, lengths="azure-conv",
                          acceptance=acceptance, draft=draft, seed=4)
    scheduler = SchedulerConfig(**settings)
    params = {"knows": "probabilities"}
    fast = _run(spec, scheduler, "oracle", params, 1)
    slow = _run(spec, scheduler, "oracle", params, 1, fast_path=False)
    assert fast.meta["steps_at_once"] and sum(n for _, n in runs) > len(fast.steps) / 2
    assert fast.steps["max_k"].nunique() > 3  # (the counts vary step by step)
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


def test_the_calibrated_oracle_on_a_trace_without_chances_is_refused_as_before(loops):
    """A recorded trace has no chance of acceptance per position: the runs do not stand for
    the oracle that knows probabilities there, and the step path refuses it at its first
    choice, in one line, as it did before its runs."""
    from simulator import ConfigError

    loops(True)
    spec = SimulationSpec(workload="poisson", rate=8.0, requests=20, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=4)
    for scheduler in (SchedulerConfig(), SchedulerConfig(scheduler="vllm-v1")):
        with pytest.raises(ConfigError, match="needs a parametric acceptance"):
            _run(spec, scheduler, "oracle", {"knows": "probabilities"}, 1)

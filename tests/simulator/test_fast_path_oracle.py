"""The oracle (knows=outcomes) on a model-free drafter takes the fast path: each request walks
its own min(run, left, bound) wherever the batch cap does not bind, every segment's steps are
checked against that cap, and the first step it binds in is taken through `choose`. The same
records, to the bit, as asking `choose` every step, which is how such runs were recorded."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
from support.policy_fakes import FakeRequest, context

from policies import make_policy
from policies.oracle import Oracle, _best_cap, _cap_times, _overruled_at, cap_sums
from simulator import ClusterConfig, SchedulerConfig, simulate
from simulator import replica as replica_module
from simulator.replica import Replica
from simulator.request import RequestState, walk_alone
from spectune.simulate import SimulationSpec, build_inputs, build_latency


@pytest.fixture(autouse=True)
def walks_not_runs(monkeypatch):
    """The oracle's walks, not its runs of steps: with the compiled loops a replica takes
    those where they stand for it (tests/simulator/test_compiled_walked.py), and its walks
    still stand where they do not (an idle proposer, a policy cost model of its own)."""
    monkeypatch.setattr(replica_module, "prefers_runs", lambda policy: False)


def _runs(monkeypatch, spec: SimulationSpec, scheduler: SchedulerConfig, params=None,
          replicas: int = 1):
    """The run on the fast path and on the step path; the batch of each segment step the
    fast one took through `choose` where the cap overruled the walks (`_step_unwalked`), and
    how many steps it took through `choose` in all (those, and steps with prompt chunks)."""
    unwalked, chosen = [], []
    stepped, choose = Replica._step_unwalked, Replica._choose

    def counted(self, batch):
        unwalked.append(len(batch))
        return (yield from stepped(self, batch))

    def asked(self, batch):
        chosen.append(len(batch))
        return choose(self, batch)
    monkeypatch.setattr(Replica, "_step_unwalked", counted)
    monkeypatch.setattr(Replica, "_choose", asked)
    inputs = build_inputs(spec, {}, scheduler)
    fast = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                    make_policy("oracle", params or {}), inputs.kv_capacity_tokens, scheduler,
                    ClusterConfig(replicas))
    asked_fast = len(chosen)
    slow = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                    make_policy("oracle", params or {}), inputs.kv_capacity_tokens, scheduler,
                    ClusterConfig(replicas), fast_path=False)
    return fast, slow, unwalked, asked_fast


def _same(fast, slow) -> None:
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


CASES = [("smollm2-ngram", 1, {}, 0), ("smollm2-eagle-ngram", 3, {}, 0),
         ("beta:6,3~20", 1, {}, 0), ("iid:0.8", 1, {"k_max": "3"}, 0),
         ("smollm2-ngram", 2, {"k_max": "0"}, 0), ("smollm2-ngram", 1, {}, 256),
         ("beta:6,3~20", 2, {}, 2048)]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("acceptance,replicas,params,budget", CASES,
                         ids=[f"{a}-{r}-{b or 'whole'}-"
                              + (",".join(f"{k}={v}" for k, v in p.items()) or "default")
                              for a, r, p, b in CASES])
def test_the_oracles_walks_give_the_step_paths_records(loops, monkeypatch, compiled,
                                                       acceptance, replicas, params, budget):
    """Whole prompts, and chunked prefill (budget: its token budget)."""
    loops(compiled)
    spec = SimulationSpec(workload="poisson", rate=14.0, requests=150, lengths="azure-conv",
                          acceptance=acceptance, draft="none", seed=2)
    scheduler = SchedulerConfig(max_num_seqs=24, chunked_prefill=bool(budget),
                                max_batched_tokens=budget or None)
    fast, slow, _, asked = _runs(monkeypatch, spec, scheduler, params, replicas)
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    assert asked == 0  # (the cap never binds here: every step, chunked ones too, walked)
    _same(fast, slow)
    if params.get("k_max") != "0":
        assert fast.steps.drafted.nunique() > 3  # ks moved from step to step


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("budget", [0, 131_072])
def test_a_step_the_batch_cap_binds_in_is_taken_through_choose(loops, monkeypatch, compiled,
                                                               budget):
    """Long prompts at batch ~200 on an A100 make a verify pass compute-bound: a deeper cap
    can cost more than it brings, so some steps cap the runs. Those steps are taken one at a
    time through `choose` and every request walked anew after them, with the step path's
    records: a segment's (`_step_unwalked`), and under chunked prefill (budget > 0) a step
    with prompt chunks too (`_chunked_head` refused: the step reads every request)."""
    loops(compiled)
    spec = SimulationSpec(workload="poisson", rate=60.0, requests=400 if budget else 200,
                          lengths="azure-code", acceptance="beta:7,3~20", draft="none", seed=4,
                          hardware="A100")
    scheduler = SchedulerConfig(max_num_seqs=256, chunked_prefill=bool(budget),
                                max_batched_tokens=budget or None)
    walks = []
    original = replica_module.walk_alone

    def walked(request, walker, k_max, policy=""):
        walks.append(request.request_id)
        return original(request, walker, k_max, policy)
    monkeypatch.setattr(replica_module, "walk_alone", walked)
    fast, slow, unwalked, asked = _runs(monkeypatch, spec, scheduler)
    assert fast.meta["fast_path"] and len(unwalked) >= 1
    # each request walked once, and again only after a step the cap bound in (a run of them
    # not walking the batch anew each time)
    assert len(walks) <= spec.requests + 220 * asked
    assert max(unwalked) > 100  # it bound in a full batch
    if budget:
        assert asked > len(unwalked)  # ... and in a step with prompt chunks
    else:
        assert asked == len(unwalked)  # only where it bound
    decode_steps = int((slow.steps.decode_seqs > 0).sum())
    assert asked < decode_steps / 20  # the rest walked
    _same(fast, slow)


@pytest.mark.parametrize("spec,scheduler", [
    (dict(acceptance="beta:6,3~20", draft="Llama-68M"), {}),
    (dict(acceptance="smollm2-eagle-tree", draft="none"), {}),
    (dict(acceptance="smollm2-ngram", draft="none"), {"scheduler": "vllm-v1"}),
], ids=["draft-model", "draft-tree", "vllm-v1"])
def test_where_the_oracle_is_not_walked(monkeypatch, spec, scheduler):
    """A draft model's cap binds often (its passes cost per depth), a tree is not priced from
    sums, and vLLM's scheduler walks no policy: asked every step."""
    inputs = build_inputs(SimulationSpec(workload="poisson", rate=10.0, requests=40,
                                         lengths="azure-conv", seed=1, **spec), {},
                          SchedulerConfig(**scheduler))
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                      make_policy("oracle", {}), inputs.kv_capacity_tokens,
                      SchedulerConfig(**scheduler))
    assert result.meta["fast_path"] is False


def test_knowing_probabilities_is_not_walked():
    inputs = build_inputs(SimulationSpec(workload="poisson", rate=10.0, requests=40,
                                         lengths="azure-conv", acceptance="beta:6,3~20",
                                         draft="none", seed=1), {}, SchedulerConfig())
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                      make_policy("oracle", {"knows": "probabilities"}),
                      inputs.kv_capacity_tokens)
    assert result.meta["fast_path"] is False


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("idle_s", [0.0, 2e-4])
def test_the_segment_check_finds_the_first_step_choose_caps(loops, compiled, idle_s):
    """`_overruled_at` over a segment's steps against `_best_cap` step by step (the step
    path's pick) on random batches, long prompts making some caps bind."""
    from simulator.step_cost import StepCostModel

    loops(compiled)
    latency, _ = build_latency(SimulationSpec(draft="none", hardware="A100"), SchedulerConfig())
    cost = StepCostModel(latency)
    cost.idle_s = idle_s
    sums = cost.chain_sums_s
    rng = np.random.default_rng(5)
    found = {"bound": 0, "free": 0}
    for _ in range(150):  # runs mostly short, a few to the bound (as a trace's are)
        b, steps = int(rng.integers(1, 240)), int(rng.integers(1, 7))
        asked = np.minimum(rng.geometric(rng.uniform(0.2, 0.6), size=(b, steps)) - 1, 10)
        contexts = (rng.exponential(2000.0, size=(b, 1)).astype(np.int64) + 1
                    + np.arange(steps) * 3)
        expected = steps
        for t in range(steps):
            runs, top = asked[:, t].tolist(), int(asked[:, t].max())
            if top and _best_cap(sums, runs, contexts[:, t].tolist(), top) < top:
                expected = t
                break
        found["bound" if expected < steps else "free"] += 1
        assert _overruled_at(sums, asked, contexts) == expected
    assert found["bound"] > 10 and found["free"] > 10  # both outcomes were checked


def _roofline(hardware: str = "H100-SXM"):
    from simulator.step_cost import StepCostModel

    latency, _ = build_latency(SimulationSpec(draft="none", hardware=hardware),
                               SchedulerConfig())
    return StepCostModel(latency)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("idle_s", [0.0, 2e-4])
def test_each_cap_of_each_step_is_priced_as_step_s_prices_its_ks(loops, compiled, idle_s):
    loops(compiled)
    cost = _roofline()
    cost.idle_s = idle_s
    rng = np.random.default_rng(8)
    for _ in range(40):
        b, steps, caps = int(rng.integers(1, 30)), int(rng.integers(1, 5)), int(rng.integers(0, 9))
        asked = rng.integers(0, 11, size=(b, steps))
        contexts = rng.integers(1, 9000, size=(b, steps))
        drafted, times = _cap_times(cost.chain_sums_s, asked, contexts, caps)
        assert drafted.shape == times.shape == (caps + 1, steps)
        for cap in range(caps + 1):
            for t in range(steps):
                ks = np.minimum(asked[:, t], cap).tolist()
                assert drafted[cap, t] == sum(ks)
                assert times[cap, t] == cost.step_s(ks, contexts[:, t].tolist())


class _Told:
    """A cost model that records the verify sums a policy prices (`chain_sums_s`)."""

    def __init__(self, cost) -> None:
        self.cost, self.told = cost, []

    def chain_sums_s(self, requests, drafted, cached, pairs):
        self.told.append((requests, np.asarray(drafted), np.asarray(cached),
                          np.asarray(pairs)))
        return self.cost.chain_sums_s(requests, drafted, cached, pairs)

    def step_s(self, ks, contexts, feeds=None):
        return self.cost.step_s(ks, contexts, feeds)


@pytest.mark.parametrize("compiled", [True, False])
def test_walks_agree_up_to_the_first_step_choose_leaves_the_walks(loops, compiled):
    """Requests of every length, some near their ends (the walks' min(run, left, bound)), in
    batches up to full on an A100, where choose caps some steps: `walks_agree` counts the
    steps before the first whose ks `choose` gives differently, the batch stepped along the
    walks (a request at its end stays there); each step's caps priced from `cap_sums`'
    integers, with the batch's cached tokens."""
    loops(compiled)
    rng = np.random.default_rng(13)
    found = {"bound": 0, "free": 0}
    oracle, a100 = make_policy("oracle", {}), _roofline("A100")
    for _ in range(40):
        cost = _Told(a100)
        b = int(rng.integers(1, 20) if rng.random() < 0.3 else rng.integers(150, 260))
        steps, k_max = int(rng.integers(1, 6)), int(rng.choice([6, 10, 12]))
        bound = min(k_max, 10)
        outputs = rng.integers(2, 400, size=b)
        prompts = rng.exponential(2000.0, size=b).astype(np.int64) + 1
        runs = {i: np.minimum(rng.geometric(rng.uniform(0.1, 0.3), size=n) - 1, 12)
                for i, n in enumerate(outputs.tolist())}
        at = np.array([int(rng.integers(1, n)) for n in outputs.tolist()])
        positions, asked, expected = np.empty((b, steps), dtype=np.int64), [], None
        for t in range(steps):
            positions[:, t] = at
            views = [FakeRequest(i, prompt_tokens=int(prompts[i]), output_tokens=int(n),
                                 generated=int(g))
                     for i, (n, g) in enumerate(zip(outputs.tolist(), at.tolist()))]
            ctx = context(views, k_max=k_max, cost=cost.cost, lookahead=runs.__getitem__)
            walks = [min(int(runs[v.request_id][v.generated]), v.output_tokens - v.generated - 1,
                         bound) for v in views]
            if expected is None and list(oracle.choose(ctx)) != walks:
                expected = t
            asked.append((walks, [v.context_tokens for v in views]))
            at = np.minimum(at + np.array(walks) + 1, outputs - 1)
        views = [FakeRequest(i, prompt_tokens=int(prompts[i]), output_tokens=int(n))
                 for i, n in enumerate(outputs.tolist())]
        ctx = context(views, k_max=k_max, cost=cost, lookahead=runs.__getitem__)
        found["free" if expected is None else "bound"] += 1
        assert oracle.walks_agree(ctx, positions) == (steps if expected is None else expected)
        caps = max(max(walks) for walks, _ in asked)
        if caps:  # one call: every cap 0..caps of every step, cap after cap
            (requests, drafted, cached, pairs), = cost.told[1:]  # (after SumsPricer's probe)
            assert requests == b
            for t, (walks, contexts) in enumerate(asked):
                sums = cap_sums(walks, contexts, caps)
                assert drafted[t::steps].tolist() == [d for d, _ in sums]
                assert pairs[t::steps].tolist() == [p for _, p in sums]
                assert cached[t::steps].tolist() == [sum(contexts) - b] * (caps + 1)
    assert found["bound"] > 3 and found["free"] > 3  # both outcomes were checked


@pytest.mark.parametrize("compiled", [True, False])
def test_the_walk_is_choose_step_by_step(loops, compiled):
    """One request alone on a cheap step (its cap never binds): the walk drafts what
    `choose` gives at each position, cut to the drafter's caps, to the request's end."""
    latency, _ = build_latency(SimulationSpec(draft="none"), SchedulerConfig())
    from simulator.step_cost import StepCostModel

    cost = StepCostModel(latency)
    rng = np.random.default_rng(11)
    loops(compiled)
    for k_max in (0, 3, 10):
        n = 150
        run = rng.integers(0, 9, n)
        cap = rng.integers(0, 9, n)
        request = RequestState(0, 7, 0.0, 40, n)
        request.generated, request.run, request.cap = 1, run, cap
        oracle = make_policy("oracle", {"k_max": "6"})
        walk_alone(request, oracle.walker(7, k_max, {}, run=run), k_max, "oracle")
        g, chain, drafts = 1, [1], []
        while g < n:
            view = replace(FakeRequest(7, generated=g, output_tokens=n), prompt_tokens=40)
            ctx = context([view], k_max=k_max, cost=cost, lookahead={7: run}.__getitem__)
            k = min(int(oracle.choose(ctx)[0]), int(cap[g]))
            g += min(k, int(run[g])) + 1
            chain.append(g)
            drafts.append(k)
        assert request.chain.tolist() == chain
        assert request.chain_ks.tolist() == drafts


class _TaughtOracle(Oracle):
    """An oracle that learns from outcomes, with its own walker: a policy whose batch can
    overrule its walks steps where it does untold, so such a one is never walked."""

    def walker(self, request_id, k_max, signals, run=None):
        return super().walker(request_id, k_max, signals, run=run)

    told: ClassVar[list[int]] = []  # (each replica runs a copy of the policy)

    def observe(self, ctx, outcomes):
        self.told.append(len(outcomes))


def test_a_policy_that_learns_and_can_be_overruled_is_not_walked():
    inputs = build_inputs(SimulationSpec(workload="poisson", rate=10.0, requests=40,
                                         lengths="azure-conv", acceptance="beta:6,3~20",
                                         draft="none", seed=1), {}, SchedulerConfig())
    _TaughtOracle.told.clear()
    result = simulate(inputs.workload, inputs.latency, inputs.acceptance, _TaughtOracle(),
                      inputs.kv_capacity_tokens)
    assert result.meta["fast_path"] is False
    assert sum(_TaughtOracle.told) == int(result.steps.decode_seqs.sum())  # told every step


def test_the_walker_needs_the_runs():
    with pytest.raises(RuntimeError, match="run="):
        make_policy("oracle", {}).walker(0, 4, {})


def test_a_step_with_prompt_chunks_is_checked_where_each_request_is(monkeypatch):
    """Under chunked prefill the kept sums read each request lazily: the check of a step with
    prompt chunks takes each request's position from its walk, which is where `_sync` (what
    reading the request brings it to) puts it."""
    import copy

    checked, asking = [], []
    original, agree = Replica._walks_agree_now, Oracle.walks_agree

    def now(self, batch):
        truth = []
        for request in batch:
            seen = copy.copy(request)  # read as a step would read it, the request untouched
            if seen.summed:
                self._sync(seen)
            truth.append(seen.generated)
        asking.append(truth)
        try:
            return original(self, batch)
        finally:
            asking.pop()

    def told(self, ctx, positions):
        if asking:  # (the segments' checks are made from their walks' positions)
            checked.append((asking[-1], positions[:, 0].tolist()))
        return agree(self, ctx, positions)
    monkeypatch.setattr(Replica, "_walks_agree_now", now)
    monkeypatch.setattr(Oracle, "walks_agree", told)
    scheduler = SchedulerConfig(chunked_prefill=True, max_batched_tokens=256, max_num_seqs=24)
    inputs = build_inputs(SimulationSpec(workload="poisson", rate=14.0, requests=120,
                                         lengths="azure-conv", acceptance="beta:6,3~20",
                                         draft="none", seed=2), {}, scheduler)
    simulate(inputs.workload, inputs.latency, inputs.acceptance, make_policy("oracle", {}),
             inputs.kv_capacity_tokens, scheduler)
    assert len(checked) > 50
    assert all(truth == positions for truth, positions in checked)

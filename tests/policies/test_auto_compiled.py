"""The policies' compiled loops (policies/compiled.py) against their numpy code: numpy's
pairwise sums to the bit; auto's ks, threshold, plan and draft stops step after step, on a
model-free chain (alternatives priced from the verify pass's sums) and with a draft model (each
alternative priced as its ks); a draft model's alternatives priced at once as one by one;
kld_variance's cleaned KL and variance ratios; gammatune's and adaedl's whole walks as their
walkers' steps; the same records from whole runs (auto, kld_variance, the calibrated oracle,
gammatune, adaedl); the loops refuse shapes they were not made for."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.policy_fakes import FakeRequest, context, verified

from policies import make_policy

pytest.importorskip("numba")


def test_row_sums_are_numpys_pairwise_sums_to_the_bit():
    from policies.compiled import _row_sum

    rng = np.random.default_rng(7)
    for width in range(1, 129):
        a = rng.random((6, width)) * 10.0 ** rng.integers(-9, 9, size=(6, width))
        a[rng.random((6, width)) < 0.3] = 0.0
        a[0] = -0.0  # a row of -0.0s: numpy's sum is 0.0
        expected = np.add.reduce(a, axis=1)
        got = np.array([_row_sum(a, row, width) for row in range(len(a))])
        assert got.view(np.int64).tolist() == expected.view(np.int64).tolist(), width
    with pytest.raises(ValueError, match="longer than 128"):
        _row_sum(np.ones((1, 129)), 0, 129)


def _cost(draft: str):
    from simulator import SchedulerConfig
    from simulator.step_cost import StepCostModel
    from spectune.simulate import SimulationSpec, build_inputs

    spec = SimulationSpec(workload="poisson", rate=4.0, requests=5, lengths="azure-conv",
                          acceptance="iid:0.6", seed=0, draft=draft)
    return StepCostModel(build_inputs(spec, {}, SchedulerConfig()).latency)


def _steps(policy, loops, compiled: bool, cost, seed: int, steps: int = 80) -> list:
    """Run `policy` through random steps (batches, outcomes, drafter confidences) with the
    loops chosen; every decision it makes, as bits where they are floats."""
    rng = np.random.default_rng(seed)
    requests = [FakeRequest(i, prompt_tokens=int(rng.integers(5, 3000)),
                            output_tokens=int(rng.integers(2, 60))) for i in range(24)]
    seen = []
    for step in range(steps):
        loops(compiled)
        live = [r for r in requests if r.generated < r.output_tokens]
        batch = [live[i] for i in sorted(rng.choice(len(live), min(len(live),
                                                                   int(rng.integers(1, 17))),
                                                    replace=False))]
        ctx = context(batch, k_max=int(rng.integers(1, 11)), cost=cost, step_index=step)
        ks = list(policy.choose(ctx))
        width = max(ks, default=0)
        top1 = rng.random((len(batch), width))
        top1[rng.random(top1.shape) < 0.05] = np.nan
        stops = list(policy.stop_chains(batch, ks, top1, np.zeros_like(top1)))
        seen.append((ks, stops, float(policy._threshold).hex(),
                     policy._plan_alpha.view(np.int64).tolist()))
        policy.observe(ctx, verified(rng, batch, stops))
    return [*seen, policy._seen.view(np.int64).tolist(), policy._top1_expected.tolist()]


@pytest.mark.parametrize("draft", ["none", "Llama-68M"])
@pytest.mark.parametrize("params", [{}, {"k0_bonus": "0.9", "stop_slack": "1.0"},
                                    {"prior_alpha": "0.9", "k_max": "6"}])
def test_choose_and_stop_are_the_numpy_code_step_after_step(loops, draft, params):
    cost = _cost(draft)
    runs = {compiled: _steps(make_policy("auto", params), loops, compiled, cost, seed=11)
            for compiled in (True, False)}
    assert runs[True] == runs[False]
    assert any(ks for ks, *_ in runs[True][:-2])  # it drafted


@pytest.mark.parametrize("draft", ["none", "Llama-68M"])
def test_each_draft_total_is_priced_as_the_numpy_code_prices_it(loops, draft):
    cost = _cost(draft)
    rng = np.random.default_rng(9)
    policy = make_policy("auto")
    for _ in range(30):  # up to 600 drafts: the verify pass compute-bound, its pairs priced
        b, depth = int(rng.integers(1, 60)), int(rng.integers(1, 11))
        contexts = rng.integers(2, 5000, b).tolist()
        ctx = context([FakeRequest(i) for i in range(b)], cost=cost)
        worth = rng.random(b * depth)
        worth[rng.random(len(worth)) < 0.2] = 0.0
        order = (-worth).argsort(kind="stable")[: int(np.count_nonzero(worth))]
        loops(True)
        from policies import compiled as module
        compiled = policy._price(ctx, contexts, worth[order], order, depth, module)
        loops(False)
        plain = policy._price(ctx, contexts, worth[order], order, depth)
        assert compiled[0].tolist() == plain[0].tolist()
        assert compiled[1].view(np.int64).tolist() == plain[1].view(np.int64).tolist()
        # the causal pairs too (a decode step on this GPU is memory-bound: they rarely show)
        cached = np.array(contexts) - 1
        pairs = cached.sum() + b + np.concatenate(([0], (cached[order // depth]
                                                         + order % depth + 2).cumsum()))
        assert module.verify_pairs(order, depth, np.array(contexts), int(cached.sum()) + b
                                   ).tolist() == pairs.tolist()


def test_alternatives_are_priced_the_same_as_lists_or_as_a_matrix(loops):
    from support.policy_fakes import LinearCost

    from policies.base import price_steps

    # five alternatives: a draft model's are priced at once with numpy too (4 or more)
    rows = np.array([[0, 0, 0], [2, 0, 1], [4, 3, 0], [1, 1, 1], [0, 5, 2]])
    contexts = [300, 80, 1200]
    for cost in (_cost("Llama-68M"), _cost("none"), LinearCost()):  # LinearCost: one by one
        for compiled in (True, False):
            loops(compiled)
            one_by_one = [float(cost.step_s(ks, contexts)) for ks in rows.tolist()]
            assert price_steps(cost, rows, contexts) == one_by_one
            assert price_steps(cost, rows.tolist(), contexts) == one_by_one


def test_the_pick_takes_the_first_of_equal_rates_as_argmax_does():
    from policies.compiled import pick

    # 1 request: 1, 2 and 3 tokens in 1, 2 and 3 s: every total as good as drafting nothing
    drafts, threshold, ks = pick(np.ones(2), np.arange(3), np.array([1.0, 2.0, 3.0]), 1, 1.0,
                                 np.ones((1, 2)), 0.5)
    assert (drafts, threshold, ks.tolist()) == (0, np.inf, [0])
    drafts, threshold, ks = pick(np.array([0.9, 0.5]), np.arange(3), np.ones(3), 1, 1.0,
                                 np.array([[0.9, 0.5]]), 0.5)
    assert (drafts, threshold, ks.tolist()) == (2, 0.5, [2])  # the most tokens a second


def test_a_draft_models_alternatives_at_once_are_their_steps_one_by_one(loops):
    cost = _cost("Llama-68M")
    rng = np.random.default_rng(5)
    for _ in range(40):
        b = int(rng.integers(1, 20))
        contexts = rng.integers(2, 5000, b).tolist()
        rows = rng.integers(0, 9, (int(rng.integers(1, 8)), b))
        rows[0] = 0  # an alternative without drafts
        module = loops(True)
        at_once = cost.steps_s(rows.tolist(), contexts)
        cached = np.array(contexts) - 1  # their sums (pairs rarely show in a memory-bound step)
        drafted, pairs, seqs, held = module.alternative_sums(rows, cached)
        assert drafted.tolist() == rows.sum(axis=1).tolist()
        assert pairs.tolist() == ((rows + 1) * cached + (rows + 1) * (rows + 2) // 2
                                  ).sum(axis=1).tolist()
        joins = rows[None] >= np.arange(1, rows.max() + 1)[:, None, None]  # pass j: k >= j
        assert seqs.tolist() == joins.sum(axis=2).tolist()
        assert held.tolist() == (joins * cached).sum(axis=2).tolist()
        loops(False)
        one_by_one = [float(cost.step_s(ks, contexts)) for ks in rows.tolist()]
        assert at_once == one_by_one


@pytest.mark.parametrize("acceptance,draft", [("smollm2-ngram", "none"),
                                              ("beta:7,3~20", "Llama-68M"),
                                              ("smollm2-eagle-ngram", "Llama-68M")])
def test_a_run_of_auto_gives_the_same_records_with_either(loops, acceptance, draft):
    _same_records(loops, "auto", acceptance, draft)


def _same_records(loops, policy: str, acceptance: str, draft: str) -> None:
    """A run's records with the compiled loops and with numpy (`policy`: name/key=value)."""
    from simulator import ClusterConfig, SchedulerConfig
    from simulator.engine import simulate
    from spectune.simulate import SimulationSpec, build_inputs

    name, *params = policy.split("/")
    frames = {}
    for compiled in (True, False):
        loops(compiled)
        spec = SimulationSpec(workload="poisson", rate=10.0, requests=120, lengths="azure-conv",
                              acceptance=acceptance, seed=2, draft=draft)
        inputs = build_inputs(spec, {}, SchedulerConfig())
        result = simulate(inputs.workload, inputs.latency, inputs.acceptance,
                          make_policy(name, dict(p.split("=") for p in params)),
                          inputs.kv_capacity_tokens, SchedulerConfig(),
                          ClusterConfig(1, "least-loaded"))
        frames[compiled] = (result.requests, result.steps)
    pd.testing.assert_frame_equal(frames[True][0], frames[False][0], check_exact=True)
    pd.testing.assert_frame_equal(frames[True][1], frames[False][1], check_exact=True)


def test_kld_variances_ratios_and_cleaned_kl_are_the_numpy_code(loops):
    from policies.kld_variance import clean_kl, variance_ratio

    rng = np.random.default_rng(4)
    for n in [*range(0, 40), 99, 100, 127, 128, 129, 300]:
        for decay in (0.9, 0.5, 1.0):
            history = rng.random(n) * 10.0 ** rng.integers(-4, 3)
            if n and rng.random() < 0.2:
                history[:] = history[0]  # flat: below 1e-6, the ratio's fallback
            ratios = []
            for compiled in (True, False):
                loops(compiled)
                ratios.append(float(variance_ratio(history, decay)).hex())
            assert ratios[0] == ratios[1], (n, decay)
    raw = np.array([0.5, np.nan, -0.0, -2.0, np.inf, 1e9, 3.0], dtype=np.float32)
    loops(True)
    cleaned = clean_kl(raw)
    loops(False)
    assert cleaned.view(np.int64).tolist() == clean_kl(raw).view(np.int64).tolist()


@pytest.mark.parametrize("policy,acceptance,draft", [
    ("kld_variance", "beta:7,3~20", "none"), ("kld_variance", "beta:3.5,6.5~20", "Llama-68M"),
    ("oracle/knows=probabilities", "beta:7,3~20", "Llama-68M"),  # its counts, compiled
    ("oracle/knows=probabilities", "beta:3.5,6.5~20", "none"),
    ("gammatune_plus", "smollm2-ngram", "none"),  # walked whole, compiled: capped
    ("gammatune", "beta:7,3~20", "Llama-68M"),
    ("adaedl", "smollm2-ngram", "none"), ("adaedl", "beta:3.5,6.5~20", "Llama-68M")])
def test_a_run_of_another_planner_gives_the_same_records_with_either(loops, policy, acceptance,
                                                                     draft):
    _same_records(loops, policy, acceptance, draft)


def _walked(loops, policy: str, params: dict, state: dict, run, cap, k_max: int, start: int,
            signals: dict) -> list:
    """A request walked with the compiled loops and with the walker step by step: each time the
    walk, its drafts, the policy's per-request state (`state`: attribute -> preset values, or
    none: a new request) and the walker's own, with their types."""
    from simulator.request import RequestState, walk_alone

    out = []
    for compiled in (True, False):
        loops(compiled)
        chosen = make_policy(policy, params)
        for name, value in state.items():
            getattr(chosen, name)[0] = value
        walker = chosen.walker(0, k_max, signals)
        request = RequestState(0, 0, 0.0, 50, len(run))
        request.run, request.cap, request.generated = run, cap, start
        if compiled:  # the compiled walk is the one taken (not the walker's fallback)
            assert walker.walk_all(start, run[start:], cap if cap is None else cap[start:])
            for name in ("_k", "_g", "_g_hat", "_lambda", "_rate"):  # as before it (it moved
                # them)
                if hasattr(chosen, name):
                    getattr(chosen, name).clear()
            for name, value in state.items():
                getattr(chosen, name)[0] = value
            walker = chosen.walker(0, k_max, signals)
        walk_alone(request, walker, k_max, policy)
        out.append((request.chain.tolist(), request.chain_ks.tolist(),
                    {name: {rid: (type(v).__name__, float(v).hex())
                            for rid, v in getattr(chosen, name).items()}
                     for name in ("_k", "_g", "_g_hat", "_lambda", "_rate")
                     if hasattr(chosen, name)},
                    {name: repr(getattr(walker, name))
                     for name in ("_state", "_g", "_g_hat", "_lambda") if hasattr(walker, name)}))
    return out


@pytest.mark.parametrize("capped", [True, False])
def test_a_heuristic_walk_is_its_walker_step_after_step(loops, capped):
    rng = np.random.default_rng(28 + capped)
    for params in ({}, {"k_init": "2", "grow": "1", "shrink": "2", "k_max": "7"},
                   {"grow": "0", "shrink": "0"}):
        for i in range(40):
            output = int(rng.integers(1, 300))
            run, cap = rng.integers(0, 12, output), rng.integers(0, 9, output)
            k_max, start = int(rng.integers(0, 11)), int(rng.integers(0, output))
            state = {"_k": int(rng.integers(1, 8))} if i % 2 else {}
            walks = _walked(loops, "heuristic", params, state, run, cap if capped else None,
                            k_max, start, {})
            assert walks[0] == walks[1]


@pytest.mark.parametrize("capped", [True, False])
def test_a_gammatune_walk_is_its_walker_step_after_step(loops, capped):
    rng = np.random.default_rng(8 + capped)
    for params in ({}, {"eta": "0.9", "delta": "0", "g_min": "2", "g_max": "7"}):
        for i in range(40):
            output = int(rng.integers(1, 300))
            run, cap = rng.integers(0, 12, output), rng.integers(0, 9, output)
            k_max, start = int(rng.integers(0, 11)), int(rng.integers(0, output))
            state = {"_g": int(rng.integers(2, 8)), "_g_hat": 2.5} if i % 2 else {}
            walks = _walked(loops, "gammatune", params, state, run, cap if capped else None,
                            k_max, start, {})
            assert walks[0] == walks[1]


@pytest.mark.parametrize("capped", [True, False])
def test_an_adaedl_walk_is_its_walker_step_after_step(loops, capped):
    rng = np.random.default_rng(18 + capped)
    for params in ({}, {"max_k": "4", "beta1": "0.2", "target_acceptance": "0.6"}):
        for i in range(40):
            output = int(rng.integers(1, 300))
            run, cap = rng.integers(0, 12, output), rng.integers(0, 9, output)
            entropy = rng.random(output) * 4.0
            entropy[rng.random(output) < 0.05] = np.nan  # an unreadable signal: a stop
            k_max, start = int(rng.integers(0, 11)), int(rng.integers(0, output))
            state = {"_lambda": 0.3, "_rate": 0.7} if i % 2 else {}
            walks = _walked(loops, "adaedl", params, state, run, cap if capped else None, k_max,
                            start, {"draft_entropy": entropy})
            assert walks[0] == walks[1]


def test_the_loops_refuse_shapes_they_were_not_made_for(loops):
    loops(True)
    from policies import compiled as module
    from simulator import compiled as simulator_loops

    ints = np.zeros(3, dtype=np.int64)
    table = np.zeros((3, 4), dtype=np.int64)
    with pytest.raises(IndexError, match="other lengths, or depth too large"):
        module.plan(np.ones(3), table, ints, np.ones(2), 4, ints, 0.0, False, 1, 0, 0.98)
    with pytest.raises(IndexError, match="other lengths, or depth too large"):
        module.plan(np.ones(3), table, ints, np.ones(3), 5, ints, 0.0, False, 1, 0, 0.98)
    with pytest.raises(IndexError, match="outside the ranked drafts"):
        module.pick(np.ones(2), np.array([0, 3]), np.ones(2), 1, 1.0, np.ones((1, 2)), 0.5)
    with pytest.raises(IndexError, match="other lengths"):
        module.pick(np.ones(2), np.array([0, 1]), np.ones(3), 1, 1.0, np.ones((1, 2)), 0.5)
    with pytest.raises(IndexError, match="a total past the ranked drafts"):
        module.prefix_counts(ints, np.array([4]), 2)
    with pytest.raises(IndexError, match="a request past the batch"):
        module.prefix_counts(np.array([0, 2]), np.array([2]), 2)
    with pytest.raises(IndexError, match="past the contexts"):
        module.verify_pairs(np.array([0, 9]), 4, np.array([5, 6]), 10)
    with pytest.raises(IndexError, match="a state outside the bin table"):
        module.plan(np.ones(3), table, np.array([0, 3, 0]), np.ones(3), 4, ints, 0.0, False, 1,
                    0, 0.98)
    with pytest.raises(IndexError, match="a bin outside the acceptance per bin"):
        module.plan(np.ones(3), table + 3, ints, np.ones(3), 4, ints, 0.0, False, 1, 0, 0.98)
    with pytest.raises(IndexError, match="or none"):
        module.pick(np.ones(2), ints[:0], np.ones(0), 1, 1.0, np.ones((1, 2)), 0.5)
    with pytest.raises(IndexError, match="past the matrix"):
        module._row_sum(np.ones((2, 3)), 0, 4)
    runs = np.array([-1, 1, 2])  # a negative run would never move forward: refused
    with pytest.raises(ValueError, match="negative cap or acceptance run"):
        module.gammatune_walk(runs, ints, False, 4, 3, 3.0, 2, 0.3, 1, 10, 1e-9)
    with pytest.raises(ValueError, match="negative cap or acceptance run"):
        module.adaedl_walk(runs, ints, False, 0, np.ones(3), 4, 0.5, 0.0, 0.5, 0.9, 0.01, 0.9)
    with pytest.raises(ValueError, match="negative start"):
        module.adaedl_walk(ints, ints, False, -1, np.ones(3), 4, 0.5, 0.0, 0.5, 0.9, 0.01, 0.9)
    with pytest.raises(IndexError, match="caps shorter"):
        module.gammatune_walk(ints, ints[:2], True, 4, 3, 3.0, 2, 0.3, 1, 10, 1e-9)
    with pytest.raises(IndexError, match="other shapes"):
        module.stop_lengths(np.ones((2, 3)), np.ones(10), np.ones((2, 4)), ints[:2], 0.1, 0.98)
    with pytest.raises(ValueError, match="a negative k"):
        simulator_loops.alternative_sums(np.array([[1, -1]]), ints[:2])
    with pytest.raises(IndexError, match="other requests"):
        simulator_loops.alternative_sums(np.array([[1, 1]]), ints)
    numbers = (1.0, 1.0, 1.0, 1.0, 1.0, False, 0.0, 0.0)
    with pytest.raises(IndexError, match="of other requests, or none"):
        simulator_loops.alternatives_times(np.array([[1, 1]]), ints, numbers, numbers, 0.0)
    with pytest.raises(IndexError, match="of other requests, or none"):
        simulator_loops.alternatives_times(np.zeros((1, 0), dtype=np.int64), ints[:0], numbers,
                                           numbers, 0.0)
    with pytest.raises(IndexError, match=r"a history of 2\.\.128 values"):
        module.variance_ratio(np.ones(129), np.ones(129), 129.0, np.ones(43), 43.0, 20.0)
    with pytest.raises(IndexError, match=r"a history of 2\.\.128 values"):
        module.variance_ratio(np.ones(6), np.ones(6), 6.0, np.ones(7), 7.0, 20.0)


def test_a_confidence_just_under_one_lands_in_the_top_bin():
    from policies.auto import TOP1_BINS, _top1_bin, _top1_bins

    below_one = float(np.nextafter(1.0, 0.0))  # times 10 rounds to 10.0
    assert _top1_bin(below_one) == TOP1_BINS - 1 == int(_top1_bins(np.array([below_one]))[0])
    assert _top1_bin(float("nan")) == 0 and _top1_bin(float("inf")) == TOP1_BINS - 1

"""`StepCostModel.steps_s`: alternatives for one batch priced at once give `step_s`'s floats,
bit for bit (a planner decides the same either way), and fall back to one call each where the
latency model's arrays might not match its scalars."""

from __future__ import annotations

import numpy as np
import pytest

from policies.base import price_steps
from simulator.catalog import get_gpu, get_model
from simulator.profiled import ProfiledLatency
from simulator.roofline import RooflineLatency
from simulator.step_cost import StepCostModel
from tests.simulator.test_profiled import make_table


def _alternatives(rng, batch: int, rows: int, k_max: int = 8) -> list[list[int]]:
    return [rng.integers(0, k_max + 1, batch).tolist() for _ in range(rows)]


def _model_free_case(seed: int, most_rows: int):
    """A model-free roofline's cost, and a random batch's contexts and alternative ks."""
    rng = np.random.default_rng(seed)
    cost = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), None, get_gpu("h100")))
    batch = int(rng.integers(1, 65))
    contexts = rng.integers(2, 9000, batch).tolist()
    return cost, contexts, _alternatives(rng, batch, int(rng.integers(1, most_rows)))


@pytest.mark.parametrize("seed", range(6))
def test_a_model_free_roofline_prices_every_row_to_the_bit(seed):
    cost, contexts, rows = _model_free_case(seed, 40)
    got = cost.steps_s(rows, contexts)
    assert got == [cost.step_s(ks, contexts) for ks in rows]
    assert all(type(t) is float for t in got)


@pytest.mark.parametrize("seed", range(6))
def test_a_draft_model_chain_on_the_roofline_prices_every_row_to_the_bit(seed):
    """Its draft passes added per column in the order one step adds them (rows that draft
    nothing, and rows whose deepest chain is shallower than others', included)."""
    rng = np.random.default_rng(100 + seed)
    idle = RooflineLatency(get_model("llama-3.1-70b"), get_model("llama-3.2-1b"),
                           get_gpu("h100"), tp=8, draft_tp=2)
    idle.idle_proposer_s = 0.0012  # a step that drafts nothing pays its proposer's time
    for latency, speculating in (
            (RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"),
                             get_gpu("h100")), False),
            (RooflineLatency(get_model("llama-3.1-70b"), get_model("llama-3.2-1b"),
                             get_gpu("a100"), tp=4), False),
            (idle, True)):
        cost = StepCostModel(latency, speculating=speculating)
        batch = int(rng.integers(1, 65))
        contexts = rng.integers(2, 9000, batch).tolist()
        rows = _alternatives(rng, batch, int(rng.integers(1, 30)))
        rows += [[0] * batch, [1] + [0] * (batch - 1)]
        got = cost.steps_s(rows, contexts)
        assert got == [cost.step_s(ks, contexts) for ks in rows]
        assert all(type(t) is float for t in got)


def test_a_draft_model_prices_few_rows_one_by_one_and_more_at_once(monkeypatch):
    """Both ways give the same floats; at once costs about four rows one by one."""
    from simulator.step_cost import DRAFT_ROWS_AT_ONCE

    rng = np.random.default_rng(11)
    contexts = rng.integers(2, 2000, 9).tolist()
    cost = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"),
                                         get_gpu("h100")))
    calls, real = [], cost.step_s
    monkeypatch.setattr(cost, "step_s", lambda ks, c, f=None: calls.append(ks) or real(ks, c))
    few = _alternatives(rng, 9, DRAFT_ROWS_AT_ONCE - 1)
    assert cost.steps_s(few, contexts) == [real(ks, contexts) for ks in few]
    assert calls == few
    calls.clear()
    more = _alternatives(rng, 9, DRAFT_ROWS_AT_ONCE)
    assert cost.steps_s(more, contexts) == [real(ks, contexts) for ks in more]
    assert calls == []
    # an empty batch: one by one, as step_s prices it
    assert cost.steps_s([[]] * DRAFT_ROWS_AT_ONCE, []) == [real([], [])] * DRAFT_ROWS_AT_ONCE


def _tree_latency():
    from simulator.draft_tree import TreeShape

    latency = RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"), get_gpu("h100"))
    latency.draft_tree = TreeShape(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    return latency


def test_a_tree_or_a_profile_is_priced_one_row_at_a_time(monkeypatch):
    rng = np.random.default_rng(7)
    contexts = rng.integers(2, 2000, 12).tolist()
    rows = _alternatives(rng, 12, 5, k_max=3)
    for latency in (_tree_latency(), ProfiledLatency(make_table())):
        cost = StepCostModel(latency)
        calls, real = [], cost.step_s

        def counted(ks, c, f=None, calls=calls, real=real):
            calls.append(ks)
            return real(ks, c)

        monkeypatch.setattr(cost, "step_s", counted)
        assert cost.steps_s(rows, contexts) == [real(ks, contexts) for ks in rows]
        assert calls == rows


def test_price_steps_uses_step_s_when_a_cost_model_has_no_steps_s():
    class OnlyStep:
        def step_s(self, ks, contexts, feeds=None):
            return 1.0 + sum(ks) / 10 + sum(contexts) / 1000

    assert price_steps(OnlyStep(), [[0, 0], [1, 2]], [10, 20]) == [1.03, 1.33]
    assert price_steps(OnlyStep(), [], [10, 20]) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_chain_step_priced_from_its_sums_is_steps_s_to_the_bit(seed):
    """goodput's per-request climb prices moves from the verify pass's sums it keeps."""
    cost, contexts, rows = _model_free_case(seed, 30)
    batch = len(contexts)
    cached = [c - 1 for c in contexts]
    drafted = [sum(ks) for ks in rows]
    pairs = [sum((k + 1) * c + (k + 1) * (k + 2) // 2 for k, c in zip(ks, cached))
             for ks in rows]
    assert cost.chain_sums_s(batch, drafted, sum(cached), pairs) == cost.steps_s(rows, contexts)


def test_no_sums_pricing_with_a_draft_model_or_a_profile():
    for latency in (RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"),
                                    get_gpu("h100")), ProfiledLatency(make_table())):
        assert StepCostModel(latency).chain_sums_s(2, [0], 10, [2]) is None


def test_batch_adaptive_prices_its_whole_table_from_sums_to_the_bit():
    from policies.batch_adaptive import _uniform_steps_s

    cost = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), None, get_gpu("h100")))
    every = _uniform_steps_s(cost, 700, 40, 6)
    assert len(every) == 40
    for b in (1, 2, 17, 40):
        assert every[b - 1] == price_steps(cost, [[k] * b for k in range(7)], [700] * b)
    drafting = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"),
                                             get_gpu("h100")))
    assert _uniform_steps_s(drafting, 700, 40, 6) is None


@pytest.mark.parametrize("per_step", [False, True])
def test_a_segment_of_a_model_free_chain_is_priced_from_sums_to_the_bit(per_step):
    """The fast path's segments: chain_segment_s gives iteration_s's floats."""
    rng = np.random.default_rng(int(per_step))
    cost = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), None, get_gpu("h100")))
    batch, steps = 23, 17
    prompts = rng.integers(1, 4000, batch)
    gen = np.cumsum(rng.integers(1, 6, (batch, steps)), axis=1) + rng.integers(0, 300, (batch, 1))
    ks = rng.integers(0, 8, (batch, steps) if per_step else batch)
    got = cost.chain_segment_s(ks, prompts, gen)
    want = cost.iteration_s(ks, prompts[:, None] + gen - 1)
    assert got.tolist() == want.tolist()
    drafting = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"),
                                             get_gpu("h100")))
    assert drafting.chain_segment_s(ks, prompts, gen) is None

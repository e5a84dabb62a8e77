"""What a step that drafts a tree costs: its verify pass feeds the tree's nodes, each head pass
one entry per node that has children; a chain-shaped tree costs exactly a chain; the per-step
fast path agrees with one step at a time."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine import LinearLatency

from simulator.draft_tree import TreeShape, chain_shape
from simulator.latency import LatencyModel
from simulator.step_cost import StepCostModel

SHAPE = TreeShape(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))


class Recording(LatencyModel):
    """Every pass it is asked for: (role, seqs, tokens, cached, pairs); each costs 1 s."""

    source = "test: recording"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def forward_s(self, role, num_seqs, query_tokens, cached_tokens, attn_pairs):
        self.calls.append((role, int(num_seqs), int(query_tokens), int(cached_tokens),
                           int(attn_pairs)))
        return 1.0

    def step_overhead_s(self, num_seqs, drafted_tokens=0):
        return 0.0

    @property
    def has_draft_model(self) -> bool:
        return True


def test_a_shape_counts_its_verify_tokens_expanding_nodes_and_pairs():
    assert [SHAPE.draft_tokens(k) for k in range(5)] == [0, 2, 5, 6, 6]
    assert [SHAPE.expanding(d) for d in range(4)] == [1, 2, 1, 0]
    assert SHAPE.verify_pairs(2) == 1 + 2 * 2 + 3 * 3
    chain = chain_shape(3)
    assert [chain.verify_pairs(k) for k in range(4)] == [(k + 1) * (k + 2) // 2 for k in range(4)]


def test_a_tree_step_feeds_its_nodes_to_the_target_and_the_head():
    """Requests at k = 2 and 3 after 10 and 20 cached tokens, worked out by hand."""
    latency = Recording()
    StepCostModel(latency, draft_tree=SHAPE).iteration_s([2, 3], [10, 20])
    verify = ("target", 2, (5 + 1) + (6 + 1), 30, 6 * 10 + 14 + 7 * 20 + 18)
    head = [("draft", 1, 1, 20 + 3, 20 + 3),  # pass 3: (0, 0) of the k = 3 request
            ("draft", 2, 2 * 2, 30 + 2, 2 * (30 + 2 * 2)),  # pass 2: (0,) and (1,) each
            ("draft", 2, 2, 30, 30 + 2)]  # pass 1: the last token each
    assert latency.calls == [verify, *head]


def test_a_chain_shaped_tree_costs_a_chain_and_deeper_ks_stop_at_the_tree():
    rng = np.random.default_rng(0)
    ks, cached, feeds = rng.integers(0, 5, 7), rng.integers(5, 90, 7), rng.integers(1, 4, 7)
    plain, chain = StepCostModel(LinearLatency()), StepCostModel(LinearLatency(), chain_shape(6))
    assert chain.iteration_s(ks, cached, feeds=feeds) == pytest.approx(
        plain.iteration_s(ks, cached, feeds=feeds), rel=1e-12)
    tree = StepCostModel(LinearLatency(), SHAPE)
    assert tree.iteration_s([6, 3], cached[:2]) == pytest.approx(
        tree.iteration_s([3, 3], cached[:2]), rel=1e-12)
    assert tree.iteration_s([3, 3], cached[:2]) > plain.iteration_s([3, 3], cached[:2])


def test_the_fast_path_costs_tree_steps_as_one_at_a_time():
    rng = np.random.default_rng(1)
    ks = np.array([0, 1, 2, 3, 5])
    cached = rng.integers(5, 200, (5, 6))
    feeds = rng.integers(1, 5, (5, 6))
    cost = StepCostModel(LinearLatency(), SHAPE)
    many = cost.iteration_s(ks, cached, feeds=feeds)
    one = [cost.iteration_s(ks, cached[:, s], feeds=feeds[:, s]) for s in range(6)]
    np.testing.assert_allclose(many, one, rtol=1e-12)


def test_simulate_takes_the_tree_a_trace_was_recorded_with():
    """A trace recorded with a tree (its meta) is costed as the tree, exactly as a latency
    model that knows the tree; a latency model with another tree is refused."""
    from support.engine import trace_from_runs, workload

    from policies import make_policy
    from simulator import SchedulerConfig, simulate
    from traces import SpeculationTrace

    wl = workload([0.0, 0.0, 0.01], [12, 30, 7], [20, 9, 15])
    runs = [np.random.default_rng(i).integers(0, 4, 20) for i in range(3)]
    plain = trace_from_runs(runs)
    recorded = SpeculationTrace(requests=plain.requests,
                                meta={**plain.meta, "tree": SHAPE.to_json()})
    sched = SchedulerConfig(max_num_seqs=4, kv_capacity_tokens=10_000, k_max=3)
    fixed = make_policy("fixed", {"k": 3})
    knows = LinearLatency()
    knows.draft_tree = SHAPE
    by_trace = simulate(wl, LinearLatency(), recorded, fixed, 10_000, sched)
    by_latency = simulate(wl, knows, plain, fixed, 10_000, sched)
    chain = simulate(wl, LinearLatency(), plain, fixed, 10_000, sched)
    assert by_trace.steps.duration_s.tolist() == by_latency.steps.duration_s.tolist()
    assert by_trace.steps.duration_s.sum() > chain.steps.duration_s.sum()
    other = LinearLatency()
    other.draft_tree = chain_shape(3)
    with pytest.raises(ValueError, match="not the one the speculation trace"):
        simulate(wl, other, recorded, fixed, 10_000, sched)


def test_a_tree_trace_replays_any_k_beyond_its_depth():
    """A tree's run at its depth is exact (the tree goes no deeper), so k_max above the trace's
    cap is fine there, and still refused for a chain's capped trace."""
    from support.engine import workload

    from policies import make_policy
    from simulator import SchedulerConfig, simulate
    from traces import RequestSpeculation, SpeculationTrace

    wl = workload([0.0, 0.0], [12, 30], [20, 9])
    reqs = tuple(RequestSpeculation(run=np.minimum(np.arange(20) % 5, 3).astype(np.int32))
                 for _ in range(2))
    sched = SchedulerConfig(max_num_seqs=4, kv_capacity_tokens=10_000, k_max=6)
    tree = SpeculationTrace(requests=reqs, meta={"max_run": 3, "tree": SHAPE.to_json()})
    deep = simulate(wl, LinearLatency(), tree, make_policy("fixed", {"k": 6}), 10_000, sched)
    assert deep.steps.accepted.sum() > 0
    chain = SpeculationTrace(requests=reqs, meta={"max_run": 3})
    with pytest.raises(ValueError, match="caps accepted runs at 3"):
        simulate(wl, LinearLatency(), chain, make_policy("fixed", {"k": 6}), 10_000, sched)

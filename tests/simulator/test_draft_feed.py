"""The draft catch-up: the rule per drafter kind, and what the step cost charges for it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.engine import LinearLatency

from simulator import StepCostModel
from simulator.draft_feed import chain_feed, check_catch_up, next_feed


@pytest.mark.parametrize("catch_up,feed,drafted,emitted,expected", [
    ("bonus", 1, 3, 2, 1),       # a rejection: the bonus token only
    ("bonus", 1, 3, 4, 2),       # the whole chain: the last draft (never fed) and the bonus
    ("bonus", 1, 1, 2, 2),       # a chain of one fed no draft
    ("bonus", 2, 0, 1, 3),       # k = 0: the committed token waits for the next chain
    ("committed", 1, 3, 2, 2),   # EAGLE re-feeds the accepted drafts and the bonus
    ("committed", 1, 3, 4, 4),
    ("committed", 3, 0, 1, 4),
    ("one", 3, 0, 1, 1),         # the ablation: one token per request, always
    ("one", 1, 3, 4, 1),
])
def test_next_feed(catch_up, feed, drafted, emitted, expected):
    assert next_feed(catch_up, feed, drafted, emitted) == expected
    if drafted:  # the fast path's form, on arrays
        arrays = chain_feed(catch_up, np.array([drafted, 2]), np.array([emitted, 1]))
        assert arrays[0] == expected


def test_an_unknown_catch_up_is_refused_with_where_it_came_from():
    with pytest.raises(ValueError, match=r"run\.json: draft_catch_up must be one of bonus, "
                                         r"committed, one, got 'all'"):
        check_catch_up("all", "run.json")


class _Recording(LinearLatency):
    """Records every draft pass's aggregates."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[tuple] = []

    def forward_s(self, role, num_seqs, query_tokens, cached_tokens, attn_pairs):
        if role == "draft" and np.ndim(num_seqs) == 0:
            self.passes.append((num_seqs, query_tokens, cached_tokens, attn_pairs))
        return super().forward_s(role, num_seqs, query_tokens, cached_tokens, attn_pairs)


def test_the_first_draft_pass_feeds_each_requests_catch_up():
    """k = (2, 0, 1), cached (100, 50, 30), feeds (3, 9, 1): pass 1 feeds 3 + 1 tokens over
    (100 + 1 - 3) + 30 cached entries; pass 2 one token for the first request; the idle
    request's feed is not charged."""
    lat = _Recording()
    StepCostModel(lat).iteration_s([2, 0, 1], [100, 50, 30], feeds=[3, 9, 1])
    pairs_1 = (3 * 98 + 3 * 4 // 2) + (30 + 1)
    assert sorted(lat.passes, key=lambda p: p[0]) == [(1, 1, 101, 102), (2, 4, 128, pairs_1)]
    lat.passes.clear()
    StepCostModel(lat).iteration_s([2, 0, 1], [100, 50, 30])
    assert sorted(lat.passes, key=lambda p: p[0]) == [(1, 1, 101, 102), (2, 2, 130, 132)]


def test_many_steps_at_once_cost_what_each_step_costs_alone():
    rng = np.random.default_rng(4)
    ks = np.array([3, 0, 1, 3, 2])
    cached = rng.integers(20, 400, (5, 7))
    feeds = rng.integers(1, 5, (5, 7))
    cost = StepCostModel(LinearLatency())
    at_once = cost.iteration_s(ks, cached, feeds=feeds)
    alone = [cost.iteration_s(ks.tolist(), cached[:, s].tolist(), feeds=feeds[:, s].tolist())
             for s in range(7)]
    np.testing.assert_allclose(at_once, alone, rtol=1e-12)
    assert np.all(at_once > cost.iteration_s(ks, cached))  # feeds > 1 somewhere in every step


def test_feeds_must_match_the_batch():
    with pytest.raises(ValueError, match="feeds must have the shape of cached"):
        StepCostModel(LinearLatency()).iteration_s([1, 1], [10, 10], feeds=[1])


def test_a_policy_prices_a_step_with_the_feeds_the_engine_charges():
    """`step_s` (what goodput and the oracle ask) with the requests' feeds is the iteration the
    engine will charge; without them, one token per request."""
    cost = StepCostModel(LinearLatency())
    contexts, feeds = [101, 51, 31], [3, 9, 1]
    priced = cost.step_s([2, 0, 1], contexts, feeds)
    assert priced == cost.iteration_s([2, 0, 1], [100, 50, 30], feeds=feeds)
    assert priced > cost.step_s([2, 0, 1], contexts) == cost.iteration_s([2, 0, 1], [100, 50, 30])


def test_a_segment_at_k0_leaves_the_backlog_the_next_chain_pays():
    """The fast path through a stretch where the whole batch drafts nothing (batch_adaptive's
    k = 0 at a large batch) grows each request's draft feed as stepping does, so the chain
    after it is charged its catch-up (once missed: feeds stayed at their last chain's)."""
    from support.engine import workload

    from policies import make_policy
    from simulator import SchedulerConfig, simulate
    from traces import parametric_trace, parse_acceptance

    rng = np.random.default_rng(4)
    n = 30
    wl = workload(np.sort(rng.uniform(0, 0.4, n)), rng.integers(5, 60, n),
                  rng.integers(20, 80, n))
    trace = parametric_trace(parse_acceptance("iid:0.7"), wl.output_tokens, rng)
    policy = make_policy("batch_adaptive", {"schedule": "[[1,3,3],[4,64,0]]"})
    fast, slow = (simulate(wl, LinearLatency(), trace, policy, 100_000,
                           SchedulerConfig(max_num_seqs=8), fast_path=f) for f in (True, False))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    drafted = fast.steps.drafted.to_numpy()
    assert (drafted == 0).any() and (drafted > 0).any()
    # the fast path's clock adds a segment's iterations at once: equal to 1e-9, not the bit
    for frame in ("steps", "requests"):
        pd.testing.assert_frame_equal(getattr(fast, frame), getattr(slow, frame),
                                      check_exact=False, rtol=1e-9)


@pytest.mark.parametrize("catch_up", ["bonus", "committed", "one"])
@pytest.mark.parametrize("capped", [False, True])
def test_a_walks_feeds_are_the_segments_feeds_of_its_request(catch_up, capped):
    """`Replica._walk_feeds` (one request's whole walk, for the kept sums) gives the row that
    `_feeds` gives it in a segment's matrices: after capped steps that draft nothing, at
    k = 0, from any feed it starts at."""
    from types import SimpleNamespace

    from simulator.replica import Replica
    from simulator.request import RequestState, walk_chain

    rng = np.random.default_rng(11 + capped)
    replica = SimpleNamespace(catch_up=catch_up)
    replica._varied_feeds = lambda *args: Replica._varied_feeds(replica, *args)
    for index in range(60):
        output = int(rng.integers(2, 80))
        request = RequestState(index, index, 0.0, 100, output)
        request.run = rng.integers(0, 7, output)
        request.cap = rng.integers(0, 4, output) if capped else None
        request.generated = int(rng.integers(0, output))
        request.draft_feed = int(rng.integers(1, 5))
        walk_chain(request, int(rng.integers(0, 5)))
        drafts = None if request.chain_ks is None else request.chain_ks[None, :]
        want = Replica._feeds(replica, [request], np.array([request.chain_k]),
                              request.chain[None, :], drafts)[0]
        assert Replica._walk_feeds(replica, request).tolist() == want.tolist()

"""The scheduler's rules, the fast path's equivalence, and conservation properties."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engine import ByParity, LinearLatency, workload

from policies import Policy, make_policy
from simulator import ClusterConfig, ConfigError, SchedulerConfig, simulate
from traces import parametric_trace, parse_acceptance

BIG_KV = 10_000_000


def _random_case(seed: int, n: int = 300, rate: float = 20.0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    wl = workload(arrivals, rng.integers(1, 300, n), rng.integers(1, 200, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    return wl, trace


@pytest.mark.parametrize("k", [0, 4])
@pytest.mark.parametrize("replicas,router", [(1, "round-robin"), (3, "round-robin"),
                                             (3, "least-loaded")])
def test_fast_path_gives_the_same_records_as_step_by_step(k, replicas, router):
    wl, trace = _random_case(7)
    runs = [simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": k}), 60_000,
                     SchedulerConfig(max_num_seqs=16), ClusterConfig(replicas, router),
                     fast_path=fast) for fast in (True, False)]
    fast, slow = runs
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=False, rtol=1e-9)


def test_batch_cap_and_kv_capacity_are_respected():
    wl, trace = _random_case(11, rate=200.0)
    kv = 4000
    res = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 3}), kv,
                   SchedulerConfig(max_num_seqs=8, k_max=5))
    steps = res.steps
    assert (steps["decode_seqs"] + steps["prefill_seqs"]).max() <= 8
    assert steps["kv_used_tokens"].max() <= kv
    assert steps["waiting"].max() > 0  # the caps did bind


def test_admission_is_first_come_first_served():
    wl, trace = _random_case(5, rate=100.0)
    res = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 2}), 5000,
                   SchedulerConfig(max_num_seqs=4))
    admitted = res.requests.sort_values("arrival_s", kind="stable")["admitted_s"].to_numpy()
    assert np.all(np.diff(admitted) >= 0)


def test_chunked_prefill_keeps_to_the_token_budget():
    wl, trace = _random_case(2, rate=50.0)
    budget = 256
    res = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 3}), BIG_KV,
                   SchedulerConfig(max_batched_tokens=budget, chunked_prefill=True))
    steps = res.steps
    decode_tokens = steps["drafted"] + steps["decode_seqs"]
    assert (steps["prefill_tokens"] <= np.maximum(0, budget - decode_tokens)).all()
    assert steps["prefill_tokens"].sum() == wl.prompt_tokens.sum()
    mixed = steps[(steps["prefill_seqs"] > 0) & (steps["decode_seqs"] > 0)]
    assert len(mixed) > 0


def test_a_model_free_drafter_costs_no_draft_time():
    wl, trace = _random_case(4, n=30, rate=1.0)
    with_draft = simulate(wl, LinearLatency(draft=True), trace, make_policy("fixed", {"k": 4}),
                          BIG_KV)
    no_draft = simulate(wl, LinearLatency(draft=False), trace, make_policy("fixed", {"k": 4}),
                        BIG_KV)
    assert no_draft.steps["duration_s"].sum() < with_draft.steps["duration_s"].sum()
    # same acceptance, so the same tokens per step
    assert no_draft.steps["emitted"].sum() == with_draft.steps["emitted"].sum()


def test_a_request_that_can_never_fit_is_a_clear_error():
    wl = workload([0.0], [5000], [100])
    trace = parametric_trace(parse_acceptance("iid:0.5"), wl.output_tokens,
                             np.random.default_rng(0))
    with pytest.raises(ConfigError, match="needs 5110 KV-cache tokens"):
        simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 4}), 1000)


def test_a_policy_choosing_k_over_the_cap_is_a_clear_error():
    wl, trace = _random_case(1, n=5)
    with pytest.raises(ConfigError, match="k=12"):
        simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 12}), BIG_KV,
                 SchedulerConfig(k_max=10))


@dataclass
class _Recording(Policy):
    """A feedback policy: drafts 1 more after a full acceptance, 1 less otherwise."""

    name: ClassVar[str] = "recording-test"
    signals: ClassVar[frozenset[str]] = frozenset({"kl", "draft_top1"})
    log: ClassVar[list] = []  # shared by the replicas' copies

    def __post_init__(self):
        self.k = {}

    def choose(self, ctx):
        return [self.k.get(r.request_id, 2) for r in ctx.requests]

    def observe(self, ctx, outcomes):
        for o in outcomes:
            _Recording.log.append((o.k, o.accepted, {n: len(v) for n, v in o.signals.items()}))
            nxt = o.k + 1 if o.accepted == o.k else o.k - 1
            self.k[o.request_id] = min(6, max(0, nxt))


def test_feedback_policies_see_only_verified_positions():
    wl, trace = _random_case(9, n=40)
    _Recording.log.clear()
    res = simulate(wl, LinearLatency(), trace, _Recording(), BIG_KV, SchedulerConfig(k_max=6),
                   ClusterConfig(2, "least-loaded"))
    assert res.requests["finish_s"].notna().all()
    log = _Recording.log
    assert len(log) == res.steps["decode_seqs"].sum()
    assert any(acc < k for k, acc, _ in log) and any(acc == k > 0 for k, acc, _ in log)
    for k, acc, lengths in log:
        assert set(lengths) == {"kl", "draft_top1"}
        for n in lengths.values():
            # the accepted drafts and the first rejected one, never a position after it
            assert n <= min(acc + 1, k)
            assert (n > 0) == (k > 0)
    assert res.steps["max_k"].max() == 6


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 40),
    rate=st.floats(0.5, 500.0),
    k=st.integers(0, 8),
    alpha=st.floats(0.0, 1.0),
    max_num_seqs=st.integers(1, 12),
    replicas=st.integers(1, 3),
    router=st.sampled_from(["round-robin", "least-loaded"]),
    chunk=st.sampled_from([None, 64, 300]),
)
def test_conservation_properties(seed, n, rate, k, alpha, max_num_seqs, replicas, router, chunk):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    wl = workload(arrivals, rng.integers(1, 200, n), rng.integers(1, 120, n))
    trace = parametric_trace(parse_acceptance(f"iid:{alpha}"), wl.output_tokens, rng)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, k_max=8, max_batched_tokens=chunk,
                            chunked_prefill=chunk is not None)
    res = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": k}), 50_000, sched,
                   ClusterConfig(replicas, router))
    req, steps = res.requests, res.steps
    # every request finishes, and never before it arrives
    assert req["finish_s"].notna().all()
    assert (req["arrival_s"] <= req["admitted_s"]).all()
    assert (req["admitted_s"] <= req["first_token_s"]).all()
    assert (req["first_token_s"] <= req["finish_s"]).all()
    # tokens are conserved: the prefill's first token + every decode emission = output tokens
    assert steps["emitted"].sum() + n == req["output_tokens"].sum()
    assert steps["prefill_tokens"].sum() == req["prompt_tokens"].sum()
    assert (req["steps"][req["output_tokens"] == 1] == 0).all()
    # per-request counters add up to the per-iteration ones
    assert steps["decode_seqs"].sum() == req["steps"].sum()
    assert steps["drafted"].sum() == req["drafted"].sum()
    assert steps["accepted"].sum() == req["accepted"].sum()
    assert (req["accepted"] <= req["drafted"]).all()
    # k within bounds
    assert steps["max_k"].max() <= k
    assert (steps["drafted"] <= k * steps["decode_seqs"]).all()
    assert (steps["accepted"] <= steps["drafted"]).all()
    # one iteration at a time per replica
    for _, g in steps.groupby("replica"):
        ends = (g["start_s"] + g["duration_s"]).to_numpy()
        assert np.all(g["start_s"].to_numpy()[1:] >= ends[:-1] - 1e-9)


class _StepLatency(LinearLatency):
    """Every iteration costs exactly 2^-10 s: arrivals on a 2^-10 grid land on boundaries."""

    def forward_s(self, role, num_seqs, query_tokens, cached_tokens, attn_pairs):
        zero = 0.0 * np.asarray(cached_tokens, dtype=float)
        return zero + (2.0**-10 if role == "target" else 0.0)

    def step_overhead_s(self, num_seqs, drafted_tokens=0):
        return 0.0 * np.asarray(num_seqs, dtype=float)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy,params", [("fixed", {"k": 0}), ("fixed", {"k": 3}),
                                           ("batch_adaptive", {})])
@pytest.mark.parametrize("router", ["round-robin", "least-loaded"])
def test_fast_path_matches_step_by_step_even_on_exact_boundaries(seed, policy, params, router):
    rng = np.random.default_rng(seed)
    n = 60
    arrivals = np.sort(rng.integers(0, 400, n)) * 2.0**-10  # on iteration boundaries, with ties
    wl = workload(arrivals, rng.integers(1, 50, n), rng.integers(1, 40, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    runs = [simulate(wl, _StepLatency(draft=False), trace, make_policy(policy, params), 100_000,
                     SchedulerConfig(max_num_seqs=6), ClusterConfig(3, router),
                     fast_path=fast) for fast in (True, False)]
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=False,
                                  rtol=1e-12)
    pd.testing.assert_frame_equal(runs[0].steps, runs[1].steps, check_exact=False, rtol=1e-12)


class _RefeedLatency(LinearLatency):
    draft_catch_up = "committed"  # an EAGLE head's (simulator/draft_feed.py)


@pytest.mark.parametrize("policy", [ByParity(), make_policy("fixed", {"k": 3})])
def test_fast_path_carries_the_draft_catch_up_across_segments(policy):
    """Both catch-up rules give the fast path's records step by step's, and re-feeding the
    committed tokens costs more than feeding the bonus token, for the same tokens."""
    wl, trace = _random_case(3, n=150)
    runs = {}
    for latency in (LinearLatency(), _RefeedLatency()):
        fast, slow = (simulate(wl, latency, trace, policy, 60_000, SchedulerConfig(max_num_seqs=8),
                               fast_path=f) for f in (True, False))
        pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=False, rtol=1e-9)
        pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=False, rtol=1e-9)
        runs[latency.draft_catch_up] = fast
    bonus, committed = runs["bonus"], runs["committed"]
    assert committed.steps["emitted"].sum() == bonus.steps["emitted"].sum()
    assert committed.steps["duration_s"].sum() > bonus.steps["duration_s"].sum()

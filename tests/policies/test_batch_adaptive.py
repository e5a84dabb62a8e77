"""batch_adaptive: vLLM / TensorRT-LLM tables, the derived table (Su et al. 2023), vLLM V0's
sticky disable_by_batch_size, and k within bounds (hypothesis)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.engine import LinearLatency, workload
from support.policy_fakes import FakeRequest, LinearCost, context

from policies import PolicyError, expected_emitted, make_policy
from policies.batch_adaptive import BatchAdaptive, derive_table

VLLM_DOC = [[1, 16, 5], [17, 32, 4], [33, 64, 3], [65, 128, 1], [129, 512, 0]]


def _ks(policy, batch_size: int, k_max: int = 10, cost=None, first_id: int = 0) -> list[int]:
    reqs = [FakeRequest(first_id + i) for i in range(batch_size)]
    return list(policy.choose(context(reqs, k_max=k_max, cost=cost)))


def _k(policy, batch_size: int, **kw) -> int:
    ks = _ks(policy, batch_size, **kw)
    assert len(set(ks)) == 1, ks  # one k for the whole batch
    return ks[0]


# -- user tables ---------------------------------------------------------------------------------

@pytest.mark.parametrize("b,k", [(1, 5), (16, 5), (17, 4), (64, 3), (65, 1), (100, 1), (128, 1),
                                 (129, 0), (200, 0), (512, 0), (600, 0)])
def test_vllm_doc_example(b, k):
    assert _k(BatchAdaptive(schedule=VLLM_DOC), b) == k


def test_schedule_from_the_command_line_is_json():
    policy = make_policy("batch_adaptive", {"schedule": "[[1,16,5],[17,32,4],[33,512,0]]"})
    assert [_k(policy, b) for b in (1, 16, 17, 33)] == [5, 5, 4, 0]


def test_k_is_clamped_to_the_engine_cap():
    assert _k(BatchAdaptive(schedule=VLLM_DOC), 1, k_max=3) == 3
    assert _k(BatchAdaptive(schedule=VLLM_DOC), 1, k_max=0) == 0


def test_a_gap_carries_the_previous_k_forward():
    policy = BatchAdaptive(schedule=[[1, 4, 3], [9, 16, 1]])
    assert [_k(policy, b) for b in (4, 5, 8, 9, 20)] == [3, 3, 3, 1, 1]
    assert policy.table(LinearCost(), 10) == [(1, 8, 3), (9, 16, 1)]


@pytest.mark.parametrize("schedule,message", [
    ([[17, 32, 4], [1, 16, 5]], "sorted and non-overlapping"),
    ([[1, 16, 5], [10, 32, 4]], "overlaps"),
    ([[2, 16, 5]], "start at batch size 1"),
    ([[1, 16, -1]], "K must be in 0..64"),
    ([[1, 16, 65]], "K must be in 0..64"),
    ([[1, 0, 3]], "1 <= bs_lo <= bs_hi"),
    ([[0, 4, 3]], "1 <= bs_lo <= bs_hi"),
    ([[1, 16]], "three integers"),
    ([[1, 16, 2.5]], "three integers"),
    ([], "non-empty list"),
])
def test_bad_schedules_are_rejected_with_a_reason(schedule, message):
    with pytest.raises(ValueError, match=message):
        BatchAdaptive(schedule=schedule)


def test_bad_tables_from_the_command_line_are_policy_errors():
    with pytest.raises(PolicyError, match=r"batch_adaptive.*overlaps"):
        make_policy("batch_adaptive", {"schedule": "[[1,16,5],[16,32,4]]"})
    with pytest.raises(PolicyError, match="not both"):
        make_policy("batch_adaptive", {"schedule": "[[1,8,2]]", "draft_len_schedule": "{\"1\":2}"})


@pytest.mark.parametrize("b,k", [(1, 4), (4, 4), (5, 2), (8, 2), (9, 1), (32, 1), (33, 0),
                                 (1000, 0)])
def test_tensorrt_llm_draft_len_schedule_up_to(b, k):
    # TensorRT-LLM's llm_args doc: {4:4, 8:2, 32:1} -> 1-4: 4, 5-8: 2, 9-32: 1, 33+: 0
    policy = make_policy("batch_adaptive", {"draft_len_schedule": '{"4": 4, "8": 2, "32": 1}'})
    assert _k(policy, b) == k


@pytest.mark.parametrize("b,k", [(1, 4), (3, 4), (4, 2), (7, 2), (8, 0), (1000, 0)])
def test_tensorrt_llm_draft_len_schedule_at_least(b, k):
    # the earlier form: {1: 4, 4: 2, 8: 0} -> batch >= 1: 4, >= 4: 2, >= 8: 0
    policy = BatchAdaptive(draft_len_schedule={1: 4, 4: 2, 8: 0},
                           draft_len_schedule_form="at_least")
    assert _k(policy, b) == k


@pytest.mark.parametrize("kwargs,message", [
    ({"draft_len_schedule": {2: 4}, "draft_len_schedule_form": "at_least"}, "batch size 1"),
    ({"draft_len_schedule": {0: 4}}, "threshold must be >= 1"),
    ({"draft_len_schedule": {4: -1}}, "draft length must be in"),
    ({"draft_len_schedule": {"four": 4}}, "not a batch size"),
    ({"draft_len_schedule": {4: 4, "4": 2}}, "twice"),
    ({"draft_len_schedule": {}}, "non-empty mapping"),
    ({"draft_len_schedule_form": "below"}, "draft_len_schedule_form"),
    ({"alpha": 1.5}, "alpha"),
    ({"context_tokens": 0}, "context_tokens"),
    ({"max_batch": 0}, "max_batch"),
    ({"disable_by_batch_size": 0}, "disable_by_batch_size"),
])
def test_bad_parameters_are_rejected_with_a_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchAdaptive(**kwargs)


# -- the derived table -----------------------------------------------------------------------

KNEE_COST = LinearCost(target_s=10e-3, draft_s=0.3e-3, per_token_s=2e-6, knee_tokens=128)


def _brute_force_k(cost, b: int, alpha: float, context_tokens: int, k_max: int) -> int:
    per_token = [cost.step_s([k] * b, [context_tokens] * b) / expected_emitted(alpha, k)
                 for k in range(k_max + 1)]
    return int(np.argmin(per_token))


def test_derived_k_falls_as_the_batch_grows_past_the_knee():
    policy = BatchAdaptive(alpha=0.7, max_batch=300)
    ks = [_k(policy, b, k_max=10, cost=KNEE_COST) for b in range(1, 301)]
    assert all(a >= b for a, b in pairwise(ks)), ks
    assert ks[0] > 3 and ks[-1] == 0  # deep speculation alone, none once the knee bites


@pytest.mark.parametrize("b", [1, 7, 20, 43, 64, 100, 150, 200, 300])
def test_derived_table_is_the_brute_force_argmin(b):
    policy = BatchAdaptive(alpha=0.75, context_tokens=512, max_batch=200)
    expected = _brute_force_k(KNEE_COST, min(b, 200), 0.75, 512, 10)  # beyond 200: row 200's k
    assert _k(policy, b, k_max=10, cost=KNEE_COST) == expected


def test_derived_table_scans_past_a_drop():
    # a step-time jump (a CUDA-graph bucket) makes k=2 worse than k=1, k=4 best again: a scan
    # that stopped at the first drop would pick 1
    class Bucketed:
        def step_s(self, ks, contexts):
            return 10e-3 + 0.1e-3 * max(ks) + (8e-3 if max(ks) in (2, 3) else 0.0)

    assert derive_table(Bucketed(), 0.9, 100, 1, 4) == [(1, 1, 4)]


def test_derived_table_merges_runs_and_is_cached_per_cost_model():
    calls = []

    class Counting(LinearCost):
        def step_s(self, ks, contexts):
            calls.append(len(ks))
            return super().step_s(ks, contexts)

    cost = Counting(target_s=10e-3, draft_s=0.3e-3, per_token_s=2e-6, knee_tokens=128)
    policy = BatchAdaptive(max_batch=50)
    _ks(policy, 10, k_max=6, cost=cost)
    assert len(calls) == 50 * 7  # every batch size 1..50, every k 0..6
    for b in (1, 20, 50, 80):
        _ks(policy, b, k_max=6, cost=cost)
    assert len(calls) == 50 * 7
    rows = policy.table(cost, 6)
    assert rows[0][0] == 1 and rows[-1][1] == 50
    assert all(lo == prev_hi + 1 for (_, prev_hi, _), (lo, _, _) in pairwise(rows))
    assert all(k1 != k2 for (_, _, k1), (_, _, k2) in pairwise(rows))
    other = Counting()
    _ks(policy, 10, k_max=6, cost=other)  # another cost model: derived again
    assert len(calls) == 2 * 50 * 7


# -- vLLM V0's disable_by_batch_size ---------------------------------------------------------------

def test_disable_by_batch_size_is_sticky_per_request():
    policy = BatchAdaptive(schedule=[[1, 512, 3]], disable_by_batch_size=3)
    r = [FakeRequest(i) for i in range(5)]

    def ks(*ids):
        return list(policy.choose(context([r[i] for i in ids], k_max=10)))

    assert ks(0, 1) == [3, 3]
    assert ks(0, 1, 2) == [0, 0, 0]  # at the threshold: no speculation for this step's requests
    assert ks(0, 1) == [0, 0]  # ... and never again for them
    assert ks(0, 3) == [0, 3]  # a request that never saw a big batch speculates
    policy.finish(0)
    assert ks(0, 4) == [3, 3]  # state dropped at finish (ids are not reused; this checks the drop)


def test_sticky_disabling_opts_out_of_the_per_batch_fast_path():
    assert type(BatchAdaptive()).stateless_per_batch
    sticky = make_policy("batch_adaptive", {"disable_by_batch_size": "8"})
    assert not type(sticky).stateless_per_batch
    assert sticky.name == "batch_adaptive" and sticky.params()["disable_by_batch_size"] == 8


def _simulate(policy, fast_path: bool, n: int = 120, rate: float = 40.0):
    from simulator import SchedulerConfig, simulate
    from traces import parametric_trace, parse_acceptance

    rng = np.random.default_rng(3)
    wl = workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 300, n),
                  rng.integers(1, 200, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    return simulate(wl, LinearLatency(), trace, policy, 60_000, SchedulerConfig(max_num_seqs=32),
                    fast_path=fast_path)


def test_the_derived_table_gives_the_same_records_on_the_fast_path():
    fast, slow = (_simulate(BatchAdaptive(max_batch=32), f) for f in (True, False))
    assert fast.meta["fast_path"] and not slow.meta["fast_path"]
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=False, rtol=1e-9)
    assert fast.steps["drafted"].sum() > 0


def test_sticky_disabling_in_the_engine():
    res = _simulate(BatchAdaptive(schedule=[[1, 512, 4]], disable_by_batch_size=6), True)
    assert not res.meta["fast_path"]
    steps = res.steps[res.steps["decode_seqs"] > 0]
    big = steps["decode_seqs"] >= 6
    assert big.any() and (steps.loc[big, "drafted"] == 0).all()
    small = steps[~big]
    # below the threshold only requests that never were in a big batch draft: some steps draft
    # fewer than 4 per request, none more
    assert (small["drafted"] <= 4 * small["decode_seqs"]).all()
    assert (small["drafted"] < 4 * small["decode_seqs"]).any()


# -- properties ------------------------------------------------------------------------------------

@st.composite
def _schedules(draw):
    rows, lo = [], 1
    for _ in range(draw(st.integers(1, 6))):
        lo += draw(st.integers(0, 5)) if rows else 0  # maybe a gap
        hi = lo + draw(st.integers(0, 40))
        rows.append([lo, hi, draw(st.integers(0, 64))])
        lo = hi + 1
    return rows


def _reference(schedule, b: int) -> int:
    k = schedule[0][2]
    for lo, _, kk in schedule:
        if lo <= b:
            k = kk
    return k


@settings(max_examples=200, deadline=None)
@given(schedule=_schedules(), b=st.integers(1, 400), k_max=st.integers(0, 12),
       threshold=st.one_of(st.none(), st.integers(1, 400)))
def test_k_within_bounds_for_random_tables(schedule, b, k_max, threshold):
    policy = BatchAdaptive(schedule=schedule, disable_by_batch_size=threshold)
    ks = _ks(policy, b, k_max=k_max)
    assert len(ks) == b and all(isinstance(k, int) and 0 <= k <= k_max for k in ks)
    expected = 0 if threshold is not None and b >= threshold else _reference(schedule, b)
    assert ks == [min(expected, k_max)] * b


@settings(max_examples=100, deadline=None)
@given(thresholds=st.dictionaries(st.integers(1, 300), st.integers(0, 64), min_size=1,
                                  max_size=6),
       b=st.integers(1, 400), k_max=st.integers(0, 12))
def test_k_within_bounds_for_random_draft_len_schedules(thresholds, b, k_max):
    policy = BatchAdaptive(draft_len_schedule=thresholds)
    keys = sorted(thresholds)
    expected = next((thresholds[t] for t in keys if t >= b), 0)  # TensorRT-LLM's bisect_left
    assert _ks(policy, b, k_max=k_max) == [min(expected, k_max)] * b

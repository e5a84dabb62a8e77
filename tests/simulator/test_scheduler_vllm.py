"""`--scheduler vllm-v1`: vLLM V1's rules (docs/vllm-v1-scheduler.md), on hand-computed schedules.

The first tests drive `VllmV1Scheduler` directly, one engine step at a time (schedule, then
the outcomes, the drafts proposed for the next step, the finishes), with 128-token blocks; the
later ones run whole simulations through the replica and the command line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engine import LinearLatency, trace_from_runs, workload

from policies import Policy, make_policy, policy_names
from simulator import ConfigError, SchedulerConfig, simulate
from simulator.config import ServedSchedulerConfig
from simulator.logs import RequestLog
from simulator.replica import check_fits
from simulator.request import RequestState
from simulator.scheduler import scheduler_names
from simulator.scheduler_vllm import BLOCK_SIZE, VllmV1Scheduler
from traces import RequestSpeculation, SpeculationTrace, parametric_trace, parse_acceptance

HUGE = 10**9


def make(budget: int = 1000, blocks: int = 100, max_num_seqs: int = 256, k_max: int = 10,
         n: int = 8, settings_: object | None = None) -> VllmV1Scheduler:
    """A scheduler with `blocks` usable blocks: the user's KV figure counts the null block."""
    config = settings_ or SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=budget,
                                          max_num_seqs=max_num_seqs, k_max=k_max)
    return VllmV1Scheduler(config, (blocks + 1) * BLOCK_SIZE, make_policy("fixed", {"k": 0}),
                           RequestLog(n), cost=None)


def arrive(s: VllmV1Scheduler, index: int, prompt: int, output: int = 100) -> RequestState:
    request = RequestState(index, index, 0.0, prompt, output)
    s.add(request)
    return request


def step(s: VllmV1Scheduler, drafts: dict | None = None, accepted: dict | None = None,
         now: float = 0.0):
    """One engine step: every scheduled draft accepted unless `accepted` says otherwise; each
    request that sampled then proposes drafts[index] (default 0) for the next step."""
    plan = s.schedule(now)
    acc = [(accepted or {}).get(e.request.index, e.drafts) for e in plan.scheduled]
    emitted = s.update_from_output(plan, acc, now + 1.0)
    for entry, emit in zip(plan.scheduled, emitted):
        if emit and not s.finished(entry.request):
            s.propose(entry.request, (drafts or {}).get(entry.request.index, 0))
    s.finish_done(now + 1.0)
    return [(e.request.index, e.tokens, e.drafts, e.prefill) for e in plan.scheduled], emitted


def test_vllm_v1_is_registered_and_defaults_to_vllms_cpu_budget_with_chunking():
    assert "vllm-v1" in scheduler_names()
    config = SchedulerConfig(scheduler="vllm-v1")
    assert config.max_batched_tokens == 2048 and config.chunked_prefill
    assert SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=512).max_batched_tokens == 512
    assert SchedulerConfig().max_batched_tokens is None and not SchedulerConfig().chunked_prefill


def test_the_null_block_is_not_usable():
    s = make(blocks=3)
    assert s.total_blocks == 3 == (4 * BLOCK_SIZE) // BLOCK_SIZE - 1
    assert s.context([], 0.0).kv_capacity_tokens == 3 * BLOCK_SIZE


def test_drafts_are_trimmed_to_the_budget_left_and_later_requests_sit_out():
    s = make(budget=10)
    for i in range(3):
        arrive(s, i, prompt=3)
    assert step(s, drafts={0: 6, 1: 6, 2: 4})[0] == [(0, 3, 0, True), (1, 3, 0, True),
                                                      (2, 3, 0, True)]
    # 0 gets 1 + 6, 1 the 3 left (2 drafts; its other 4 are thrown away), 2 sits the step out
    assert step(s, drafts={0: 0, 1: 0})[0] == [(0, 7, 6, False), (1, 3, 2, False)]
    # 2 kept its place and the 4 drafts proposed at the end of its prefill step
    assert step(s)[0] == [(0, 1, 0, False), (1, 1, 0, False), (2, 5, 4, False)]


def test_a_prompt_longer_than_the_budget_left_is_chunked_and_samples_at_its_last_chunk():
    s = make(budget=16)
    arrive(s, 0, prompt=4)
    step(s, drafts={0: 3})
    b = arrive(s, 1, prompt=40)
    assert step(s, drafts={0: 3}, now=1.0) == ([(0, 4, 3, False), (1, 12, 0, True)], [4, 0])
    assert b.generated == 0 and np.isnan(s.log.first_token_s[1]) and s.log.admitted_s[1] == 1.0
    assert step(s, drafts={0: 3}, now=2.0)[0] == [(0, 4, 3, False), (1, 12, 0, True)]
    assert step(s, drafts={0: 3}, now=3.0)[0] == [(0, 4, 3, False), (1, 12, 0, True)]
    assert step(s, drafts={0: 3, 1: 2}, now=4.0) == ([(0, 4, 3, False), (1, 4, 0, True)], [4, 1])
    assert b.generated == 1 and s.log.first_token_s[1] == 5.0
    # the step after the last chunk already verifies the drafts its prefill step proposed
    assert step(s, now=5.0)[0] == [(0, 4, 3, False), (1, 3, 2, False)]


def test_admission_checks_the_whole_prompt_and_stops_at_the_first_that_does_not_fit():
    s = make(budget=200, blocks=4)
    arrive(s, 0, prompt=200)  # 2 blocks
    step(s)
    arrive(s, 1, prompt=300)  # 3 blocks > 2 free, though its 199-token chunk would fit in 2
    arrive(s, 2, prompt=50)  # 1 block: would fit, but is not tried
    assert step(s)[0] == [(0, 1, 0, False)]
    assert [r.index for r in s.waiting] == [1, 2] and s.free_blocks == 2


def test_the_request_cap_counts_requests_still_prefilling():
    for cap, admitted in ((2, False), (3, True)):
        s = make(budget=50, max_num_seqs=cap)
        arrive(s, 0, prompt=10)
        arrive(s, 1, prompt=60)
        assert step(s)[0] == [(0, 10, 0, True), (1, 40, 0, True)]
        arrive(s, 2, prompt=5)
        planned = step(s)[0]
        assert planned[:2] == [(0, 1, 0, False), (1, 20, 0, True)]  # 29 tokens left over
        assert (planned[2:] == [(2, 5, 0, True)]) is admitted


def test_preemption_takes_the_last_running_request_which_re_prefills_prompt_and_outputs():
    s = make(budget=1000, blocks=3)
    a = arrive(s, 0, prompt=128, output=2)  # 1 block; its second token needs a second one
    b = arrive(s, 1, prompt=200, output=300)  # 2 blocks
    assert step(s)[0] == [(0, 128, 0, True), (1, 200, 0, True)] and s.free_blocks == 0
    arrive(s, 2, prompt=10)  # one free block after the preemption would hold it
    planned, _ = step(s, now=1.0)
    assert planned == [(0, 1, 0, False)]  # b was preempted, and nothing was admitted
    assert [r.index for r in s.waiting] == [1, 2] and s.preemptions == 1
    assert s._seq[1].computed == 0 and s._seq[1].blocks == 0 and b.generated == 1
    assert a.generated == 2 and s.free_blocks == 3  # a finished: its 2 blocks are back
    plan = s.schedule(2.0)  # b re-prefills its prompt and the token it had generated
    assert [(e.request.index, e.tokens, e.prefill, e.resumed) for e in plan.scheduled] == [
        (1, 201, True, True), (2, 10, True, False)]
    emitted = s.update_from_output(plan, [0, 0], 3.0)
    assert emitted == [1, 1] and b.generated == 2 and s.log.admitted_s[1] == 0.0


def test_a_request_that_preempts_itself_is_not_readmitted_in_the_same_step():
    s = make(budget=1000, blocks=3)
    arrive(s, 0, prompt=128)
    v = arrive(s, 1, prompt=100)
    step(s, drafts={1: 60})  # 1 block each
    # 0 takes the last free block; 1's 1 + 60 tokens need a second one: it is the last running
    # request, so it preempts itself. The 1 block it frees would hold its 101 tokens, but a step
    # that preempted admits nothing
    assert step(s, now=1.0)[0] == [(0, 1, 0, False)]
    assert [r.index for r in s.waiting] == [1] and s.free_blocks == 1 and v.generated == 1
    assert step(s, now=2.0)[0] == [(0, 1, 0, False), (1, 101, 0, True)]


def test_several_preemptions_keep_their_admission_order_at_the_front_of_the_queue():
    s = make(budget=1000, blocks=4)
    for i in range(4):
        arrive(s, i, prompt=128)  # 1 block each; the first decode step needs a second one
    arrive(s, 4, prompt=5)
    step(s)
    # 0 takes 3's block, 1 takes 2's: popped 3 then 2, so 2 ends up first
    assert step(s)[0] == [(0, 1, 0, False), (1, 1, 0, False)]
    assert [r.index for r in s.waiting] == [2, 3, 4] and s.preemptions == 2


def test_blocks_freed_by_a_finish_are_free_from_the_next_step_on():
    s = make(budget=1000, blocks=2)
    arrive(s, 0, prompt=100, output=2)
    arrive(s, 1, prompt=200)  # 2 blocks: waits while 0 holds one
    assert step(s)[0] == [(0, 100, 0, True)]
    assert step(s, now=1.0)[0] == [(0, 1, 0, False)]  # 0 finishes at the end of this step
    assert s.free_blocks == 2 and not s.running
    assert step(s, now=2.0)[0] == [(1, 200, 0, True)]


def test_rejected_drafts_roll_back_computed_tokens_but_keep_their_blocks():
    s = make(budget=1000, blocks=10)
    arrive(s, 0, prompt=100)
    step(s, drafts={0: 60})
    assert step(s, accepted={0: 2})[1] == [3]  # 101 + 60 drafts written: 2 blocks
    assert s._seq[0].computed == 103 and s._seq[0].blocks == 2
    assert s._seq[0].computed == s.running[0].prompt_tokens + s.running[0].generated - 1


@dataclass
class WithMaxModelLen:
    """Settings with vLLM's max_model_len, which SchedulerConfig does not carry."""

    scheduler: str = "vllm-v1"
    max_num_seqs: int = 8
    max_batched_tokens: int | None = 1000
    k_max: int = 10
    max_model_len: int = 20


def test_max_model_len_caps_drafts_and_stops_the_request():
    s = make(settings_=WithMaxModelLen())
    r = arrive(s, 0, prompt=10, output=100)
    step(s, drafts={0: 10})  # N = 11: at most 20 - 11 = 9 proposed
    assert s._seq[0].spec == 9
    assert step(s, drafts={0: 10}, accepted={0: 6}) == ([(0, 9, 8, False)], [7])
    assert r.generated == 8 and s._seq[0].spec == 2  # N = 18: 2 proposed, 1 scheduled
    assert step(s)[0] == [(0, 2, 1, False)]
    assert r.generated == 10 and s.finished(r) and not s.running


def test_the_drafter_runs_only_while_every_request_of_the_step_stays_k_clear_of_max_model_len():
    s = make(settings_=WithMaxModelLen(k_max=4))  # max_model_len 20
    arrive(s, 0, prompt=16)
    assert s.drafter_runs(s.schedule(0.0))  # C + n = 16, + K = 20: fits
    s = make(settings_=WithMaxModelLen(k_max=4))
    arrive(s, 0, prompt=3)
    arrive(s, 1, prompt=17)
    assert not s.drafter_runs(s.schedule(0.0))  # 17 + 4 > 20: for the whole step
    s = make(settings_=WithMaxModelLen(k_max=0))
    arrive(s, 0, prompt=19)
    assert s.drafter_runs(s.schedule(0.0))  # no speculation, no drafter to stop
    s = make(k_max=4)
    arrive(s, 0, prompt=10**6)
    assert s.drafter_runs(s.schedule(0.0))  # no max_model_len: no limit


# -- whole simulations --------------------------------------------------------------------------


@dataclass
class ByStep(Policy):
    """k by the step it is chosen in."""

    name: ClassVar[str] = "by-step-test"
    ks: tuple = (2, 1, 3, 0, 4)

    def choose(self, ctx):
        return [self.ks[ctx.step_index % len(self.ks)]] * len(ctx.requests)


def batch_recorder(seen: list, table: list) -> Policy:
    """`batch_adaptive` with `table`, appending (step, batch size) of every choice to `seen`
    (shared through the closure: engines deep-copy policies)."""
    inner = make_policy("batch_adaptive", {"schedule": table})

    class Recorder(Policy):
        name: ClassVar[str] = "batch-recorder-test"

        def choose(self, ctx):
            seen.append((ctx.step_index, len(ctx.requests)))
            return inner.choose(ctx)

    return Recorder()


def _vllm(wl, trace, policy, kv=HUGE, **config):
    config.setdefault("max_batched_tokens", HUGE)
    return simulate(wl, LinearLatency(), trace, policy, kv,
                    SchedulerConfig(scheduler="vllm-v1", **config))


def test_drafts_proposed_at_the_end_of_a_step_are_verified_in_the_next():
    wl = workload([0.0], [10], [12])
    res = _vllm(wl, trace_from_runs([[9] * 12]), ByStep())
    steps = res.steps
    # the k chosen in step t (2, 1, 3, 0, 4) is drafted in step t + 1; the first decode drafts
    assert steps["prefill_seqs"].tolist() == [1, 0, 0, 0, 0, 0]
    assert steps["drafted"].tolist() == [0, 2, 1, 3, 0, 4]
    assert steps["emitted"].tolist() == [0, 3, 2, 4, 1, 1]  # the last cut at 12 tokens
    assert res.requests.loc[0, ["steps", "drafted", "accepted"]].tolist() == [5, 10, 6]


def test_a_request_near_max_model_len_gives_everyone_zero_drafts_for_a_step():
    """Doc 5.3, by hand (K = k = 2, every real draft accepted): A (10 + 12) and B (44 +
    10, stopped by max_model_len 50) prefill in step 0. Step 1 verifies 2 drafts each; B
    reaches N = 48. Step 2: B is cut to 1 draft (n <= 50 - C - 1) and reaches C + n = 49,
    49 + K > 50, so the proposer does not run: A, going on, gets 2 zero drafts, which step 3
    verifies and rejects (emit 1). Then A drafts for real again."""
    wl = workload([0.0, 0.0], [10, 44], [12, 10])
    trace = trace_from_runs([[9] * 12, [9] * 10])
    res = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 2}), HUGE,
                   ServedSchedulerConfig(scheduler="vllm-v1", max_batched_tokens=HUGE, k_max=2,
                                         max_model_len=50))
    assert res.steps["drafted"].tolist() == [0, 4, 3, 2, 2, 2]
    assert res.steps["accepted"].tolist() == [0, 4, 3, 0, 2, 0]
    assert res.steps["emitted"].tolist() == [0, 6, 5, 1, 3, 1]
    assert res.requests[["steps", "drafted", "accepted"]].values.tolist() == [[5, 10, 6],
                                                                              [2, 3, 3]]
    roomy = simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": 2}), HUGE,
                     ServedSchedulerConfig(scheduler="vllm-v1", max_batched_tokens=HUGE,
                                           k_max=2, max_model_len=60))
    assert roomy.requests.loc[0, ["steps", "accepted"]].tolist() == [4, 7]  # no zero drafts


def test_the_ngram_lookup_caps_the_drafts_at_the_position_they_start_from():
    proposable = np.array([0, 2, 0, 0, 1, 5, 0, 0, 0, 0], dtype=np.float32)
    trace = SpeculationTrace((RequestSpeculation(run=np.full(10, 9, dtype=np.int32),
                                                 proposable=proposable),),
                             meta={"source": "test", "parametric": False})
    res = _vllm(workload([0.0], [10], [10]), trace, make_policy("fixed", {"k": 4}))
    # generated 1: 2 drafts (emit 3); 4: 1 draft (emit 2); 6, 7, 8, 9: none
    assert res.steps["drafted"].tolist() == [0, 2, 1, 0, 0, 0, 0]
    assert res.steps["emitted"].tolist() == [0, 3, 2, 1, 1, 1, 1]


def test_a_batch_size_table_is_read_at_the_count_of_every_request_a_step_schedules():
    table = [[1, 1, 3], [2, 2, 2], [3, 64, 1]]
    k_of = {1: 3, 2: 2}
    seen: list = []
    rng = np.random.default_rng(3)
    n = 16
    wl = workload(np.cumsum(rng.exponential(0.02, n)), rng.integers(5, 60, n),
                  rng.integers(5, 40, n))
    trace = parametric_trace(parse_acceptance("iid:0.9"), wl.output_tokens, rng)
    steps = _vllm(wl, trace, batch_recorder(seen, table)).steps
    sizes = [size for _, size in seen]
    assert [t for t, _ in seen] == list(range(len(steps)))
    assert sizes == (steps["decode_seqs"] + steps["prefill_seqs"]).tolist()
    decode, drafted, prefill = (steps[c].to_numpy() for c in
                                ("decode_seqs", "drafted", "prefill_seqs"))
    # with room for all, every decode of step t + 1 sampled in step t and drafts its table k
    for t in range(len(steps) - 1):
        assert drafted[t + 1] == decode[t + 1] * k_of.get(sizes[t], 1)
    assert any(prefill[t] and decode[t] and decode[t + 1] for t in range(len(steps) - 1))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), k=st.sampled_from([0, 3]), cap=st.sampled_from([2, 8, 256]))
def test_with_room_for_everything_vllm_v1_keeps_fcfs_reserves_records(seed, k, cap):
    """Huge budget and KV: nothing is trimmed, chunked or preempted, so vLLM's draft timing
    (proposed a step early, with the same k and proposal) gives fcfs-reserve's records."""
    rng = np.random.default_rng(seed)
    n = 25
    wl = workload(np.cumsum(rng.exponential(0.01, n)), rng.integers(1, 300, n),
                  rng.integers(1, 80, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    fcfs, v1 = (simulate(wl, LinearLatency(), trace, make_policy("fixed", {"k": k}), HUGE,
                         SchedulerConfig(scheduler=name, max_batched_tokens=HUGE,
                                         chunked_prefill=True, max_num_seqs=cap))
                for name in ("fcfs-reserve", "vllm-v1"))
    assert (v1.requests["finish_s"].notna()).all()
    assert (v1.requests["output_tokens"] == fcfs.requests["output_tokens"]).all()
    pd.testing.assert_frame_equal(fcfs.requests, v1.requests)
    pd.testing.assert_frame_equal(fcfs.steps.drop(columns="kv_used_tokens"),
                                  v1.steps.drop(columns="kv_used_tokens"))


def test_a_small_kv_cache_preempts_and_every_request_still_finishes():
    rng = np.random.default_rng(5)
    n = 40
    wl = workload(np.cumsum(rng.exponential(0.005, n)), rng.integers(50, 400, n),
                  rng.integers(50, 300, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    kv = 12 * BLOCK_SIZE  # 11 usable blocks
    res = _vllm(wl, trace, make_policy("fixed", {"k": 4}), kv, max_batched_tokens=256,
                max_num_seqs=16, k_max=4)
    steps, reqs = res.steps, res.requests
    assert reqs["finish_s"].notna().all()
    assert steps["kv_used_tokens"].max() <= 11 * BLOCK_SIZE
    assert (steps["prefill_tokens"] + steps["decode_seqs"] + steps["drafted"]).max() <= 256
    # re-prefills of prompt + outputs: more prompt-chunk tokens than the prompts hold
    assert steps["prefill_tokens"].sum() > wl.prompt_tokens.sum()
    assert (reqs["steps"] + 1 <= reqs["output_tokens"]).all()


def test_a_request_that_cannot_fit_alone_is_refused_up_front():
    config = SchedulerConfig(scheduler="vllm-v1", k_max=0)
    kv = 3 * BLOCK_SIZE  # 2 usable blocks: 256 tokens
    check_fits([7], [200], [57], config, kv)  # 200 + 57 - 1 = 256
    with pytest.raises(ConfigError, match="request 7 can need 3 KV blocks"):
        check_fits([7], [200], [58], config, kv)
    with pytest.raises(ConfigError, match="null block"):
        check_fits([7], [1], [1], config, BLOCK_SIZE)


def test_spectune_simulate_runs_vllm_v1(capsys, tmp_path):
    from spectune.cli import main

    out = tmp_path / "run"
    assert main(["simulate", "--scheduler", "vllm-v1", "--requests", "60", "--format", "json",
                 "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    scheduler = summary["inputs"]["scheduler"]
    assert (scheduler["scheduler"], scheduler["max_batched_tokens"],
            scheduler["chunked_prefill"]) == ("vllm-v1", 2048, True)
    assert summary["inputs"]["fast_path"] is True  # its plain decode steps, as segments
    assert summary["requests"] == 60 and summary["unfinished_requests"] == 0
    steps = pd.read_csv(out / "steps.csv")
    assert (steps["prefill_tokens"] + steps["decode_seqs"] + steps["drafted"]).max() <= 2048


def test_the_live_engine_refuses_vllm_v1():
    pytest.importorskip("torch")
    from live.engine import LiveEngine

    with pytest.raises(ConfigError, match="'vllm-v1' is simulation only"):
        LiveEngine(None, None, make_policy("fixed", {"k": 2}),
                   SchedulerConfig(scheduler="vllm-v1"), kv_capacity_tokens=10_000)


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_runs_under_vllm_v1_with_preemption(name):
    rng = np.random.default_rng(8)
    n = 30
    wl = workload(np.cumsum(rng.exponential(0.005, n)), rng.integers(50, 300, n),
                  rng.integers(20, 150, n))
    trace = parametric_trace(parse_acceptance("beta:4,2"), wl.output_tokens, rng)
    res = simulate(wl, LinearLatency(), trace, make_policy(name), 12 * BLOCK_SIZE,
                   SchedulerConfig(scheduler="vllm-v1", max_batched_tokens=256, max_num_seqs=8,
                                   k_max=8))
    assert res.requests["finish_s"].notna().all()
    steps = res.steps
    assert (steps["prefill_tokens"] + steps["decode_seqs"] + steps["drafted"]).max() <= 256
    assert steps["prefill_tokens"].sum() > wl.prompt_tokens.sum()  # something re-prefilled

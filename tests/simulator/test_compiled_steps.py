"""`auto`'s and kld_variance's decode steps run many at a time in one compiled loop
(simulator/stepped.py): the same records, to the bit, as stepping them one at a time through
`Replica._mixed_iteration` with the same compiled loops (and so, tests/policies/
test_auto_compiled.py, as numpy), on every acceptance source, with the drafter's caps, several
replicas, admission held by the batch size, chunked prefill, step records kept or not, the
policies' parameters moved; runs that end at every window or after a step or two; kld_variance's
pieces (its warm-up bounds, its next k, Python's rounding) against its Python; and the step
path where the compiled loop does not stand for it."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest
from support.preemptions import counted_preemptions

from policies import make_policy
from policies.auto import Auto
from policies.kld_variance import KldVariance
from simulator import ClusterConfig, SchedulerConfig, simulate, stepped
from simulator import replica as replica_module
from simulator.replica import Replica
from spectune.simulate import SimulationSpec, build_inputs

pytest.importorskip("numba")


def _run(spec: SimulationSpec, scheduler: SchedulerConfig, params: dict, replicas: int,
         keep_steps: bool = True, latency=None, policy: str = "auto", trace=None):
    inputs = build_inputs(spec, {}, scheduler)
    acceptance = inputs.acceptance if trace is None else trace(inputs.workload)
    return simulate(inputs.workload, latency or inputs.latency, acceptance,
                    make_policy(policy, params), inputs.kv_capacity_tokens, scheduler,
                    ClusterConfig(replicas), keep_steps=keep_steps)


def _both(monkeypatch, loops, spec, scheduler=None, params=None, replicas=1, keep_steps=True,
          latency=None, policy="auto", trace=None):
    """The run through compiled runs of steps, and stepped one at a time; how many runs of
    steps the first took, and how many steps it took one at a time. After every run of steps,
    and every step the first took one at a time, the policy's fit (its counts, and each of the
    batch's requests' state) is checked against the step path's after the same step, to the
    bit."""
    loops(True)
    scheduler = scheduler or SchedulerConfig(max_num_seqs=24)
    runs, mixed = [], []
    compiled_steps = Replica._compiled_steps
    # (a step taken one at a time: vLLM's engine step under its scheduler)
    stepper = ("_planned_iteration" if scheduler.scheduler == "vllm-v1"
               else "_mixed_iteration")
    step_one = getattr(Replica, stepper)
    after_runs, after_steps = {}, {}  # (replica, step index) -> the fit of these requests

    def counted(self):
        ids = [request.request_id for request in self.scheduler.running]
        stepped_before = len(mixed)
        yield from compiled_steps(self)
        if len(mixed) == stepped_before:  # (else vLLM's first step did not fit: stepped)
            runs.append(len(ids))
        after_runs[self.index, self.scheduler.step_index] = _learnt(self.policy, ids)

    def one(self, *args, **kwargs):
        ids = [request.request_id for request in self.scheduler.running]
        mixed.append(1)
        yield from step_one(self, *args, **kwargs)
        after_steps[self.index, self.scheduler.step_index] = _learnt(self.policy, ids)
    monkeypatch.setattr(Replica, "_compiled_steps", counted)
    monkeypatch.setattr(Replica, stepper, one)
    fast = _run(spec, scheduler, params or {}, replicas, keep_steps, latency, policy, trace)
    taken, one_at_a_time = len(runs), len(mixed)
    monkeypatch.setattr(replica_module, "steps_at_once", lambda *args: False)
    # (and after every step the first took one at a time, its policy part compiled or not)
    after_fast = {**after_steps, **after_runs}
    after_steps.clear()
    slow = _run(spec, scheduler, params or {}, replicas, keep_steps, latency, policy, trace)
    for at, fit in after_fast.items():
        counts, states = fit
        slow_counts, slow_states = after_steps[at]
        assert counts == slow_counts and states.items() <= slow_states.items(), at
    return fast, slow, taken, one_at_a_time


def _counted(monkeypatch, name: str) -> list:
    """Each call of the replica's `name` (one of simulator/stepped.py's), counted."""
    calls = []
    original = getattr(replica_module, name)

    def counted(*args):
        calls.append(1)
        return original(*args)
    monkeypatch.setattr(replica_module, name, counted)
    return calls


def _learnt(policy, ids) -> tuple:
    """A policy's fit after a step: auto's counts as bits and each of these requests' state,
    accepted and expected drafts (bits); kld_variance's each request's state, wherever it is
    kept (a row or a `_Request`; none yet: its k_init)."""
    import numpy as np

    bits = np.float64
    if isinstance(policy, KldVariance):
        return (), {rid: _kld_state(policy, rid) for rid in ids}
    return (tuple(count.tobytes() for count in policy.counts()),
            {rid: (state, bits(observed).tobytes(), bits(expected).tobytes())
             for rid in ids for state, observed, expected in [policy.state_of(rid)]})


def _kld_state(policy: KldVariance, rid: int) -> tuple:
    import numpy as np

    rows, st = policy._rows, policy._requests.get(rid)
    if st is None and rows is not None and rid in rows.row_of:
        r = rows.row_of[rid]
        ready, count = bool(rows.ready[r]), int(rows.warm_count[r])
        return (int(rows.k[r]), (int(rows.k_min[r]), int(rows.k_max[r])) if ready else None,
                rows.history[r, :rows.history_len[r]].tobytes(),
                rows.warm_kl[r, :rows.warm_kl_len[r]].tobytes(), count,
                int(rows.warm_most[r]) if count else 0)
    if st is None:
        return (policy.k_init, None, b"", b"", 0, 0)
    return (st.k, st.bounds, np.array(st.history, dtype=np.float64).tobytes(),
            np.array(st.warm_kl, dtype=np.float64).tobytes(), len(st.warm_accepted),
            max(st.warm_accepted, default=0))


def _same(fast, slow) -> None:
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert fast.totals == slow.totals


CASES = [("smollm2-ngram", "H100-SXM", 1, {}), ("smollm2-eagle-ngram", "A100-80GB", 3, {}),
         ("beta:7,3~20", "H100-SXM", 1, {}), ("beta:3.5,6.5~20", "A100-80GB", 2, {}),
         ("iid:0.7", "H100-SXM", 1, {"k_max": "4", "prior_alpha": "0.3"}),
         ("iid:0.9", "H100-SXM", 1, {}),  # few requests new or cold: the least state fresh
         ("smollm2-ngram", "A100-80GB", 1, {"k0_bonus": "1.3", "stop_slack": "1.0",
                                            "prior_weight": "2"})]


@pytest.mark.parametrize("acceptance,gpu,replicas,params", CASES,
                         ids=[f"{a}-{g}-{r}-" + (",".join(p) or "default")
                              for a, g, r, p in CASES])
def test_compiled_runs_of_steps_give_the_step_paths_records(monkeypatch, loops, acceptance, gpu,
                                                           replicas, params):
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=160, lengths="azure-conv",
                          acceptance=acceptance, draft="none", hardware=gpu, seed=4)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, params=params,
                                            replicas=replicas)
    decode_steps = int((fast.steps["decode_seqs"] > 0).sum())
    assert one_at_a_time == 0 and 0 < runs < decode_steps  # every decode step in runs
    _same(fast, slow)


DRAFT_CASES = [("beta:7,3~20", "bonus", 1, None), ("smollm2-ngram", "committed", 1, None),
               ("smollm2-eagle-ngram", "one", 2, None), ("beta:3.5,6.5~20", "bonus", 3, None),
               ("beta:7,3~20", "bonus", 1, 0.1), ("smollm2-ngram", "committed", 2, 0.1)]


@pytest.mark.parametrize("acceptance,catch_up,replicas,flops", DRAFT_CASES,
                         ids=[f"{a}-{c}-{r}-{f or 'default'}" for a, c, r, f in DRAFT_CASES])
def test_auto_with_a_draft_models_chain(monkeypatch, loops, acceptance, catch_up, replicas,
                                        flops):
    """A draft model's passes in every step's time, each request's first pass feeding its
    catch-up (every rule), and auto's alternatives priced as their ks; with the n-gram
    recording's caps too. `flops`: a larger draft (Qwen2.5-0.5B) on a roofline at that flops
    efficiency, under load, where the first draft pass is compute-bound and what it feeds
    prices it (with Llama-68M at the defaults it does not)."""
    spec = SimulationSpec(workload="poisson", rate=30.0 if flops else 12.0, requests=160,
                          lengths="azure-conv", acceptance=acceptance, draft="Llama-68M",
                          seed=4)
    latency = (_roofline(flops_efficiency=flops, draft="Qwen2.5-0.5B") if flops
               else build_inputs(spec, {}, SchedulerConfig()).latency)
    latency.draft_catch_up = catch_up
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, replicas=replicas,
                                            latency=latency,
                                            scheduler=SchedulerConfig(max_num_seqs=64))
    assert runs and not one_at_a_time and fast.steps.drafted.sum() > 1000
    _same(fast, slow)


def test_compute_bound_steps(monkeypatch, loops):
    """A roofline whose verify passes are compute-bound: the causal pairs price each step and
    each draft total."""
    spec = SimulationSpec(workload="poisson", rate=6.0, requests=120, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=7)
    latency = _roofline(flops_efficiency=0.001)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, latency=latency)
    assert runs
    _same(fast, slow)


KLD_CASES = [("beta:7,3~20", 1, {}), ("beta:3.5,6.5~20", 3, {"cap": "false"}),
             ("iid:0.6", 1, {"activation_tokens": "12", "k_max_cfg": "8", "decay": "0.8"}),
             ("beta:7,3~20", 2, {"activation_tokens": "1", "k_init": "0", "k_min_cfg": "0"}),
             ("beta:5,3~20", 1, {"activation_tokens": "128", "temperature": "0.7",
                                 "alpha": "1.0", "k_min_cfg": "2"})]


@pytest.mark.parametrize("acceptance,replicas,params", KLD_CASES,
                         ids=[f"{a}-{r}-" + (",".join(p) or "default")
                              for a, r, p in KLD_CASES])
def test_kld_variances_runs_of_steps_give_the_step_paths_records(monkeypatch, loops, acceptance,
                                                                replicas, params):
    """Warm-ups of one value to the longest compiled history, the batch cap off, a
    temperature, a k of 0 at first."""
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=160, lengths="azure-conv",
                          acceptance=acceptance, draft="none", seed=4)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, params=params,
                                            replicas=replicas, policy="kld_variance")
    assert one_at_a_time == 0 and runs
    _same(fast, slow)


def _capped_with_signals(workload):
    """beta:7,3~20 with every signal, and a drafter's cap of 0..5 drafts per position (the
    runs cut to it): a proposer that runs out, as an n-gram lookup does, and reads KL."""
    import dataclasses

    import numpy as np

    from traces import SpeculationTrace, parametric_trace, parse_acceptance

    rng = np.random.default_rng(9)
    base = parametric_trace(parse_acceptance("beta:7,3~20"), workload.output_tokens, rng)
    capped = []
    for record in base.requests:
        cap = rng.integers(0, 6, len(record.run))
        capped.append(dataclasses.replace(record, run=np.minimum(record.run, cap),
                                          proposable=cap))
    return SpeculationTrace(tuple(capped), {"source": "test: capped, with signals",
                                            "parametric": True})


@pytest.mark.parametrize("policy", ["auto", "kld_variance"])
def test_a_drafters_caps_with_every_signal(monkeypatch, loops, policy):
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=120, lengths="azure-conv",
                          acceptance="beta:7,3~20", draft="none", seed=2)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, policy=policy,
                                            trace=_capped_with_signals)
    decode = fast.steps.loc[fast.steps.decode_seqs > 0]
    assert runs and not one_at_a_time and (decode.max_k < 5).any()
    _same(fast, slow)


def test_kld_variance_steps_one_at_a_time_where_its_history_is_too_long_to_compile(
        monkeypatch, loops):
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=40, lengths="azure-conv",
                          acceptance="beta:7,3~20", draft="none", seed=4)
    _, _, runs, one_at_a_time = _both(monkeypatch, loops, spec, policy="kld_variance",
                                      params={"activation_tokens": "129"})
    assert runs == 0 and one_at_a_time


def test_kld_variances_pieces_are_its_python(loops):
    """Its warm-up bounds, its next k and Python's round, on random inputs (the bounds' and
    rounding's ties among them)."""
    import numpy as np

    from policies.kld_variance import dsl_step, warmup_bounds
    from simulator.compiled_steps import _dsl_step, _round_half_even, _warmup_bounds

    loops(True)
    for x in (0.5, 1.5, 2.5, 3.5, 2.4999999999999996, 7.0, 0.0, 12.500000000000002):
        assert _round_half_even(x) == round(x)
    rng = np.random.default_rng(11)
    for _ in range(2000):
        n = int(rng.integers(0, 40))
        kls = np.where(rng.random(n) < 0.2, 0.0, rng.exponential(rng.choice([0.01, 1, 30]), n))
        accepted = rng.integers(0, 12, size=int(rng.integers(0, 6))).tolist()
        k_min_cfg = int(rng.integers(0, 4))
        k_max_cfg = int(rng.integers(k_min_cfg, 21))
        row = np.zeros(64)
        row[:n] = kls
        assert _warmup_bounds(len(accepted), max(accepted, default=0), row, n, k_min_cfg,
                              k_max_cfg) == warmup_bounds(accepted, kls.tolist(), k_min_cfg,
                                                          k_max_cfg)
        ratio = float(rng.choice([0.0, rng.exponential(2.0), 20.0]))
        mean_kl, alpha = float(rng.exponential(0.5)), float(rng.uniform(0.5, 4.0))
        temperature = float(rng.choice([0.0, 1e-9, 0.7]))
        k_min, k_max = sorted(int(v) for v in rng.integers(0, 21, size=2))
        assert (_dsl_step(ratio, mean_kl, k_min, k_max, alpha, temperature)
                == dsl_step(ratio, mean_kl, k_min, k_max, alpha, temperature))


def test_kld_variance_states_move_between_rows_and_objects():
    """A state taken out of its row is the one put in (the warm-up's accepted counts as
    their count and largest), and a finished request's row is freed for the next."""
    from collections import deque

    from policies.kld_variance import RequestRows, _Request

    rows = RequestRows(width=5, rows=1)
    states = {7: _Request(3, deque([0.5, 0.25], maxlen=5), [2, 4, 1], [0.5, 0.25]),
              8: _Request(2, deque([0.1] * 5, maxlen=5), [], [], (1, 6))}
    at = rows.rows(states, [7, 8, 9], k_init=4)
    assert not states and sorted(at.tolist()) == [0, 1, 2]  # (grown past its one row)
    back = rows.take(7, 5)
    assert (back.k, list(back.history), back.history.maxlen, back.warm_kl, back.bounds,
            len(back.warm_accepted), max(back.warm_accepted)) == (3, [0.5, 0.25], 5,
                                                                    [0.5, 0.25], None, 3, 4)
    assert rows.take(8, 5).bounds == (1, 6) and rows.take(9, 5).k == 4
    rows.drop(10)  # (no row: nothing to free)
    size = len(rows.k)
    assert rows.rows({}, [11], k_init=1)[0] in at and len(rows.k) == size


def test_the_same_totals_where_no_step_records_are_kept(monkeypatch, loops):
    spec = SimulationSpec(workload="poisson", rate=16.0, requests=160, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=6)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, keep_steps=False)
    assert runs and fast.steps.empty
    _same(fast, slow)


@pytest.mark.parametrize("store_tokens,max_steps", [(16, stepped.MAX_STEPS), (1 << 15, 1),
                                                    (700, 3)])
def test_runs_cut_after_a_step_or_three_and_a_store_that_fills(monkeypatch, loops, store_tokens,
                                                              max_steps):
    """Runs of one step or three (the next goes on from there), and a store of the requests'
    traces so small that it fills, moves the live traces and grows again and again: the same
    records."""
    monkeypatch.setattr(stepped, "STORE_TOKENS", store_tokens)
    monkeypatch.setattr(stepped, "MAX_STEPS", max_steps)
    made = []
    room = stepped.TraceStore._make_room

    def counted(self, n):
        made.append(n)
        return room(self, n)
    monkeypatch.setattr(stepped.TraceStore, "_make_room", counted)
    spec = SimulationSpec(workload="poisson", rate=2.0, requests=60, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=8)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, params={"k_max": "8"})
    decode_steps = int((fast.steps["decode_seqs"] > 0).sum())
    if max_steps == 1:
        assert runs == decode_steps
    elif max_steps == 3:  # at light load most runs end at their length, not an event
        assert runs > decode_steps / 4
    assert len(made) >= (5 if store_tokens < 100 else 1 if store_tokens < 1000 else 0)
    _same(fast, slow)


def test_admission_held_by_the_batch_size_and_the_kv_cache(monkeypatch, loops):
    """Requests wait past arrivals (a full batch, a tight KV cache): runs end at finishes."""
    spec = SimulationSpec(workload="poisson", rate=30.0, requests=150, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=3)
    scheduler = SchedulerConfig(max_num_seqs=12, kv_capacity_tokens=9000)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, scheduler=scheduler)
    assert runs and fast.steps["waiting"].max() > 0
    _same(fast, slow)


class _Subclass(Auto):
    name = "auto-subclass-for-a-test"


@pytest.mark.parametrize("policy,budget,replicas,draft", [
    ("auto", 2048, 1, "none"), ("auto", 256, 2, "none"), ("auto", 1024, 2, "Llama-68M"),
    ("kld_variance", 2048, 1, "none"), ("kld_variance", 256, 2, "none")])
def test_chunked_prefills_steps_with_no_prompt_to_chunk(monkeypatch, loops, policy, budget,
                                                       replicas, draft):
    """Under chunked prefill the steps with no prompt to chunk run at once, the others one at
    a time: the same records, with either budget (a small one chunks a prompt over several
    steps; kld_variance's states move out of their rows for those steps, and back; auto's
    steps with prompt chunks have their ks, verification and fit compiled, with a draft model
    too)."""
    spec = SimulationSpec(workload="poisson", rate=14.0, requests=160, lengths="azure-conv",
                          acceptance="smollm2-ngram" if policy == "auto" else "beta:7,3~20",
                          draft=draft, seed=5)
    scheduler = SchedulerConfig(max_num_seqs=24, chunked_prefill=True, max_batched_tokens=budget)
    chosen, verified = [], []
    choose, verify = replica_module.choose_once, replica_module.verify_once

    def counted(*args):
        chosen.append(1)
        return choose(*args)

    def told(*args):
        verified.append(1)
        return verify(*args)
    monkeypatch.setattr(replica_module, "choose_once", counted)
    monkeypatch.setattr(replica_module, "verify_once", told)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, scheduler=scheduler,
                                            replicas=replicas, policy=policy)
    with_chunks = int((fast.steps["prefill_seqs"] > 0).sum())
    assert runs and one_at_a_time >= with_chunks > 0
    # auto's steps with prompt chunks have their ks compiled (`choose_once`); kld_variance's not
    decoding = int(((fast.steps["prefill_seqs"] > 0) & (fast.steps["decode_seqs"] > 0)).sum())
    assert len(chosen) == len(verified) == (decoding if policy == "auto" else 0) and decoding
    _same(fast, slow)


VLLM_CASES = [  # (policy, acceptance, lengths, rate, draft, replicas, the scheduler's settings)
    ("auto", "smollm2-ngram", "azure-conv", 12.0, "none", 1, {}),
    ("auto", "smollm2-eagle-ngram", "azure-conv", 20.0, "none", 3, {}),
    ("auto", "beta:7,3~20", "azure-conv", 8.0, "Llama-68M", 1, {}),
    ("auto", "beta:7,3~20", "azure-conv", 10.0, "none", 1, {"kv_capacity_tokens": 8000}),
    ("auto", "beta:7,3~20", "fixed:200,300", 4.0, "none", 1, {"kv_capacity_tokens": 3000}),
    ("auto", "smollm2-eagle-ngram", "fixed:20,300", 4.0, "none", 1, {"max_batched_tokens": 60}),
    ("auto", "smollm2-ngram", "azure-conv", 20.0, "none", 2, {"max_num_seqs": 16}),
    ("kld_variance", "beta:7,3~20", "azure-conv", 12.0, "none", 1, {}),
    ("kld_variance", "beta:3.5,6.5~20", "azure-conv", 20.0, "none", 3, {}),
    ("kld_variance", "beta:7,3~20", "azure-conv", 10.0, "none", 1, {"kv_capacity_tokens": 8000}),
    ("kld_variance", "beta:9,1~20", "fixed:20,300", 4.0, "none", 1, {"max_batched_tokens": 40}),
]


@pytest.mark.parametrize("policy,acceptance,lengths,rate,draft,replicas,settings", VLLM_CASES,
                         ids=[f"{p}-{a}-{lg}-{r}-{d}-{n}-" + (",".join(s) or "default")
                              for p, a, lg, r, d, n, s in VLLM_CASES])
def test_vllms_engine_steps_in_runs(monkeypatch, loops, policy, acceptance, lengths, rate, draft,
                                    replicas, settings):
    """auto and kld_variance under vLLM's scheduler: a steady batch's engine steps (each
    verifying the drafts proposed at the last one's end) run at once, up to the first that the
    budget would trim or the free blocks could not hold (preempting); the others, with prompt
    chunks, one at a time, their choice, the fit of their outcomes and their proposals
    compiled: the same records, the KV blocks of every step among them. With a tight KV cache
    and a small budget, runs end at both (and a run whose first step does not fit is
    stepped)."""
    from simulator import compiled_steps

    ends = []
    name = "auto_steps" if policy == "auto" else "kld_steps"
    kernel = getattr(compiled_steps, name)
    mode = list(inspect.signature(kernel.py_func).parameters).index("mode")

    def counted(*args):
        result = kernel(*args)
        if args[mode] == compiled_steps.RUNS:
            ends.append((result[0], result[1]))
        return result
    monkeypatch.setattr(compiled_steps, name, counted)
    proposed = _counted(monkeypatch, "propose_once")
    preempting = counted_preemptions(monkeypatch)
    spec = SimulationSpec(workload="poisson", rate=rate, requests=150, lengths=lengths,
                          acceptance=acceptance, draft=draft, seed=4)
    scheduler = SchedulerConfig(scheduler="vllm-v1", **settings)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, scheduler=scheduler,
                                            replicas=replicas, policy=policy)
    decode_steps = int(((fast.steps["decode_seqs"] > 0) & (fast.steps["prefill_seqs"] == 0)).sum())
    assert runs and one_at_a_time and sum(n for _, n in ends) > decode_steps / 3
    # every engine step taken one at a time has its choice, fit and proposals compiled
    assert len(proposed) == one_at_a_time
    if settings.get("kv_capacity_tokens") or settings.get("max_batched_tokens"):
        assert any(why == compiled_steps.ROOM and n for why, n in ends)  # a run cut before it
        assert any(why == compiled_steps.ROOM and not n for why, n in ends)  # stepped
    assert bool(preempting) == bool(settings.get("kv_capacity_tokens"))
    _same(fast, slow)


def test_no_runs_of_vllms_steps_near_a_max_model_len(monkeypatch, loops):
    """With a max_model_len (vLLM's cut at it, its zero drafts where a request nears it) every
    engine step is the step path's, none compiled."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class WithMaxModelLen(SchedulerConfig):
        max_model_len: int = 520  # (each request is cut at it, 80 tokens short of its output)

    proposed = _counted(monkeypatch, "propose_once")
    spec = SimulationSpec(workload="poisson", rate=8.0, requests=60, lengths="fixed:200,400",
                          acceptance="beta:7,3~20", draft="none", seed=4)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec,
                                            scheduler=WithMaxModelLen(scheduler="vllm-v1"))
    assert runs == 0 and one_at_a_time and not proposed
    requests = fast.requests  # (each cut short: a prefill's token, then each step's)
    assert (1 + requests["steps"] + requests["accepted"] < requests["output_tokens"]).all()
    _same(fast, slow)


def _applies(policy=None, draft: str = "none", profile: bool = False, tree: bool = False,
             idle: bool = False, policy_cost: bool = False, planned: bool = False,
             fast_path: bool = True, k_max: int = 10) -> bool:
    """`steps_at_once` of one replica's setting (auto on the n-gram recording by default)."""
    from simulator.draft_tree import TreeShape
    from simulator.step_cost import StepCostModel

    spec = SimulationSpec(workload="poisson", rate=8.0, requests=3, lengths="azure-conv",
                          acceptance="smollm2-ngram", seed=1, draft=None if profile else draft,
                          profile="cpu-smollm2-135m" if profile else None)
    latency = build_inputs(spec, {}, SchedulerConfig()).latency
    if idle:
        latency.idle_proposer_s = 1e-4
    cost = StepCostModel(latency, draft_tree=TreeShape(((0,), (1,), (0, 0))) if tree else None,
                         speculating=True)
    return stepped.steps_at_once(policy or Auto(), cost, cost if policy_cost else None, planned,
                                 fast_path, k_max)


@pytest.mark.parametrize("case", ["tree", "subclass", "numpy", "policy cost",
                                  "k_max 0", "engine k_max 0", "profile", "no fast path",
                                  "kld draft model", "kld long history", "idle proposer"])
def test_the_step_path_where_the_compiled_loop_does_not_stand_for_it(loops, case):
    """Each setting the runs of steps do not stand for, beside the same setting without what
    rules them out (auto with no depth to draft to, its own k_max or the engine's, would plan
    over no drafts: its `choose` plans nothing there)."""
    loops(case != "numpy")
    kld = case.startswith("kld")
    policy = (_Subclass() if case == "subclass" else Auto(k_max=0) if case == "k_max 0"
              else KldVariance(activation_tokens=129 if case == "kld long history" else 100)
              if kld else Auto())
    setting = dict(draft="Llama-68M" if case in ("tree", "kld draft model") else "none",
                   tree=case == "tree", idle=case == "idle proposer",
                   policy_cost=case == "policy cost", profile=case == "profile",
                   fast_path=case != "no fast path", k_max=0 if case == "engine k_max 0" else 10)
    assert not _applies(policy, **setting)
    if case in ("tree", "numpy", "profile", "idle proposer", "kld draft model",
                "engine k_max 0"):  # (the others differ from the default in the policy alone)
        loops(True)
        assert _applies(KldVariance() if kld else Auto(),
                        draft="Llama-68M" if case == "tree" else "none")


def test_kld_variance_reads_no_cost_so_a_policy_cost_model_does_not_rule_it_out(loops):
    """(validate hands the live engine's cost model to the policies: auto prices steps with
    it, kld_variance does not), and the engine's k_max of 0 leaves it its ks of 0."""
    loops(True)
    assert _applies(KldVariance(), policy_cost=True)
    assert _applies(KldVariance(), k_max=0)


def _roofline(gpu: str = "H100-SXM", tp: int = 1, flops_efficiency: float = 0.7,
              draft: str | None = None):
    """Llama-3.1-8B (and `draft`) on `gpu`'s roofline; a low `flops_efficiency` makes its
    passes compute-bound (where a verify pass's causal pairs, and a draft pass's catch-up,
    price it)."""
    from simulator.catalog import get_gpu, get_model
    from simulator.roofline import RooflineLatency, RooflineParams

    return RooflineLatency(get_model("Llama-3.1-8B"), get_model(draft) if draft else None,
                           get_gpu(gpu), tp=tp,
                           params=RooflineParams(flops_efficiency=flops_efficiency))


@pytest.mark.parametrize("gpu,tp,flops", [("H100-SXM", 1, 0.7), ("A100-80GB", 4, 0.7),
                                          ("H100-SXM", 1, 0.0005), ("A100-80GB", 2, 0.001)])
def test_a_drafts_price_is_autos_to_the_bit(loops, gpu, tp, flops):
    """`draft_price` (what accepting a first draft outside a streak is weighed against, rarely
    flipping a decision in a run's records) against `Auto._draft_price`, memory- and
    compute-bound."""
    import numpy as np
    from support.policy_fakes import FakeRequest, context

    from simulator.compiled_steps import draft_price
    from simulator.step_cost import StepCostModel

    loops(True)
    cost = StepCostModel(_roofline(gpu, tp, flops))
    rng = np.random.default_rng(5)
    for _ in range(200):
        b = int(rng.integers(1, 40))
        contexts = rng.integers(2, 30000, size=b)
        batch = [FakeRequest(i, prompt_tokens=int(c) - 1, output_tokens=int(c) + 5,
                             generated=1) for i, c in enumerate(contexts)]
        expected = Auto()._draft_price(context(batch, cost=cost), contexts.tolist())
        got = draft_price(contexts.astype(np.int64), int(contexts.sum()) - b,
                          cost._roofline["target"], float(cost.latency.step_overhead_s(b)))
        assert np.float64(got).tobytes() == np.float64(expected).tobytes()

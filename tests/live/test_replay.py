"""Replay mode: random-weight models serve with acceptance taken from a speculation trace, and on
the simulator's clock every decision (batches, k, drafted, accepted, times) equals the
simulator's for the same trace, including draft-stop rules, n-gram proposal caps and the signals
policies read; the passes really run (a draft model's chain passes too)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from support.engine import LinearLatency, workload  # noqa: E402

from drafters import make_drafter  # noqa: E402
from drafters.ngram import NgramDrafter  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig, StepCostModel, simulate  # noqa: E402
from simulator.catalog import ModelShape  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from traces import SpeculationTrace, parametric_trace  # noqa: E402

TARGET = ModelShape(
    name="replay-target", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128,
    vocab=97, tied_embeddings=False, source="test",
)  # fmt: skip
DRAFT = dataclasses.replace(TARGET, name="replay-draft", layers=1, vocab=61)  # another vocab
SCHED = SchedulerConfig(max_num_seqs=3, max_batched_tokens=60, kv_capacity_tokens=100_000,
                        k_max=6)
ARRIVALS = [0.0, 0.0, 0.001, 0.02, 0.021, 0.05, 0.3, 0.31]
PROMPTS = [9, 14, 5, 20, 11, 7, 16, 10]
OUTPUTS = [30, 3, 41, 12, 25, 9, 33, 20]


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel.random(config_for(TARGET), seed=0)


def prompts_of(lengths) -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, DRAFT.vocab, n).tolist() for n in lengths]  # both models embed them


def trace_for(spec: str = "beta:6,3~10", seed: int = 1) -> SpeculationTrace:
    """Fewer recorded requests than the workload has, shorter than some: tiled as in simulate."""
    return parametric_trace(spec, np.asarray([35, 18, 26, 40, 22]), np.random.default_rng(seed))


def with_proposable(trace: SpeculationTrace, seed: int = 2) -> SpeculationTrace:
    """The trace plus how many tokens a lookup could propose per position (0..6)."""
    rng = np.random.default_rng(seed)
    reqs = tuple(dataclasses.replace(r, proposable=rng.integers(0, 7, len(r.run)).astype(
        np.int16)) for r in trace.requests)
    return SpeculationTrace(requests=reqs, meta=trace.meta)


def mirror(target, drafter, policy, params, trace, sched=SCHED):
    wl = workload(ARRIVALS, PROMPTS, OUTPUTS)
    cost = StepCostModel(LinearLatency(draft=not drafter.model_free))
    live = LiveEngine(target, drafter, make_policy(policy, params), sched, cost=cost,
                      replay=trace)
    res = live.run(wl, prompts_of(PROMPTS), virtual_time=True)
    sim = simulate(wl, cost.latency, trace, make_policy(policy, params),
                   sched.kv_capacity_tokens, sched)
    return res, sim


@pytest.mark.parametrize(("policy", "params"), [
    ("fixed", {"k": 4}), ("gammatune", {}), ("kld_variance", {"activation_tokens": 20}),
    ("confidence", {"threshold": 0.6}), ("gammatune_plus", {}), ("goodput", {}),
    ("batch_adaptive", {}),
])
@pytest.mark.parametrize("drafter_name", ["model:replay-draft", "ngram"])
@pytest.mark.parametrize("chunked", [False, True])
def test_replay_mirrors_the_simulator_step_for_step(target, policy, params, drafter_name,
                                                    chunked):
    drafter = make_drafter(drafter_name, target, shapes={"replay-draft": DRAFT},
                           vocab_check=False)
    sched = dataclasses.replace(SCHED, chunked_prefill=True, max_batched_tokens=12) if (
        chunked) else SCHED
    res, sim = mirror(target, drafter, policy, params, trace_for(), sched)
    assert len(res.steps) > 20 and (res.steps.waiting > 0).any()
    assert res.steps.drafted.sum() > 0 and res.steps.accepted.sum() > 0
    pd.testing.assert_frame_equal(res.steps, sim.steps, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(res.requests, sim.requests, check_exact=False, rtol=1e-9)


@pytest.mark.parametrize("policy", ["fixed", "gammatune"])
def test_proposal_caps_replay_as_in_the_simulator(target, policy):
    trace = with_proposable(trace_for())
    res, sim = mirror(target, NgramDrafter(), policy, {"k": 5} if policy == "fixed" else {},
                      trace)
    assert (res.decode_log.drafted < res.decode_log.k).any()  # the cap did bite
    pd.testing.assert_frame_equal(res.steps, sim.steps, check_exact=False, rtol=1e-9)


def test_accepted_counts_are_the_traces_runs(target):
    """Each step at position g accepts min(drafted, run[g], room - 1): the trace's, request by
    request (request i replays trace request i mod M, tiled to its length)."""
    trace = trace_for()
    wl = workload(ARRIVALS, PROMPTS, OUTPUTS)
    live = LiveEngine(target, NgramDrafter(), make_policy("fixed", {"k": 3}), SCHED,
                      replay=trace)
    res = live.run(wl, prompts_of(PROMPTS), realtime=False)
    for rid, steps in res.decode_log.groupby("request_id"):
        rec = trace.requests[rid % len(trace)].run
        run = np.tile(rec, -(-OUTPUTS[rid] // len(rec)))
        want = [min(d, int(run[g]), OUTPUTS[rid] - g - 1)
                for g, d in zip(steps.position, steps.drafted)]
        assert steps.accepted.tolist() == want, f"request {rid}"
    assert [len(o) for o in res.outputs] == OUTPUTS


def test_the_draft_model_runs_its_passes(target):
    """The replayed chains are the trace's, but the draft model's passes are really run: one
    batched pass per chain depth, as many as the longest chain."""
    drafter = make_drafter("model:replay-draft", target, shapes={"replay-draft": DRAFT},
                           vocab_check=False)
    calls = []
    handle = drafter.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        wl = workload(ARRIVALS, PROMPTS, OUTPUTS)
        live = LiveEngine(target, drafter, make_policy("fixed", {"k": 4}), SCHED,
                          replay=trace_for())
        res = live.run(wl, prompts_of(PROMPTS), realtime=False)
    finally:
        handle.remove()
    decode = res.steps[res.steps.decode_seqs > 0]
    prefills = int((res.steps.prefill_seqs > 0).sum())
    assert len(calls) == prefills + int(decode.max_k.sum())


def test_replay_refusals(target):
    wl = workload(ARRIVALS, PROMPTS, OUTPUTS)
    with pytest.raises(ConfigError, match="temperature"):
        LiveEngine(target, NgramDrafter(), make_policy("fixed", {"k": 2}), SCHED,
                   temperature=0.7, replay=trace_for())
    bare = trace_for()
    bare = SpeculationTrace(requests=tuple(dataclasses.replace(r, kl=None)
                                           for r in bare.requests), meta=bare.meta)
    live = LiveEngine(target, NgramDrafter(), make_policy("kld_variance"), SCHED, replay=bare)
    with pytest.raises(ConfigError, match="kl"):
        live.run(wl, prompts_of(PROMPTS), realtime=False)
    capped = trace_for()
    capped = SpeculationTrace(requests=capped.requests, meta={**capped.meta, "max_run": 4})
    live = LiveEngine(target, NgramDrafter(), make_policy("fixed", {"k": 2}), SCHED,
                      replay=capped)
    with pytest.raises(ConfigError, match="k_max"):
        live.run(wl, prompts_of(PROMPTS), realtime=False)

"""The live engine: greedy speculative output equals target-only greedy output (every drafter, every
live policy, continuous batching with staggered arrivals); records have the simulator's schema and
conserve tokens; the scheduler is FCFS within max_num_seqs, the KV capacity and the token budget;
signals reach the policy for observed positions only; and under a fixed k every request's steps
replay exactly in the simulator from a speculation trace recorded by teacher forcing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from support.engine import (  # noqa: E402
    CyclingPolicy,
    LinearLatency,
    feed_recorder,
    trace_from_runs,
)
from support.tiny_models import sharpened  # noqa: E402

from drafters import make_drafter  # noqa: E402
from drafters.ngram import NgramDrafter  # noqa: E402
from live.engine import DECODE_LOG_COLUMNS, LiveEngine  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from policies import Policy, make_policy, policy_names  # noqa: E402
from simulator import SchedulerConfig, StepCostModel, simulate  # noqa: E402
from simulator.catalog import ModelShape  # noqa: E402
from simulator.errors import ConfigError  # noqa: E402
from simulator.logs import REQUEST_COLUMNS, STEP_COLUMNS  # noqa: E402
from traces import Workload, run_from_matches  # noqa: E402

TINY = ModelShape(
    name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=97,
    tied_embeddings=False, source="test",
)  # fmt: skip
NEAR_TIE = 1e-4  # top-2 logit gap under which fp32 rounding may flip a greedy choice
ARRIVALS = [0.0, 0.0, 0.0, 0.0, 0.002, 0.004, 0.01, 0.03]
OUTPUTS = [24, 1, 40, 12, 30, 8, 33, 20]
SCHED = SchedulerConfig(max_num_seqs=4, kv_capacity_tokens=100_000, k_max=8)


def noisy_copy(model: LlamaModel, scale: float, seed: int) -> LlamaModel:
    """The model with relative Gaussian noise on every matrix: a draft that agrees partly."""
    copy = LlamaModel(model.config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (_, mine), (_, theirs) in zip(copy.named_parameters(), model.named_parameters()):
            noise = torch.randn(theirs.shape, generator=gen) * scale * float(theirs.std())
            mine.copy_(theirs + noise if theirs.dim() > 1 else theirs)
    return copy


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return sharpened(LlamaModel.random(config_for(TINY), seed=0))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, TINY.vocab, int(rng.integers(4, 25))).tolist() for _ in OUTPUTS]


def workload(prompts, arrivals=ARRIVALS, outputs=OUTPUTS) -> Workload:
    return Workload(arrival_s=np.asarray(arrivals, dtype=float),
                    prompt_tokens=np.asarray([len(p) for p in prompts]),
                    output_tokens=np.asarray(outputs),
                    request_ids=np.arange(100, 100 + len(prompts)), source="test")  # fmt: skip


def greedy_reference(model, prompt, n) -> tuple[list[int], list[float]]:
    """Target-only greedy decoding (q = 1 passes), and the top-2 logit gap at every position."""
    cache = model.new_cache(len(prompt) + n)
    logits = model([torch.tensor(prompt)], [cache], logits="last")[0][0]
    out, gaps = [], []
    while True:
        top = logits.topk(2).values
        out.append(int(logits.argmax()))
        gaps.append(float(top[0] - top[1]))
        if len(out) == n:
            return out, gaps
        logits = model([torch.tensor([out[-1]])], [cache], logits="last")[0][0]


@pytest.fixture(scope="module")
def reference(target, prompts):
    return [greedy_reference(target, p, n) for p, n in zip(prompts, OUTPUTS)]


def assert_lossless(outputs, reference) -> None:
    """Token-for-token equality; a difference is allowed only at a near-tie of the target's logits
    (after which the two sequences legitimately diverge), never elsewhere."""
    for i, (out, (ref, gaps)) in enumerate(zip(outputs, reference)):
        assert len(out) == len(ref), f"request {i}: {len(out)} tokens, expected {len(ref)}"
        diff = next((t for t, (a, b) in enumerate(zip(out, ref)) if a != b), None)
        if diff is not None:
            assert gaps[diff] < NEAR_TIE, (
                f"request {i} differs at output position {diff} ({out[diff]} != {ref[diff]}) "
                f"where the target's top-2 gap is {gaps[diff]:.2e}: not a near-tie")


def drafter_for(name, target):
    """A drafter by test name: model:same is the target itself (every draft accepted),
    model:noisy a perturbed copy (some accepted), model:tiny random weights (~none accepted)."""
    if name == "model:same":
        return make_drafter(name, target, draft_model=target)
    if name == "model:noisy":
        return make_drafter(name, target, draft_model=noisy_copy(target, 0.2, seed=5))
    return make_drafter(name, target, shapes={"tiny": TINY}, seed=1)


def engine(target, drafter, policy, sched=SCHED, cost=None) -> LiveEngine:
    cost = cost if cost is not None else StepCostModel(LinearLatency())
    return LiveEngine(target, drafter, policy, sched, cost=cost)


# -- losslessness ------------------------------------------------------------------------------

POLICIES = [("fixed", {"k": 0}), ("fixed", {"k": 3}), ("gammatune", {}), ("kld_variance", {}),
            ("goodput", {})]  # fmt: skip


@pytest.mark.parametrize("drafter_name", ["ngram", "early-exit:1", "model:tiny", "model:noisy",
                                          "model:same"])
@pytest.mark.parametrize(("policy", "params"), POLICIES, ids=[p for p, _ in POLICIES])
def test_greedy_speculative_output_equals_target_greedy(target, prompts, reference, drafter_name,
                                                        policy, params):
    live = engine(target, drafter_for(drafter_name, target), make_policy(policy, params))
    result = live.run(workload(prompts), prompts, realtime=False)
    assert_lossless(result.outputs, reference)
    if policy == "fixed" and params["k"] == 0:
        assert result.requests.drafted.sum() == 0
    elif drafter_name == "model:same":  # every draft accepted, up to each request's end
        log = result.decode_log
        room = log.request_id.map(dict(zip(result.requests.request_id, OUTPUTS))) - log.position
        assert (log.accepted == np.minimum(log.drafted, room - 1)).all()


OTHERS = sorted(set(policy_names()) - {p for p, _ in POLICIES} - {"oracle"})


@pytest.mark.parametrize("policy", OTHERS)
def test_every_other_live_policy_is_lossless(target, prompts, reference, policy):
    live = engine(target, drafter_for("early-exit:1", target), make_policy(policy))
    assert_lossless(live.run(workload(prompts), prompts, realtime=False).outputs, reference)


# -- records and the scheduler -------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(target, prompts):
    live = engine(target, drafter_for("early-exit:1", target), make_policy("gammatune"))
    return live.run(workload(prompts), prompts, realtime=False)


def test_records_have_the_simulators_schema(run):
    assert tuple(run.steps.columns) == STEP_COLUMNS
    assert tuple(run.requests.columns) == REQUEST_COLUMNS
    assert tuple(run.decode_log.columns) == DECODE_LOG_COLUMNS
    assert run.meta["engine"] == "live" and run.meta["drafter"] == "early-exit:1"


def test_tokens_are_conserved(run):
    req, steps, log = run.requests, run.steps, run.decode_log
    assert steps.emitted.sum() + len(req) == req.output_tokens.sum()
    assert [len(o) for o in run.outputs] == OUTPUTS
    assert steps.drafted.sum() == req.drafted.sum() == log.drafted.sum()
    assert steps.accepted.sum() == req.accepted.sum() == log.accepted.sum()
    assert (steps.emitted == steps.accepted + steps.decode_seqs).all()
    assert req.steps.tolist() == log.groupby("request_id").size().reindex(req.request_id,
                                                                         fill_value=0).tolist()
    for rid, steps_of in log.groupby("request_id"):
        positions = steps_of.position.to_numpy()
        assert positions[0] == 1  # the prefill emitted position 0
        assert (np.diff(positions) == steps_of.emitted.to_numpy()[:-1]).all()
        n = int(req.set_index("request_id").output_tokens[rid])
        assert positions[-1] + steps_of.emitted.iloc[-1] == n
        assert (steps_of.drafted <= steps_of.k).all()


def test_times_are_ordered(run):
    req, steps = run.requests, run.steps
    assert (req.arrival_s <= req.admitted_s).all()
    assert (req.admitted_s < req.first_token_s).all() and (req.first_token_s <= req.finish_s).all()
    assert np.all(np.diff(steps.start_s) > 0) and (steps.duration_s > 0).all()
    ends = steps.start_s + steps.duration_s
    assert np.all(steps.start_s.to_numpy()[1:] >= ends.to_numpy()[:-1])
    assert set(req.first_token_s) <= set(ends[steps.prefill_seqs > 0])
    assert set(req.finish_s) <= set(ends)


def test_prefill_iterations_are_separate(run):
    prefill = run.steps[run.steps.prefill_seqs > 0]
    assert (prefill.decode_seqs == 0).all() and (prefill.emitted == 0).all()
    assert prefill.prefill_seqs.sum() == len(run.requests)
    assert prefill.prefill_tokens.sum() == run.requests.prompt_tokens.sum()


def concurrency(req) -> list[int]:
    """Requests admitted and not finished at each admission time."""
    return [int(((req.admitted_s <= t) & (req.finish_s > t)).sum()) for t in req.admitted_s]


def test_admission_is_fcfs_and_within_max_num_seqs(target, prompts):
    sched = dataclasses.replace(SCHED, max_num_seqs=2)
    live = engine(target, NgramDrafter(), make_policy("fixed", {"k": 2}), sched)
    res = live.run(workload(prompts), prompts, realtime=False)
    req, steps = res.requests, res.steps
    assert np.all(np.diff(req.admitted_s) >= 0) and np.all(np.diff(req.first_token_s) >= 0)
    assert max(concurrency(req)) == 2
    assert (steps.decode_seqs <= 2).all() and (steps.prefill_seqs <= 2).all()
    assert (steps.waiting > 0).any()
    assert (steps.held >= steps.waiting + steps.decode_seqs).all()


def test_kv_capacity_and_token_budget_are_respected(target, prompts):
    reserve = np.asarray([len(p) for p in prompts]) + np.asarray(OUTPUTS) + SCHED.k_max
    capacity = int(np.sort(reserve)[-2:].sum())  # the two largest fit together, no more assured
    sched = dataclasses.replace(SCHED, kv_capacity_tokens=capacity, max_batched_tokens=40)
    live = engine(target, NgramDrafter(), make_policy("fixed", {"k": 3}), sched)
    res = live.run(workload(prompts), prompts, realtime=False)
    req, steps = res.requests, res.steps
    assert (steps.kv_used_tokens <= capacity).all()
    for t in req.admitted_s:
        held = (req.admitted_s <= t) & (req.finish_s > t)
        assert reserve[held.to_numpy()].sum() <= capacity
    assert (steps.prefill_tokens <= 40).all() and (steps.waiting > 0).any()
    assert np.all(np.diff(req.admitted_s) >= 0)


def test_idle_gaps_are_skipped_in_replay_and_slept_in_real_time(target, prompts):
    pair = prompts[:2]
    for realtime, gap in ((False, 30.0), (True, 0.05)):
        live = engine(target, NgramDrafter(), make_policy("fixed", {"k": 2}))
        res = live.run(workload(pair, [0.0, gap], [4, 4]), pair, realtime=realtime)
        second = res.requests.iloc[1]
        assert second.arrival_s == gap and second.admitted_s >= gap
        assert res.requests.finish_s.iloc[0] < gap  # the engine was idle in between
        assert res.meta["wall_s"] < (5.0 if not realtime else 5.0 + gap)
        if realtime:
            assert res.meta["wall_s"] >= gap


# -- what the policy sees -----------------------------------------------------------------------


@dataclass
class Recorder(Policy):
    """Drafts k = 3, stops chains whose draft top-1 is below `tau`, and keeps what it was told."""

    name: ClassVar[str] = "recorder"
    signals: ClassVar[frozenset[str]] = frozenset({"kl", "accept_prob", "draft_top1",
                                                   "draft_entropy"})
    uses_draft_stop: ClassVar[bool] = True
    tau: float = 0.0

    def __post_init__(self) -> None:
        self.outcomes, self.stops, self.finished = [], [], []

    def choose(self, ctx):
        return [3] * len(ctx.requests)

    def stop_drafting(self, request, depth, draft_top1, draft_entropy):
        self.stops.append((request.request_id, depth, draft_top1, draft_entropy))
        return draft_top1 < self.tau

    def observe(self, ctx, outcomes):
        self.outcomes.extend(outcomes)

    def finish(self, request_id):
        self.finished.append(request_id)


@pytest.mark.parametrize("drafter_name", ["ngram", "early-exit:1", "model:noisy", "model:same"])
def test_signals_cover_observed_positions_only(target, prompts, drafter_name):
    seen = []  # run() deep-copies the policy: its copy reports through this closure

    class Keep(Recorder):
        def observe(self, ctx, outcomes):
            seen.extend(outcomes)

    live = engine(target, drafter_for(drafter_name, target), Keep())
    live.run(workload(prompts), prompts, realtime=False)
    assert seen
    for o in seen:
        n = min(o.emitted, o.k)
        assert all(len(o.signals[name]) == n for name in Recorder.signals)
        assert (o.signals["kl"] >= 0).all()
        assert ((o.signals["accept_prob"] >= 0) & (o.signals["accept_prob"] <= 1 + 1e-9)).all()
        if drafter_name == "ngram":
            assert (o.signals["draft_top1"] == 1.0).all()
            assert (o.signals["draft_entropy"] == 0.0).all()
        if drafter_name == "model:same":
            assert o.signals["kl"] == pytest.approx(0.0, abs=1e-5)
            assert o.signals["accept_prob"] == pytest.approx(1.0, abs=1e-5)


def test_draft_stop_cuts_chains(target, prompts, reference):
    stops = []

    class Stopper(Recorder):
        def stop_drafting(self, request, depth, draft_top1, draft_entropy):
            stops.append(depth)
            return depth == 1  # every chain stops after its second token

    live = engine(target, drafter_for("early-exit:1", target), Stopper())
    res = live.run(workload(prompts), prompts, realtime=False)
    assert (res.decode_log.drafted == 2).all() and set(stops) == {0, 1}
    assert_lossless(res.outputs, reference)


def test_refusals(target, prompts):
    with pytest.raises(ConfigError, match="simulation only"):
        engine(target, NgramDrafter(), make_policy("oracle"))
    with pytest.raises(ConfigError, match="KV capacity"):
        LiveEngine(target, NgramDrafter(), make_policy("fixed"), SchedulerConfig())
    live = LiveEngine(target, NgramDrafter(), make_policy("goodput"), SCHED)  # no cost model
    with pytest.raises(ConfigError, match="cost model"):
        live.run(workload(prompts), prompts, realtime=False)
    with pytest.raises(ValueError, match="prompt tokens"):
        engine(target, NgramDrafter(), make_policy("fixed")).run(
            workload(prompts), [p[1:] for p in prompts], realtime=False)
    with pytest.raises(ConfigError, match="k_max"):
        engine(target, NgramDrafter(), make_policy("fixed", {"k": 9})).run(
            workload(prompts), prompts, realtime=False)


# -- replay exactness against the simulator ------------------------------------------------------


def teacher_forced_runs(target, prompts, drafter_name) -> list[np.ndarray]:
    """run[t] per request from the target's greedy output (docs/design.md "Speculation traces")."""
    runs = []
    for prompt, n in zip(prompts, OUTPUTS):
        out, _ = greedy_reference(target, prompt, n)
        if drafter_name == "ngram":
            lookup = NgramDrafter()
            run = [0] + [sum(1 for _ in _matching(lookup.lookup(prompt + out[:t], SCHED.k_max),
                                                  out[t:])) for t in range(1, n)]
            runs.append(np.asarray(run))
            continue
        # a greedy chain proposes the draft's argmax after the true prefix while it matches, so
        # run = consecutive per-position matches of one teacher-forced draft pass
        draft = drafter_for(drafter_name, target).model
        sequence = torch.tensor(prompt + out[:-1])
        rows = draft([sequence], [draft.new_cache(len(sequence))], logits="all")[0]
        guesses = rows[len(prompt) - 1 :].argmax(dim=-1).numpy()
        runs.append(run_from_matches(guesses == np.asarray(out)))
    return runs


def _matching(proposal, truth):
    for a, b in zip(proposal, truth):
        if a != b:
            return
        yield a


@pytest.mark.parametrize("drafter_name", ["ngram", "early-exit:1", "model:noisy"])
@pytest.mark.parametrize("k", [1, 3])
def test_fixed_k_replays_exactly_in_the_simulator(target, prompts, drafter_name, k):
    runs = teacher_forced_runs(target, prompts, drafter_name)
    wl = workload(prompts)
    live = engine(target, drafter_for(drafter_name, target), make_policy("fixed", {"k": k}))
    res = live.run(wl, prompts, realtime=False)
    for rid, steps_of in res.decode_log.groupby("request_id"):
        run, n = runs[rid - 100], OUTPUTS[rid - 100]
        expected = [min(k, int(run[g]), n - g - 1) for g in steps_of.position]
        assert steps_of.accepted.tolist() == expected, f"request {rid}"
    sim = simulate(wl, LinearLatency(draft=drafter_name != "ngram"), trace_from_runs(runs),
                   make_policy("fixed", {"k": k}), SCHED.kv_capacity_tokens, SCHED)
    for column in ("steps", "accepted"):
        assert sim.requests[column].tolist() == res.requests[column].tolist()


def _policy(name: str, params: dict) -> Policy:
    return CyclingPolicy() if name == "cycling" else make_policy(name, params)


@pytest.mark.parametrize(("policy", "params"), [("fixed", {"k": 3}), ("gammatune", {}),
                                                ("goodput", {}), ("cycling", {})])
def test_scheduler_mirrors_the_simulator_step_for_step(target, prompts, policy, params):
    """On the simulator's clock (iteration times from the same cost model) and with acceptance
    replayed from a trace of the same drafter, the simulator must make every decision the live
    engine made: the same iterations, batches, k, admissions, at the same times; and charge
    each chain's first draft pass what the draft model fed there (simulator/draft_feed.py)."""
    runs = teacher_forced_runs(target, prompts, "early-exit:1")
    sched = dataclasses.replace(SCHED, max_num_seqs=3, max_batched_tokens=40)
    cost = StepCostModel(LinearLatency())
    wl = workload(prompts, arrivals=[0.0, 0.0, 0.001, 0.02, 0.021, 0.05, 0.3, 0.31])
    live = engine(target, drafter_for("early-exit:1", target), _policy(policy, params), sched,
                  cost=cost)
    res = live.run(wl, prompts, virtual_time=True)
    sim = simulate(wl, cost.latency, trace_from_runs(runs), _policy(policy, params),
                   sched.kv_capacity_tokens, sched)
    assert len(res.steps) > 20 and (res.steps.waiting > 0).any()
    pd.testing.assert_frame_equal(res.steps, sim.steps, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(res.requests, sim.requests, check_exact=False, rtol=1e-9)


def test_policies_see_the_draft_feed_the_simulator_charges(target, prompts):
    """`RequestView.draft_feed` (what a goodput-like policy prices a chain's first draft pass
    with) is the same number in the live engine as in the simulator, step by step; and it is
    the catch-up the live draft model then feeds: k = 0 stretches let it grow."""
    runs = teacher_forced_runs(target, prompts, "early-exit:1")
    sched = dataclasses.replace(SCHED, max_num_seqs=3)
    cost = StepCostModel(LinearLatency())
    wl = workload(prompts, arrivals=[0.0, 0.0, 0.001, 0.02, 0.021, 0.05, 0.3, 0.31])
    live_seen, sim_seen = [], []
    live = engine(target, drafter_for("early-exit:1", target), feed_recorder(live_seen), sched,
                  cost=cost)
    live.run(wl, prompts, virtual_time=True)
    simulate(wl, cost.latency, trace_from_runs(runs), feed_recorder(sim_seen),
             sched.kv_capacity_tokens, sched)
    assert live_seen == sim_seen
    backlog = [feed for step in live_seen for _, _, feed in step if feed > 2]
    assert backlog, "no step saw a k = 0 backlog (a feed above the bonus rule's 2)"


# -- chunked prefill -----------------------------------------------------------------------------

CHUNKED = dataclasses.replace(SCHED, chunked_prefill=True, max_batched_tokens=14)


@pytest.mark.parametrize("drafter_name", ["ngram", "early-exit:1", "model:noisy"])
@pytest.mark.parametrize(("policy", "params"), [("fixed", {"k": 3}), ("gammatune", {})])
def test_chunked_prefill_is_lossless(target, prompts, reference, drafter_name, policy, params):
    """Prompts longer than the budget are prefilled in chunks beside the decode steps."""
    live = engine(target, drafter_for(drafter_name, target), make_policy(policy, params),
                  CHUNKED)
    res = live.run(workload(prompts), prompts, realtime=False)
    assert_lossless(res.outputs, reference)
    mixed = res.steps[(res.steps.prefill_seqs > 0) & (res.steps.decode_seqs > 0)]
    assert len(mixed) > 0 and (res.steps.prefill_tokens <= CHUNKED.max_batched_tokens).all()
    assert max(len(p) for p in prompts) > CHUNKED.max_batched_tokens  # some were chunked


@pytest.mark.parametrize(("policy", "params"), [("fixed", {"k": 3}), ("gammatune", {}),
                                                ("goodput", {}), ("cycling", {})])
def test_chunked_scheduler_mirrors_the_simulator_step_for_step(target, prompts, policy, params):
    runs = teacher_forced_runs(target, prompts, "early-exit:1")
    sched = dataclasses.replace(CHUNKED, max_num_seqs=3)
    cost = StepCostModel(LinearLatency())
    wl = workload(prompts, arrivals=[0.0, 0.0, 0.001, 0.02, 0.021, 0.05, 0.3, 0.31])
    live = engine(target, drafter_for("early-exit:1", target), _policy(policy, params), sched,
                  cost=cost)
    res = live.run(wl, prompts, virtual_time=True)
    sim = simulate(wl, cost.latency, trace_from_runs(runs), _policy(policy, params),
                   sched.kv_capacity_tokens, sched)
    assert (res.steps.prefill_seqs > 0).sum() > len(prompts)  # prompts spread over iterations
    pd.testing.assert_frame_equal(res.steps, sim.steps, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(res.requests, sim.requests, check_exact=False, rtol=1e-9)

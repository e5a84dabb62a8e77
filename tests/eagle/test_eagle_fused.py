"""An EAGLE head that fuses lower layers' features with the last one's (EAGLE-3 style): the
target hands out the right layers, the head starts exactly as the unfused one, its batched chains
equal its live chains, it trains, round-trips through its file (which brings its layers along),
and the live engine with it stays lossless and replays what `eagle_runs` records."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.eagle_checks import (  # noqa: E402
    OUTPUTS,
    assert_chains_equal_live,
    assert_live_eagle_lossless,
    live_requests,
)
from support.engine import LinearLatency  # noqa: E402
from support.tiny_models import TINY, one_by_one_greedy, sharpened  # noqa: E402

from drafters.eagle import EagleDrafter  # noqa: E402
from eagle.chains import eagle_runs  # noqa: E402
from eagle.train_spec import TrainSpec  # noqa: E402
from eagle.training import draft_vocabulary, init_head, train_head  # noqa: E402
from eagle.training_data import target_features  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from models.eagle_head import EagleHead, HeadTiming, head_state, load_head, save_head  # noqa: E402
from models.generate import target_outputs  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig, StepCostModel  # noqa: E402

LAYERS = (0,)  # TINY has 2 decoder layers: the first one's output beside the last one's


def new_target(layers=()) -> LlamaModel:
    """A fresh target per use: a fused head sets which layers its target hands out."""
    target = sharpened(LlamaModel.random(config_for(TINY), seed=0))
    target.set_feature_layers(layers)
    return target


def test_the_target_hands_out_its_feature_layers_before_the_last():
    plain, tapped = new_target(), new_target(LAYERS)
    cut = new_target()
    cut.layers = cut.layers[:1]  # the same first layer, and nothing after it
    tokens = [torch.tensor([3, 14, 15, 92, 65, 35])]
    wide = tapped(tokens, [tapped.new_cache()], logits="hidden")[0]
    last = plain(tokens, [plain.new_cache()], logits="hidden")[0]
    first = cut(tokens, [cut.new_cache()], logits="hidden")[0]
    assert wide.shape == (6, 2 * TINY.hidden)
    assert torch.equal(wide[:, TINY.hidden :], last)
    assert torch.equal(wide[:, : TINY.hidden], first)
    assert not torch.equal(first, last)
    # the engine reads logits off rows it concatenated (`verify.py`): the same bits either way
    torch.testing.assert_close(
        tapped.logits_of(torch.cat([wide])), plain.logits_of(torch.cat([last])), rtol=0, atol=0
    )
    logits = tapped(tokens, [tapped.new_cache()], logits="all")[0]
    assert torch.equal(logits, plain(tokens, [plain.new_cache()], logits="all")[0])
    for bad in ([1], [0, 0], [-1]):  # the last layer, a repeat, out of range
        with pytest.raises(ValueError, match="feature layers must be distinct ascending"):
            plain.set_feature_layers(bad)


def test_a_fused_head_starts_where_the_unfused_one_does():
    """Same seed: the same weights besides `fuse`, which passes the last block through, so the
    first drafts are the unfused head's; training then finds the lower layer useful."""
    plain, tapped = new_target(), new_target()
    vocab = torch.arange(TINY.vocab)
    unfused = init_head(EagleHead(plain, vocab), seed=4)
    fused = init_head(EagleHead(tapped, vocab, LAYERS), seed=4)
    assert tapped.feature_layers == LAYERS and plain.feature_layers == ()
    for name, p in head_state(unfused).items():
        assert torch.equal(p, head_state(fused)[name]), name
    tokens = [5, 9, 2, 7, 7, 1, 30, 4]
    wide, narrow = target_features(tapped, tokens), target_features(plain, tokens)
    assert wide.shape[1] == fused.feature_width == 2 * TINY.hidden
    ids = torch.tensor(tokens[1:])
    torch.testing.assert_close(fused.entries(ids, wide[:-1]), unfused.entries(ids, narrow[:-1]))
    with torch.no_grad():
        fused.fuse.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(fused.entries(ids, wide[:-1]), unfused.entries(ids, narrow[:-1]))
    with pytest.raises(ValueError, match="features of width 80"):
        fused.entries(ids, torch.zeros(len(ids), 80))
    with pytest.raises(ValueError, match="already hands out layers"):
        other = new_target((0,))
        other.feature_layers = (5,)  # as if another head had asked for other layers
        EagleHead(other, vocab, LAYERS)


def test_a_profile_times_the_fused_heads_first_passes_with_true_features():
    """The drafter feeds the target's (fused, wider) features wherever a request feeds several
    tokens (a prompt, a chain's catch-up) and predicted ones in a chain's later passes: the
    profile's passes feed the same shapes, so `fuse` is timed where the drafter runs it."""
    timing = HeadTiming(EagleHead(new_target(), torch.arange(TINY.vocab), LAYERS))
    widths = []
    timing.head.register_forward_pre_hook(
        lambda _, args: widths.append({f.shape[-1] for f in args[1]}))
    for feeds in ([1], [1, 1, 1], [2], [1, 3], [5, 5]):
        caches = [timing.new_cache() for _ in feeds]
        timing([torch.arange(n) for n in feeds], caches)
    narrow, wide = TINY.hidden, 2 * TINY.hidden
    assert widths == [{narrow}, {narrow}, {wide}, {wide}, {wide}]


def fused_random_head(target, seed=1) -> EagleHead:
    head = init_head(EagleHead(target, torch.arange(TINY.vocab), LAYERS), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a layer and a fusion that do something
        for p in (head.layer.o, head.layer.down, head.fuse):
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[0] ** -0.5)
    return head


def test_fused_batched_chains_equal_the_live_heads_chains():
    target = new_target()
    assert_chains_equal_live(fused_random_head(target), target)


@pytest.fixture(scope="module")
def fused_trained():
    target = new_target()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, TINY.vocab, int(rng.integers(3, 12))).tolist() for _ in range(40)]
    outs = target_outputs(target, prompts, 40)
    head = init_head(EagleHead(target, draft_vocabulary(outs, TINY.vocab), LAYERS), seed=0)
    data = [(torch.tensor(p + o), target_features(target, p + o))
            for p, o in zip(prompts[:32], outs[:32])]
    assert data[0][1].shape[1] == 2 * TINY.hidden

    def acceptance() -> float:
        runs = [eagle_runs(head, target, p, o, 4)[0][1:] for p, o in zip(prompts[32:], outs[32:])]
        return float(np.mean(np.concatenate(runs) >= 1))

    before = acceptance()
    fuse_before = head.fuse.detach().clone()
    spec = TrainSpec(epochs=20, lr=3e-3, warmup_steps=5, sequences_per_step=4, depths=2)
    curve = train_head(head, data, spec, log=lambda _: None)
    return target, head, before, acceptance(), curve, fuse_before


def test_a_fused_head_trains_and_learns_to_use_the_lower_layer(fused_trained):
    _, head, before, after, curve, fuse_before = fused_trained
    assert curve[-1]["loss"] < 0.85 * curve[0]["loss"]
    assert after > before + 0.15, (before, after)
    lower = head.fuse[: TINY.hidden]
    assert float(lower.abs().max()) > 0.01 and float(fuse_before[: TINY.hidden].abs().max()) == 0


def test_a_fused_head_round_trips_with_its_layers(fused_trained, tmp_path):
    _, head, *_ = fused_trained
    path = tmp_path / "fused.npz"
    save_head(head, path, {"trained_on": "test"})
    fresh = new_target()
    loaded = load_head(fresh, path)
    assert loaded.meta["fuse_layers"] == [0] and fresh.feature_layers == LAYERS
    torch.testing.assert_close(loaded.fuse, head.fuse.half().float())
    busy = new_target()
    busy.feature_layers = (3,)
    with pytest.raises(ValueError, match=r"fused.npz: the target already hands out layers \[3\]"):
        load_head(busy, path)


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_live_fused_eagle_is_lossless_and_accepts_what_eagle_runs_records(fused_trained,
                                                                          chunked):
    target, head, *_ = fused_trained
    assert_live_eagle_lossless(target, head, chunked)


def test_an_int8_head_drafts_losslessly_and_records_what_it_drafts(fused_trained, tmp_path):
    """`eagle@int8`: the head's matrices in weight-only int8. The target still decides every
    token (output = greedy), the record (`eagle_runs`) walks the same int8 chains the live
    drafter proposes, and the drafts are the fp head's nearly everywhere."""
    target, head, *_ = fused_trained
    save_head(head, tmp_path / "h.npz", {"trained_on": "test"})
    fp, q = load_head(target, tmp_path / "h.npz"), load_head(target, tmp_path / "h.npz").quantize()
    assert (fp.weights, q.weights) == ("float32", "int8") and q.quantize() is q
    sched = SchedulerConfig(max_num_seqs=3, kv_capacity_tokens=100_000, k_max=6)
    prompts, workload = live_requests()
    res = LiveEngine(target, EagleDrafter(q), make_policy("fixed", {"k": 4}), sched,
                     cost=StepCostModel(LinearLatency())).run(workload, prompts, realtime=False)
    runs_q, runs_fp = [], []
    for rid, steps in res.decode_log.groupby("request_id"):
        assert list(res.outputs[rid]) == one_by_one_greedy(target, prompts[rid], OUTPUTS[rid])
        run, _ = eagle_runs(q, target, prompts[rid], res.outputs[rid], sched.k_max)
        expected = [min(4, int(run[g]), OUTPUTS[rid] - g - 1) for g in steps.position]
        assert steps.accepted.tolist() == expected, f"request {rid}"
        runs_q.append(run)
        runs_fp.append(eagle_runs(fp, target, prompts[rid], res.outputs[rid], sched.k_max)[0])
    same = np.mean(np.concatenate(runs_q) == np.concatenate(runs_fp))
    assert sum(r.sum() for r in runs_q) > 0 and same > 0.9, same
    with pytest.raises(ValueError, match="for drafting only"):
        save_head(q, tmp_path / "q.npz", {})

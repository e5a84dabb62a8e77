"""An EAGLE head of two decoder layers (`EagleHead(..., layers=2)`, `--head-layers 2`): each layer
keeps its own KV cache rows live and its own keys and values in the batched chains, so the chains
`eagle_runs` records are the live drafter's; packed training is the unpacked loss; the file names
its layers and brings them back; the live engine with it (fp and int8) stays lossless. A one-layer
head keeps the shipped file's names."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.eagle_checks import assert_chains_equal_live, assert_live_eagle_lossless  # noqa: E402
from support.tiny_models import TINY, sharpened  # noqa: E402

from eagle.chains import chain_passes, eagle_runs  # noqa: E402
from eagle.losses import PackedBatch, packed_loss, sequence_loss, windowed  # noqa: E402
from eagle.train_spec import TrainSpec  # noqa: E402
from eagle.training import draft_vocabulary, feature_rms, init_head, train_head  # noqa: E402
from eagle.training_data import target_features  # noqa: E402
from models.eagle_head import (  # noqa: E402
    SHIPPED_HEAD,
    EagleHead,
    head_state,
    load_head,
    read_meta,
    save_head,
)
from models.generate import target_outputs  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402

FUSED = (0,)  # TINY's first decoder layer's output beside the last one's


def new_target(layers=()) -> LlamaModel:
    target = sharpened(LlamaModel.random(config_for(TINY), seed=0))
    target.set_feature_layers(layers)
    return target


def two_layer_head(target, seed=1, fuse=FUSED) -> EagleHead:
    """Both layers doing something: their output projections drawn at full scale."""
    head = init_head(EagleHead(target, torch.arange(TINY.vocab), fuse, layers=2), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in head.layers:
            for p in (layer.o, layer.down):
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[0] ** -0.5)
    return head


def test_a_two_layer_head_has_two_sets_of_weights_and_a_two_layer_cache():
    head = two_layer_head(new_target())
    names = sorted(head_state(head))
    assert [n for n in names if n.startswith("layers.0.")] == [
        f"layers.0.{n}" for n in sorted(("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down"))]
    assert len([n for n in names if n.startswith("layers.1.")]) == 6
    assert not any(n.startswith("layer.") for n in names)
    assert not torch.equal(head.layers[0].qkv, head.layers[1].qkv)  # drawn, not copied
    assert len(head.new_cache(8).keys) == 2
    one = init_head(EagleHead(new_target(), torch.arange(TINY.vocab)), 1)
    assert {n for n in head_state(one) if "." in n} == {
        f"layer.{n}" for n in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down")}
    for bad in (0, 9, 1.5):
        with pytest.raises(ValueError, match="1 to 8 decoder layers"):
            EagleHead(new_target(), torch.arange(TINY.vocab), layers=bad)


def test_two_layer_batched_chains_equal_the_live_heads_chains():
    target = new_target()
    head = two_layer_head(target)
    assert_chains_equal_live(head, target)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, TINY.vocab, 9).tolist()
    tokens = torch.tensor(prompt + target_outputs(target, [prompt], 20)[0])
    features = target_features(target, tokens.tolist())
    # the second layer matters: the first layer alone predicts something else
    alone = EagleHead(new_target(FUSED), torch.arange(TINY.vocab), FUSED)
    with torch.no_grad():
        for name, p in head_state(alone).items():
            p.copy_(head_state(head)[name.replace("layer.", "layers.0.")])
    first = next(chain_passes(alone, tokens, features, 1))[2]
    both = next(chain_passes(head, tokens, features, 1))[2]
    assert (first - both).abs().max() > 0.1


def test_packed_two_layer_loss_equals_the_mean_of_the_sequence_losses():
    target = new_target()
    head = two_layer_head(target, fuse=())
    rng = np.random.default_rng(7)
    sequences = []
    for n_prompt, n_out in [(9, 20), (3, 11), (5, 8)]:
        prompt = rng.integers(0, TINY.vocab, n_prompt).tolist()
        tokens = prompt + target_outputs(target, [prompt], n_out)[0]
        item = (torch.tensor(tokens), target_features(target, tokens), n_prompt)
        sequences.append(windowed(item, 512))
    spec = TrainSpec(depths=3)
    params = list(head_state(head).values())
    for p in params:
        p.requires_grad_(True)
    singles = [sequence_loss(head, t, f, spec, b)[0] for t, f, b in sequences]
    want_loss = sum(singles) / len(singles)
    want = torch.autograd.grad(want_loss, params)
    loss = packed_loss(head, PackedBatch.of(sequences, spec.depths), spec)[0]
    got = torch.autograd.grad(loss, params)
    torch.testing.assert_close(loss, want_loss)
    for name, g, w in zip(head_state(head), got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=name)
    second = list(head_state(head)).index("layers.1.qkv")
    assert float(want[second].abs().max()) > 0  # the second layer learns too


def test_last_layer_init_of_two_layers_takes_the_targets_last_two():
    target = new_target()
    seq = target_outputs(target, [[5, 9, 14, 3]], 12)[0]
    rms = feature_rms([(torch.tensor(seq), target_features(target, seq))])
    head = init_head(EagleHead(target, torch.arange(TINY.vocab), layers=2), 0, "last", rms)
    for mine, theirs in zip(head.layers, target.layers[-2:]):
        assert torch.equal(mine.qkv, theirs.qkv) and torch.equal(mine.gate_up, theirs.gate_up)
        torch.testing.assert_close(mine.down, theirs.down / rms)


@pytest.fixture(scope="module")
def trained():
    target = new_target()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, TINY.vocab, int(rng.integers(3, 12))).tolist() for _ in range(40)]
    outs = target_outputs(target, prompts, 40)
    head = init_head(EagleHead(target, draft_vocabulary(outs, TINY.vocab), FUSED, layers=2), 0)
    data = [(torch.tensor(p + o), target_features(target, p + o))
            for p, o in zip(prompts[:32], outs[:32])]

    def acceptance() -> float:
        runs = [eagle_runs(head, target, p, o, 4)[0][1:] for p, o in zip(prompts[32:], outs[32:])]
        return float(np.mean(np.concatenate(runs) >= 1))

    before = acceptance()
    spec = TrainSpec(epochs=20, lr=3e-3, warmup_steps=5, sequences_per_step=4, depths=2)
    curve = train_head(head, data, spec, log=lambda _: None)
    return target, head, before, acceptance(), curve


def test_a_two_layer_head_trains_and_round_trips_with_its_layers(trained, tmp_path):
    _, head, before, after, curve = trained
    assert curve[-1]["loss"] < 0.85 * curve[0]["loss"]
    assert after > before + 0.15, (before, after)
    save_head(head, tmp_path / "two.npz", {"trained_on": "test"})
    loaded = load_head(new_target(), tmp_path / "two.npz")
    assert loaded.meta["layers"] == 2 and len(loaded.layers) == 2
    for name, p in head_state(head).items():
        torch.testing.assert_close(head_state(loaded)[name], p.detach().half().float())
    with np.load(tmp_path / "two.npz") as data:  # a file whose meta lost its layer count
        arrays = {n: data[n] for n in data.files}
    arrays["meta"] = np.asarray(str(arrays["meta"]).replace('"layers": 2', '"layers": 1'))
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=r"bad.npz: weights .* != expected"):
        load_head(new_target(), tmp_path / "bad.npz")


def test_the_shipped_one_layer_file_loads_as_one_layer():
    assert read_meta(SHIPPED_HEAD).get("layers", 1) == 1  # files before layer counts: one
    with np.load(SHIPPED_HEAD) as data:
        assert "layer.qkv" in data.files and not any(n.startswith("layers.") for n in data.files)


@pytest.mark.parametrize("int8", [False, True], ids=["fp", "int8"])
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_live_two_layer_eagle_is_lossless_and_accepts_what_eagle_runs_records(trained, tmp_path,
                                                                              chunked, int8):
    target, head, *_ = trained
    if int8:
        save_head(head, tmp_path / "h.npz", {"trained_on": "test"})
        head = load_head(target, tmp_path / "h.npz").quantize()
        assert all(type(layer.qkv).__name__ == "Int8Weight" for layer in head.layers)
    assert_live_eagle_lossless(target, head, chunked)


def test_head_graph_buffers_give_the_eager_head_pass():
    """What the head's CUDA graph replays, run on the CPU through the same static buffers: a
    chain's pass (predicted features, one entry each) and a ragged catch-up (true fused
    features), padded, give the eager head's last features and draft logits, and the same
    cache lengths."""
    from dataclasses import replace

    target = sharpened(LlamaModel.random(replace(config_for(TINY), paged=True), seed=0))
    target.set_feature_layers(FUSED)
    head = two_layer_head(target)
    gen = torch.Generator().manual_seed(3)
    hidden = TINY.hidden

    def caches_after_prompts():
        caches = [head.new_cache(64) for _ in range(3)]
        prompts = [torch.randint(TINY.vocab, (n,), generator=torch.Generator().manual_seed(n))
                   for n in (5, 9, 2)]
        feats = [torch.randn(len(p), head.feature_width, generator=torch.Generator()
                             .manual_seed(10 + len(p))) for p in prompts]
        head(prompts, feats, caches)
        return caches

    graphed, eager = caches_after_prompts(), caches_after_prompts()
    steps = [([1, 1, 1], hidden), ([2, 1, 3], head.feature_width)]
    for sizes, width in steps:
        tokens = [torch.randint(TINY.vocab, (n,), generator=gen) for n in sizes]
        features = [torch.randn(n, width, generator=gen) for n in sizes]
        runner = head._graph_runner(graphed[0].pool, width)
        got_hidden, got_logits = runner.run(tokens, graphed, last=True, features=features)
        want_hidden, want_logits = head(tokens, features, eager)
        torch.testing.assert_close(torch.cat(got_hidden), want_hidden, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.cat(got_logits), want_logits, atol=1e-5, rtol=1e-5)
        assert [c.length for c in graphed] == [c.length for c in eager]

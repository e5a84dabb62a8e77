"""The quant:BITS drafter (fake-quantised self-draft) and the tuned lens of early-exit:L:lens:
literal rounding cases, quality ordered by bits, the lens's least squares, its save/load checks,
and losslessness of both in the live engine."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.engine import LinearLatency  # noqa: E402

from drafters import make_drafter  # noqa: E402
from drafters.early_exit import lens_drafter  # noqa: E402
from drafters.quantised import fake_quantize, quantized_copy  # noqa: E402
from drafters.tuned_lens import fit_lens, hidden_pairs, lens_path, load_lens  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig, StepCostModel  # noqa: E402
from simulator.catalog import ModelShape  # noqa: E402
from traces import Workload  # noqa: E402

TINY = ModelShape(name="tiny-ql", layers=3, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128,
                  vocab=97, tied_embeddings=True, source="test")


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel.random(config_for(TINY), seed=2)


def sequences(n: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, TINY.vocab, length).tolist() for _ in range(n)]


def test_fake_quantize_literal_group():
    # one group of 4 rows, one column: min 0, max 3 -> 2 bits hit every value exactly
    w = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    assert torch.equal(fake_quantize(w, 2, group=4), w)
    # 1 bit: two levels, min and max; the midpoint-or-above rounds up
    got = fake_quantize(torch.tensor([[0.0], [1.4], [1.6], [3.0]]), 1, group=4)
    assert got.flatten().tolist() == [0.0, 0.0, 3.0, 3.0]
    flat = torch.full((4, 2), 0.5)  # a constant group stays exact (no division by zero)
    assert torch.equal(fake_quantize(flat, 3, group=4), flat)
    with pytest.raises(ValueError, match="groups of 32"):
        fake_quantize(torch.zeros(40, 2), 4)
    with pytest.raises(ValueError, match="bits"):
        fake_quantize(torch.zeros(32, 2), 0)


def test_quantized_copy_error_shrinks_with_bits_and_leaves_the_target_alone(target):
    before = target.layers[0].qkv.clone()
    errors = []
    for bits in (2, 4, 8):
        model = quantized_copy(target, bits)
        errors.append(float((model.layers[0].qkv - target.layers[0].qkv).abs().max()))
        assert torch.equal(model.layers[0].attn_norm, target.layers[0].attn_norm)
        assert model.config.shape.name == f"tiny-ql-Q{bits}"
    assert errors[0] > errors[1] > errors[2] > 0
    assert torch.equal(target.layers[0].qkv, before)


def test_quant_drafter_by_name_and_refusals(target):
    drafter = make_drafter("quant:8", target)
    assert drafter.name == "quant:8" and drafter.model is not target
    for bad in ("quant:", "quant:x", "quant:0", "quant:17"):
        with pytest.raises(ValueError, match="quant:BITS"):
            make_drafter(bad, target)


def test_fit_lens_recovers_an_affine_map():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 8, generator=gen, dtype=torch.float64)
    w = torch.randn(8, 8, generator=gen, dtype=torch.float64)
    b = torch.randn(8, generator=gen, dtype=torch.float64)
    weight, bias = fit_lens(x, x @ w + b, ridge=1e-9)
    assert torch.allclose(weight, w, atol=1e-6) and torch.allclose(bias, b, atol=1e-6)
    with pytest.raises(ValueError, match="same"):
        fit_lens(x, x[:, :4])


def test_hidden_mode_and_an_identity_exit_map_change_nothing(target):
    tokens = torch.tensor(sequences(1, 12, 1)[0])
    logits = target([tokens], [target.new_cache(16)], logits="all")[0]
    hidden = target([tokens], [target.new_cache(16)], logits="hidden")[0]
    assert hidden.shape == (12, TINY.hidden)
    eye = torch.eye(TINY.hidden), torch.zeros(TINY.hidden)
    target.exit_map = eye
    try:
        mapped = target([tokens], [target.new_cache(16)], logits="all")[0]
    finally:
        target.exit_map = None
    assert torch.allclose(mapped, logits, atol=1e-5)


def test_lens_brings_the_early_exit_closer_to_the_target(target, tmp_path):
    """Fitted on some sequences, judged on others: the lens's layer-1 stream is nearer the last
    layer's than the raw layer-1 stream (least squares must not do worse than the identity)."""
    x, y = hidden_pairs(target, 1, sequences(12, 40, 3))
    weight, bias = fit_lens(x, y)
    xt, yt = hidden_pairs(target, 1, sequences(4, 40, 4))
    raw = float(((xt - yt) ** 2).mean())
    lensed = float(((xt @ weight + bias - yt) ** 2).mean())
    assert lensed < raw


def test_lens_drafter_fits_once_saves_and_reloads(target, tmp_path):
    calls = []

    def text():
        calls.append(1)
        return sequences(6, 30, 5), "random test sequences"

    first = lens_drafter(target, 1, text, cache_dir=tmp_path)
    assert first.name == "early-exit:1:lens" and lens_path(target, 1, tmp_path).is_file()
    second = lens_drafter(target, 1, text, cache_dir=tmp_path)
    assert len(calls) == 1  # the second one loaded the saved lens
    assert torch.equal(first.model.exit_map[0], second.model.exit_map[0])
    assert target.exit_map is None  # the early exit's map, not the target's
    with pytest.raises(ValueError, match="layer 2"):
        load_lens(lens_path(target, 1, tmp_path), target, 2)
    with pytest.raises(ValueError, match="no tuned lens"):
        lens_drafter(target, 2, None, cache_dir=tmp_path)


@pytest.mark.parametrize("kind", ["quant:3", "lens"])
def test_quant_and_lens_drafters_are_lossless_in_the_live_engine(target, tmp_path, kind):
    prompts = sequences(4, 10, 7)
    n_out = 12
    reference = []
    for p in prompts:
        cache = target.new_cache(64)
        logits = target([torch.tensor(p)], [cache], logits="last")[0][0]
        out = []
        for _ in range(n_out):
            out.append(int(logits.argmax()))
            logits = target([torch.tensor([out[-1]])], [cache], logits="last")[0][0]
        reference.append(out)
    if kind == "lens":
        drafter = lens_drafter(target, 1, lambda: (sequences(6, 30, 5), "test"),
                               cache_dir=tmp_path)
    else:
        drafter = make_drafter(kind, target)
    wl = Workload(arrival_s=np.zeros(4), prompt_tokens=np.full(4, 10),
                  output_tokens=np.full(4, n_out), request_ids=np.arange(4), source="test")
    sched = SchedulerConfig(max_num_seqs=4, k_max=4, kv_capacity_tokens=10_000)
    engine = LiveEngine(target, drafter, make_policy("fixed", {"k": 3}), sched,
                        cost=StepCostModel(LinearLatency()))
    result = engine.run(wl, prompts, realtime=False)
    assert [list(o) for o in result.outputs] == reference
    assert result.requests.drafted.sum() > 0

"""Tensor parallelism: the ring all-reduce and the KV split on hand-computed cases, the errors,
a pass at TP 1 costing what it always did to the bit, and how a 70B decode scales with N."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.catalog import (
    GpuSpec,
    get_gpu,
    get_model,
    gpu_names,
    kv_capacity_tokens,
    model_names,
)
from simulator.errors import ConfigError
from simulator.latency import attention_pairs
from simulator.roofline import RooflineLatency
from simulator.step_cost import StepCostModel
from simulator.tensor_parallel import (
    allreduce_latency_s,
    check_degree,
    group_kv_capacity_tokens,
    kv_bytes_per_token_per_gpu,
    kv_heads_per_gpu,
    params_per_gpu,
    ring_allreduce_s,
)

H100, A100 = get_gpu("H100-SXM"), get_gpu("A100-80GB")
L70, L1 = get_model("Llama-3.1-70B"), get_model("Llama-3.2-1B")


# -- the all-reduce ------------------------------------------------------------------------------

def test_ring_allreduce_on_literal_cases():
    # 1 token x 8192 hidden x 2 bytes = 16,384 B. At N = 4 each GPU sends 2(4-1)/4 = 1.5 x that,
    # 24,576 B, over 450e9 B/s: 5.4613333e-8 s; plus 6 us of latency: 6.0546133e-6 s.
    assert ring_allreduce_s(16384, 4, 450e9, 6e-6) == pytest.approx(6.0546133333333e-6, rel=1e-12)
    # N = 2: 2(1)/2 = 1 x 16,384 B / 450e9 = 3.6408889e-8 s, + 6 us.
    assert ring_allreduce_s(16384, 2, 450e9, 6e-6) == pytest.approx(6.0364088888889e-6, rel=1e-12)
    # N = 8 over NVLink 3 (300e9): 1.75 x 16,384 = 28,672 B / 300e9 = 9.5573333e-8 s, + 6 us.
    assert ring_allreduce_s(16384, 8, 300e9, 6e-6) == pytest.approx(6.0955733333333e-6, rel=1e-12)
    # a 4,096-token prefill chunk, 4096 x 8192 x 2 = 67,108,864 B, over PCIe Gen4 (32e9) at
    # N = 2 with no latency: 1 x 67,108,864 / 32e9 = 2.097152e-3 s
    assert ring_allreduce_s(4096 * 8192 * 2, 2, 32e9, 0.0) == pytest.approx(2.097152e-3, rel=1e-12)
    assert ring_allreduce_s(16384, 1, 450e9, 6e-6) == 0.0  # one GPU: nothing to reduce


def test_an_allreduce_points_fixed_cost_grows_with_the_group():
    # the defaults: 32.5 us, + 1.75 us per GPU past the first
    assert allreduce_latency_s(32.5e-6, 1.75e-6, 2) == pytest.approx(34.25e-6, rel=1e-12)
    assert allreduce_latency_s(32.5e-6, 1.75e-6, 4) == pytest.approx(37.75e-6, rel=1e-12)
    assert allreduce_latency_s(32.5e-6, 1.75e-6, 8) == pytest.approx(44.75e-6, rel=1e-12)


def test_a_pass_pays_two_allreduces_per_layer():
    lat = RooflineLatency(L70, None, H100, tp=4)
    # 80 layers x 2 = 160 all-reduces of the case above, each 5.4613333e-8 s of transfer plus
    # the default fixed cost at N = 4, 37.75 us: 160 x 3.7804613e-5 = 6.0487381e-3 s
    assert lat.allreduce_s("target", 1) == pytest.approx(6.0487381333333e-3, rel=1e-12)
    # 64 query tokens: 1.5 x 64 x 16,384 B = 1,572,864 B / 450e9 = 3.4952533e-6 s, + 37.75 us
    # = 4.1245253e-5 s, x 160 = 6.5992405e-3 s
    assert lat.allreduce_s("target", 64) == pytest.approx(6.5992405333333e-3, rel=1e-12)
    # the pass time holds exactly that on top of the one-GPU roofline of a quarter of the work
    args = ("target", 1, 1, 1024, attention_pairs(1, 1024))
    no_comm = RooflineLatency(L70, None, H100, tp=4, params=dataclasses.replace(
        lat.params, allreduce_latency_s=0.0, allreduce_latency_per_gpu_s=0.0))
    gap = lat.pass_s(*args) - no_comm.pass_s(*args)
    assert gap == pytest.approx(160 * 37.75e-6, rel=1e-9)
    assert lat.allreduce_s("draft", 1) == 0.0  # a model-free drafter runs on no GPU


# -- the KV split --------------------------------------------------------------------------------

def test_kv_capacity_of_llama_70b_on_four_h100s():
    # One GPU's share of Llama-3.1-70B at TP 4 (hidden 8192, 64 heads of 128, 8 KV heads, FFN
    # 28672, 80 layers, vocab 128256, untied):
    #   q + o    2 x 8192 x 8192 / 4         =  33,554,432
    #   k + v    2 x 8192 x (8/4 heads x 128) =   4,194,304
    #   MLP      3 x 8192 x 28672 / 4        = 176,160,768
    #   norms    2 x 8192 (copied)           =      16,384
    #   layer                                = 213,925,888; x 80 = 17,114,071,040
    #   + final norm 8,192 + embedding and LM head 2 x 128256 x 8192 / 4 = 525,336,576
    #   = 17,639,415,808 parameters = 35,278,831,616 bytes in bf16
    assert params_per_gpu(L70, 4) == 17_639_415_808
    # Usable per GPU: 81,559 MiB x 0.9 - 2 GiB = 76,968,728,985.6 - 2,147,483,648
    #   = 74,821,245,337.6 B; less the weights: 39,542,413,721.6 B.
    # KV per token on one GPU: K and V x 80 layers x 2 heads x 128 x 2 B = 81,920 B.
    # 39,542,413,721.6 / 81,920 = 482,695.48 -> 482,695 tokens.
    assert kv_bytes_per_token_per_gpu(L70, 4) == 81_920
    assert group_kv_capacity_tokens(H100, L70, tp=4) == 482_695
    # Llama-3.2-1B drafting at TP 1 sits on GPU 0 with its whole self: 1,235,814,400 params
    # (2,471,628,800 B) and 2 x 16 x 8 x 64 x 2 = 32,768 B of KV per token. GPU 0 has
    # 39,542,413,721.6 - 2,471,628,800 = 37,070,784,921.6 B for 81,920 + 32,768 = 114,688 B
    # per token: 323,231.7 -> 323,231 tokens, the group's capacity.
    assert L1.params == 1_235_814_400
    assert group_kv_capacity_tokens(H100, L70, L1, tp=4) == 323_231
    # At the target's degree the draft splits too. Its share (hidden 2048, 32 heads of 64, 8 KV
    # heads, FFN 8192, 16 layers, tied vocab 128256):
    #   q + o 2 x 2048 x 2048 / 4 = 2,097,152; k + v 2 x 2048 x (2 x 64) = 524,288;
    #   MLP 3 x 2048 x 8192 / 4 = 12,582,912; norms 4,096; layer 15,208,448, x 16 = 243,335,168
    #   + final norm 2,048 + tied head 128256 x 2048 / 4 = 65,667,072 -> 309,004,288 params
    #   = 618,008,576 B; KV 2 x 16 x 2 x 64 x 2 = 8,192 B per token.
    # (39,542,413,721.6 - 618,008,576) / (81,920 + 8,192) = 431,955.4 -> 431,955 tokens.
    assert params_per_gpu(L1, 4) == 309_004_288
    assert group_kv_capacity_tokens(H100, L70, L1, tp=4, draft_tp=4) == 431_955


def test_kv_heads_beyond_n_are_copied():
    # Llama-3.1-70B has 8 KV heads: at TP 8 one each, no copy
    assert kv_heads_per_gpu(L70, 8) == 1
    assert kv_bytes_per_token_per_gpu(L70, 8) == L70.kv_bytes_per_token() // 8
    # a model of 2 KV heads at TP 4: each GPU keeps one head (every head twice in the group),
    # 2 x 32 layers x 1 head x 128 x 2 B = 16,384 B per token per GPU, not 32,768 / 4 = 8,192
    two = dataclasses.replace(get_model("Llama-3.1-8B"), kv_heads=2)
    check_degree(two, 4)
    assert kv_heads_per_gpu(two, 4) == 1
    assert kv_bytes_per_token_per_gpu(two, 4) == 16_384
    # its k/v projections are copied with their heads: one head's, 2 x 4096 x 128 = 1,048,576
    # per layer on every GPU (not 2 x 4096 x 256 / 4 = 524,288). One GPU's share:
    #   q + o 2 x 4096 x 4096 / 4 = 8,388,608; k + v 1,048,576; MLP 3 x 4096 x 14336 / 4
    #   = 44,040,192; norms 8,192; layer 53,485,568, x 32 = 1,711,538,176
    #   + final norm 4,096 + embedding and LM head 2 x 128256 x 4096 / 4 = 262,668,288
    #   = 1,974,210,560
    assert params_per_gpu(two, 4) == 1_974_210_560


def test_tp_one_capacity_is_the_one_gpu_capacity_to_the_token():
    for gpu in map(get_gpu, gpu_names()):
        for name in model_names():
            for draft in (None, get_model("Llama-68M")):
                try:
                    alone = kv_capacity_tokens(gpu, get_model(name), draft)
                except ConfigError:
                    continue
                assert group_kv_capacity_tokens(gpu, get_model(name), draft) == alone


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "degree", "message"), [
    ("Llama-3.1-70B", 3, "--tp must be one of 1, 2, 4, 8 (GPUs per replica), got 3"),
    ("Llama-3.1-70B", 16, "--tp must be one of 1, 2, 4, 8"),
    ("Qwen2.5-7B", 8, "--tp 8: Qwen2.5-7B's 28 attention heads do not split 8 ways; use --tp "
                      "1, 2 or 4"),
    ("SmolLM2-135M", 2, "9 attention heads do not split 2 ways; use --tp 1"),
])
def test_bad_degrees_are_one_line_errors(model, degree, message):
    with pytest.raises(ConfigError) as e:
        check_degree(get_model(model), degree)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_kv_heads_that_neither_split_nor_copy_evenly():
    odd = dataclasses.replace(get_model("Llama-3.1-8B"), heads=24, kv_heads=6, head_dim=128)
    with pytest.raises(ConfigError, match=r"6 KV heads neither split 4 ways .* use --tp 1 or 2"):
        check_degree(odd, 4)


def test_llama_70b_on_one_h100_does_not_fit_and_on_two_does():
    with pytest.raises(ConfigError, match=r"Llama-3\.1-70B .* no room .* on H100-SXM"):
        group_kv_capacity_tokens(H100, L70)
    assert group_kv_capacity_tokens(H100, L70, tp=2) > 0
    with pytest.raises(ConfigError, match=r"no room for a KV cache on 2 x L4"):
        group_kv_capacity_tokens(get_gpu("L4"), L70, tp=2)


def test_a_draft_degree_above_the_targets_or_a_gpu_without_a_link_is_refused():
    with pytest.raises(ConfigError, match="--draft-tp 4 is more GPUs than the replica's --tp 2"):
        RooflineLatency(L70, L1, H100, tp=2, draft_tp=4)
    bare = GpuSpec("bare", H100.memory_bytes, 1e12, 1e14, "made up")
    with pytest.raises(ConfigError, match="bare names no interconnect"):
        RooflineLatency(L70, None, bare, tp=2)
    assert RooflineLatency(L70, None, bare).tp == 1  # one GPU needs no link


# -- TP 1 is unchanged; N scales a 70B decode ----------------------------------------------------

def test_tp_one_prices_every_pass_as_the_one_gpu_formula():
    """The pre-tensor-parallel formula, written out here, against the model at TP 1 (default
    and explicit), over arrays and scalars: the same floats."""
    target, draft, gpu = get_model("Llama-3.1-8B"), get_model("Llama-68M"), H100
    rng = np.random.default_rng(3)
    seqs = rng.integers(1, 64, 50)
    q = seqs * rng.integers(1, 6, 50)
    cached = seqs * rng.integers(0, 4000, 50)
    pairs = q * cached // seqs + q
    for lat in (RooflineLatency(target, draft, gpu), RooflineLatency(target, draft, gpu,
                                                                      tp=1, draft_tp=1)):
        p = lat.params
        bw = gpu.bandwidth_bytes_per_s * p.bandwidth_efficiency
        rate = gpu.bf16_flops_per_s * p.flops_efficiency
        for role, m in (("target", target), ("draft", draft)):
            memory = (m.weight_params_read_per_pass * 2 / bw
                      + m.kv_bytes_per_token(2) / bw * (cached + q))
            compute = m.flops_per_token / rate * q + 4.0 * m.layers * m.heads * m.head_dim / \
                rate * pairs
            want = np.maximum(memory, compute) + (p.pass_fixed_s + m.layers * p.per_layer_s)
            got = lat.pass_s(role, seqs, q, cached, pairs)
            assert np.array_equal(got, want)
            assert [lat.pass_s(role, *map(int, a)) for a in zip(seqs, q, cached, pairs)] \
                == want.tolist()
        assert "tensor parallel" not in lat.source


def _decode_step(tp: int) -> tuple[float, float]:
    """(seconds of one decode step of Llama-3.1-70B at batch 1, 1,024 tokens of context, on
    `tp` H100s; the all-reduces' seconds in it)."""
    lat = RooflineLatency(L70, None, H100, tp=tp)
    return StepCostModel(lat).step_s([0], [1024]), lat.allreduce_s("target", 1)


def test_a_70b_decode_step_is_cheaper_at_tp4_than_tp2_and_communication_grows_with_n():
    (t2, c2), (t4, c4), (t8, c8) = _decode_step(2), _decode_step(4), _decode_step(8)
    assert t8 < t4 < t2
    # half the bytes per GPU, plus the same launches and more communication: 0.62 (TensorRT-LLM
    # 0.9.0 published 12.03 / 17.27 ms = 0.70 for Llama-2-70B fp8, benchmarks/tp_published.py)
    assert 0.55 < t4 / t2 < 0.7
    assert c2 < c4 < c8
    assert c2 / t2 < c4 / t4 < c8 / t8  # the all-reduce share grows with N


def test_draft_degree_prices_the_draft_pass():
    one = RooflineLatency(L70, L1, H100, tp=4)
    same = RooflineLatency(L70, L1, H100, tp=4, draft_tp=4)
    args = ("draft", 1, 1, 1024, attention_pairs(1, 1024))
    alone = RooflineLatency(L1, None, H100)
    assert one.pass_s(*args) == alone.pass_s("target", *args[1:])  # on one GPU: as a target
    assert same.allreduce_s("draft", 1) == pytest.approx(2 * 16 * ring_allreduce_s(
        2048 * 2, 4, 450e9, 37.75e-6), rel=1e-12)
    assert same.pass_s(*args) > same.allreduce_s("draft", 1)
    assert "draft at TP 4" in same.source and "draft on one GPU" in one.source


def test_arrays_match_scalars_in_a_group():
    lat = RooflineLatency(L70, L1, H100, tp=8, draft_tp=2)
    batch = np.array([1, 4, 16, 64])
    ctx = np.array([0, 128, 1024, 4096])
    q = np.array([1, 5, 3, 2])
    args = (batch, batch * q, batch * ctx, batch * attention_pairs(q, ctx))
    for role in ("target", "draft"):
        vec = lat.pass_s(role, *args)
        assert vec.tolist() == [lat.pass_s(role, *(int(a[i]) for a in args)) for i in range(4)]
    cost = StepCostModel(RooflineLatency(L70, None, H100, tp=4))
    rows = [[0, 2, 4], [3, 3, 3], [1, 0, 5]]
    assert cost.steps_s(rows, [100, 2000, 5000]) == [cost.step_s(r, [100, 2000, 5000])
                                                     for r in rows]


def test_every_gpu_names_its_interconnect_from_its_datasheet():
    # per direction per GPU: half the datasheets' both-ways totals (900, 600 and 64 GB/s)
    want = {"H100-SXM": 450e9, "H200": 450e9, "A100-80GB": 300e9, "L4": 32e9}
    for name in gpu_names():
        link = get_gpu(name).interconnect
        assert link is not None and link.bytes_per_s == want[name]
        assert "datasheet" in link.source and name.split("-")[0] in link.source


def test_the_allreduce_points_defaults_are_the_fit_on_published_steps():
    """RooflineParams' two all-reduce constants are what benchmarks/tp_published.py fits on
    TensorRT-LLM's published 70B decode steps (source A), and the held-out sources stay within
    the error docs/tensor-parallel.md reports."""
    import statistics
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    try:
        import tp_published
    finally:
        sys.path.pop(0)
    from simulator.roofline import RooflineParams

    train = [r for r in tp_published.PUBLISHED if r.source == "A" and r.tp > 1]
    held = [r for r in tp_published.PUBLISHED if r.source != "A" and r.tp > 1]
    fixed, per_gpu = tp_published.fit(train)
    defaults = RooflineParams()
    assert fixed == pytest.approx(defaults.allreduce_latency_s, rel=1e-12)
    assert per_gpu == pytest.approx(defaults.allreduce_latency_per_gpu_s, rel=1e-12)
    errors = tp_published.errors(held, defaults)
    assert statistics.median(abs(e) for e in errors) == pytest.approx(12.9, abs=0.05)

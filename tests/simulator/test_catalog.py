"""Catalog: shapes match published parameter counts, names resolve, KV capacity is sane."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.catalog import (
    GpuSpec,
    ModelShape,
    get_gpu,
    get_model,
    gpu_names,
    kv_capacity_tokens,
    model_names,
)
from simulator.errors import ConfigError

# Published totals: Meta's and Qwen's model cards, the JackFram repo names, SmolLM2's card.
PUBLISHED_PARAMS = {
    "Llama-2-7B": 6.74e9,
    "Llama-2-13B": 13.0e9,
    "Llama-2-70B": 69.0e9,
    "Llama-3.1-8B": 8.03e9,
    "Llama-3.1-70B": 70.6e9,
    "Llama-3.2-1B": 1.23e9,
    "Qwen2.5-7B": 7.61e9,
    "Qwen2.5-0.5B": 0.49e9,
    "Llama-68M": 68e6,
    "Llama-160M": 160e6,
    "SmolLM2-135M": 134.5e6,
    # not published: the tied embedding (49152 x 576) + 4 of SmolLM2's 30 layers + final norm
    "SmolLM2-135M-EE4": 49152 * 576 + 4 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
                                           + 2 * 576) + 576,
    # not published: Llama-3.1-8B's embedding and head (128256 x 4096 each) + 26 of its 32 layers
    # + final norm
    "Llama-3.1-8B-EE26": 2 * 128256 * 4096 + 26 * (2 * 4096 * 4096 + 2 * 4096 * 1024
                                                   + 3 * 4096 * 14336 + 2 * 4096) + 4096,
}


def test_every_catalogued_model_has_a_published_total():
    assert set(model_names()) == set(PUBLISHED_PARAMS)


@pytest.mark.parametrize(("name", "published"), sorted(PUBLISHED_PARAMS.items()))
def test_parameter_totals_match_published_sizes(name, published):
    assert get_model(name).params == pytest.approx(published, rel=0.02)


def test_qwen_non_embedding_counts_match_its_cards():
    # Qwen2.5 cards: 0.5B has 0.36B non-embedding, 7B has 6.53B.
    assert get_model("Qwen2.5-0.5B").non_embedding_params == pytest.approx(0.36e9, rel=0.01)
    assert get_model("Qwen2.5-7B").non_embedding_params == pytest.approx(6.53e9, rel=0.01)


def test_llama_3_1_8b_derived_quantities():
    m = get_model("llama-3.1-8b")
    embedding = 128256 * 4096
    assert m.params == m.non_embedding_params + 2 * embedding
    assert m.weight_params_read_per_pass == m.params - embedding  # the input gather is not read
    assert m.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert m.kv_bytes_per_token(1) == 65536
    # 2 FLOPs per matmul weight: layer projections plus the LM head, norms excluded.
    assert m.flops_per_token == 2 * m.matmul_params
    assert m.matmul_params == m.weight_params_read_per_pass - (2 * 32 + 1) * 4096


def test_tied_model_reads_its_embedding_once_as_lm_head():
    m = get_model("SmolLM2-135M")
    assert m.tied_embeddings
    assert m.weight_params_read_per_pass == m.params
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (30, 576, 9, 3, 64)


def test_qkv_bias_is_counted_but_negligible():
    qwen = get_model("Qwen2.5-7B")
    plain = dataclasses.replace(qwen, qkv_bias=False)
    assert qwen.params - plain.params == 28 * (28 + 2 * 4) * 128
    assert (qwen.params - plain.params) / qwen.params < 1e-4


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("h100", "H100-SXM"),
        ("H100-SXM", "H100-SXM"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("a100", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("nvidia h200", "H200"),
        ("L4", "L4"),
    ],
)
def test_gpu_aliases(alias, name):
    assert get_gpu(alias).name == name


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("llama-3.1-8b", "Llama-3.1-8B"),
        ("meta-llama/Llama-3.1-8B", "Llama-3.1-8B"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
        ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B"),
        ("JackFram/llama-68m", "Llama-68M"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen2.5-0.5B"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M"),
    ],
)
def test_model_aliases(alias, name):
    assert get_model(alias).name == name


def test_unknown_names_list_the_known_ones_on_one_line():
    with pytest.raises(ConfigError, match=r"^unknown model 'foo'; known: Llama-2-7B, ") as e:
        get_model("foo")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^unknown GPU 'tpu'; known: .*H100-SXM"):
        get_gpu("tpu")
    assert gpu_names() == ["A100-80GB", "H100-SXM", "H200", "L4"]


def test_gpu_peaks_are_dense_bf16():
    h100 = get_gpu("h100")
    assert h100.bf16_flops_per_s == 989e12  # not the 1,979 "with sparsity"
    assert h100.bandwidth_bytes_per_s == 3.35e12
    assert get_gpu("l4").bf16_flops_per_s == 121e12
    assert "datasheet" in h100.source


def test_invalid_shapes_and_gpus_are_config_errors():
    m = get_model("llama-68m")
    with pytest.raises(ConfigError, match="multiple of kv_heads"):
        dataclasses.replace(m, kv_heads=5)
    with pytest.raises(ConfigError, match="layers must be an int >= 1"):
        dataclasses.replace(m, layers=0)
    with pytest.raises(ConfigError, match="needs a name and a source"):
        dataclasses.replace(m, source="")
    with pytest.raises(ConfigError, match="bandwidth_bytes_per_s must be > 0"):
        GpuSpec("x", 1, 0.0, 1.0, "made up")
    assert isinstance(m, ModelShape)


def test_kv_capacity_counts_weights_and_both_caches():
    gpu, target, draft = get_gpu("h100"), get_model("llama-3.1-8b"), get_model("llama-68m")
    reserve = 2 * 2**30
    alone = kv_capacity_tokens(gpu, target, activation_reserve_bytes=reserve)
    free = gpu.memory_bytes * 0.9 - reserve - target.params * 2
    assert alone == int(free // 131072)
    both = kv_capacity_tokens(gpu, target, draft, activation_reserve_bytes=reserve)
    free_both = free - draft.params * 2
    assert both == int(free_both // (131072 + draft.kv_bytes_per_token(2)))
    assert 0 < both < alone
    # An 8B model on one H100: several hundred thousand tokens of cache.
    assert 300_000 < alone < 600_000


def test_kv_capacity_grows_with_memory_utilization():
    gpu, m = get_gpu("a100"), get_model("llama-2-7b")
    assert kv_capacity_tokens(gpu, m, memory_utilization=0.95) > kv_capacity_tokens(gpu, m)


def test_weights_that_do_not_fit_are_a_clear_error():
    with pytest.raises(ConfigError, match=r"Llama-3\.1-70B .* no room .* on L4") as e:
        kv_capacity_tokens(get_gpu("l4"), get_model("llama-3.1-70b"))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="memory_utilization"):
        kv_capacity_tokens(get_gpu("h100"), get_model("llama-68m"), memory_utilization=1.5)

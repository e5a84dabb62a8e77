"""The Llama decoder: a naive full-sequence reference, incremental and ragged-batch consistency,
KV-cache rollback, GQA, rotary embeddings, parameter counts and seeded initialisation."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from support.tiny_models import TINY  # noqa: E402

from models.kv_cache import BatchAttention, KVCache  # noqa: E402
from models.llama import (  # noqa: E402
    LlamaConfig,
    LlamaModel,
    RotaryTable,
    apply_rotary,
    config_for,
    greedy_tokens,
    rms_norm,
)
from models.paged_kv import PagedSeq  # noqa: E402
from simulator.catalog import ModelShape, get_model  # noqa: E402

THETA = 10_000.0
EPS = 1e-5
TIGHT = {"atol": 1e-5, "rtol": 1e-5}


def hf_state(shape: ModelShape, seed: int = 0, gain: float = 1.5) -> dict[str, torch.Tensor]:
    """Random weights under Hugging Face names, large enough that attention is far from uniform.

    Matrices have std gain / sqrt(fan_in), so activations and logits stay of order 1 (tolerances
    stay meaningful) while attention scores are large (a wrong mask or position shows).
    """
    gen = torch.Generator().manual_seed(seed)

    def rand(*size: int, scale: float | None = None) -> torch.Tensor:
        std = gain / math.sqrt(size[-1]) if scale is None else scale
        return torch.randn(*size, generator=gen) * std

    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    state = {"model.embed_tokens.weight": rand(shape.vocab, shape.hidden, scale=1.0)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = 1 + rand(shape.hidden, scale=0.1)
        state[p + "post_attention_layernorm.weight"] = 1 + rand(shape.hidden, scale=0.1)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            state[p + f"self_attn.{name}_proj.weight"] = rand(rows, shape.hidden)
            if shape.qkv_bias:
                state[p + f"self_attn.{name}_proj.bias"] = rand(rows, scale=0.5)
        state[p + "self_attn.o_proj.weight"] = rand(shape.hidden, q)
        state[p + "mlp.gate_proj.weight"] = rand(shape.ffn, shape.hidden)
        state[p + "mlp.up_proj.weight"] = rand(shape.ffn, shape.hidden)
        state[p + "mlp.down_proj.weight"] = rand(shape.hidden, shape.ffn)
    state["model.norm.weight"] = 1 + rand(shape.hidden, scale=0.1)
    if not shape.tied_embeddings:
        state["lm_head.weight"] = rand(shape.vocab, shape.hidden)
    return state


def build(shape: ModelShape = TINY, seed: int = 0, **config) -> LlamaModel:
    model = LlamaModel(LlamaConfig(shape, rope_theta=THETA, rms_eps=EPS, **config))
    model.load_hf_state_dict(hf_state(shape, seed))
    return model


def naive_logits(shape: ModelShape, state: dict, tokens: torch.Tensor) -> torch.Tensor:
    """Full-sequence Llama in float64, one head at a time, written from the paper's equations."""
    w = {k: v.double() for k, v in state.items()}
    n, d, half = len(tokens), shape.head_dim, shape.head_dim // 2
    angles = torch.arange(n).double()[:, None] * THETA ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]

    def rope(t):  # rotate-half: dimension i pairs with i + d/2
        x1, x2 = t[..., :half], t[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def norm(x, weight):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight

    def proj(x, name, rows_per_head):
        out = x @ w[name + ".weight"].T + w.get(name + ".bias", 0)
        return out.view(n, rows_per_head, d)

    x = w["model.embed_tokens.weight"][tokens]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope(proj(h, p + "self_attn.q_proj", shape.heads))
        k = rope(proj(h, p + "self_attn.k_proj", shape.kv_heads))
        v = proj(h, p + "self_attn.v_proj", shape.kv_heads)
        heads = []
        for head in range(shape.heads):
            g = head // (shape.heads // shape.kv_heads)  # query head -> its KV group
            scores = (q[:, head] @ k[:, g].T / math.sqrt(d)).masked_fill(~causal, -math.inf)
            heads.append(scores.softmax(-1) @ v[:, g])
        x = x + torch.cat(heads, dim=-1) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head_weight = w["model.embed_tokens.weight" if shape.tied_embeddings else "lm_head.weight"]
    return norm(x, w["model.norm.weight"]) @ head_weight.T


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY.vocab, (n,), generator=torch.Generator().manual_seed(seed))


def prefilled(model: LlamaModel, prefix: torch.Tensor, capacity: int = 64) -> KVCache:
    cache = model.new_cache(capacity)
    if len(prefix):
        model([prefix], [cache])
    return cache


@pytest.mark.parametrize(
    "shape",
    [
        TINY,
        dataclasses.replace(TINY, kv_heads=4, tied_embeddings=True),
        dataclasses.replace(TINY, kv_heads=1, qkv_bias=True),
    ],
    ids=["gqa", "mha-tied", "mqa-bias"],
)
@pytest.mark.parametrize("paged", [False, True], ids=["per-request", "paged"])
def test_full_pass_matches_naive_reference(shape, paged):
    state = hf_state(shape, seed=1)
    model = LlamaModel(LlamaConfig(shape, rope_theta=THETA, rms_eps=EPS, paged=paged))
    model.load_hf_state_dict(state)
    seq = tokens(12, seed=2)
    (logits,) = model([seq], [model.new_cache()])
    expected = naive_logits(shape, state, seq)
    assert expected.std() > 1.0  # the weights are large enough for errors to show
    torch.testing.assert_close(logits.double(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("paged", [False, True], ids=["per-request", "paged"])
def test_incremental_decoding_equals_one_full_pass(paged):
    model = build(paged=paged)
    seq = tokens(12, seed=3)
    (full,) = model([seq], [model.new_cache()])
    cache = model.new_cache()
    steps = [seq[:5], *seq[5:9].split(1), seq[9:]]  # prefill 5, four single steps, then 3 at once
    parts = [model([step], [cache])[0] for step in steps]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(parts), full, **TIGHT)


def test_logits_last_is_the_last_row_of_all():
    model = build()
    seq = tokens(7, seed=4)
    (full,) = model([seq], [model.new_cache()])
    (last,) = model([seq], [model.new_cache()], logits="last")
    assert last.shape == (1, TINY.vocab)
    torch.testing.assert_close(last, full[-1:], **TIGHT)


def test_per_request_logits_and_features_come_from_one_pass():
    """A mixed iteration's pass: "all" rows for verified requests, the "last" row for prompts,
    and with features=True the "hidden" rows (fused layers' too) beside them, all equal to
    what separate calls give."""
    model = build()
    model.set_feature_layers([0])
    prefixes = [tokens(3, 1), tokens(0, 0), tokens(5, 2)]
    feeds = [tokens(3, 11), tokens(6, 12), tokens(1, 13)]
    modes = ["all", "last", "all"]
    logits, hidden = model(feeds,
                           [prefilled(model, p) for p in prefixes], logits=modes, features=True)
    for prefix, feed, mode, got, rows in zip(prefixes, feeds, modes, logits, hidden):
        (want,) = model([feed], [prefilled(model, prefix)], logits=mode)
        (want_rows,) = model([feed], [prefilled(model, prefix)], logits="hidden")
        assert got.shape == (len(feed) if mode == "all" else 1, TINY.vocab)
        assert rows.shape == (len(feed), 2 * TINY.hidden)
        torch.testing.assert_close(got, want, **TIGHT)
        torch.testing.assert_close(rows, want_rows, **TIGHT)


def check_ragged(model: LlamaModel, cached: list[int], new: list[int], seed: int) -> None:
    """A batch call gives each request the logits (and cache) it gets when run alone."""
    prefixes = [tokens(c, seed + r) for r, c in enumerate(cached)]
    feeds = [tokens(q, seed + 100 + r) for r, q in enumerate(new)]
    batch_caches = [prefilled(model, p) for p in prefixes]
    batched = model(feeds, batch_caches, logits="all")
    for prefix, feed, out, cache in zip(prefixes, feeds, batched, batch_caches):
        alone_cache = prefilled(model, prefix)
        (alone,) = model([feed], [alone_cache])
        assert out.shape == (len(feed), TINY.vocab)
        torch.testing.assert_close(out, alone, **TIGHT)
        assert cache.length == alone_cache.length == len(prefix) + len(feed)
        torch.testing.assert_close(cached_keys(cache, 1), cached_keys(alone_cache, 1), **TIGHT)


def cached_keys(cache: KVCache | PagedSeq, layer: int) -> torch.Tensor:
    """The keys [kv_heads, length, head_dim] of the cached positions, in position order."""
    if isinstance(cache, PagedSeq):
        return cache.pool.keys[layer][cache.slots(0, cache.length)].transpose(0, 1)
    return cache.keys[layer][:, : cache.length]


@pytest.mark.parametrize("paged", [False, True], ids=["per-request", "paged"])
def test_ragged_batch_equals_per_request_calls(paged):
    # cached 0 (a prefill inside the batch), 7 and 3; new 4, 1 and 3 (a verify with a cache)
    check_ragged(build(paged=paged), cached=[0, 7, 3], new=[4, 1, 3], seed=10)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5)), min_size=1, max_size=4),
    st.integers(0, 1000),
    st.booleans(),
)
def test_ragged_batch_property(requests, seed, paged):
    cached, new = zip(*requests)
    check_ragged(build(paged=paged), list(cached), list(new), seed)


@pytest.mark.parametrize(("cached", "new"), [(5, 1), (5, 3), (0, 4)])
def test_uniform_fast_path_equals_per_request_path(cached, new):
    looped, batched = build(), build(batched_attention=True)
    assert not looped.config.batched_attention  # CPU default: the per-request loop
    prefixes = [tokens(cached, seed=20 + r) for r in range(3)]
    feeds = [tokens(new, seed=30 + r) for r in range(3)]
    caches = [prefilled(batched, p) for p in prefixes]
    assert BatchAttention([new] * 3, [c.clone() for c in caches], batched=True).uniform
    fast = batched(feeds, caches)
    slow = looped(feeds, [prefilled(looped, p) for p in prefixes])
    for prefix, feed, out, reference in zip(prefixes, feeds, fast, slow):
        torch.testing.assert_close(out, reference, **TIGHT)
        (alone,) = looped([feed], [prefilled(looped, prefix)])
        torch.testing.assert_close(out, alone, **TIGHT)


@pytest.mark.parametrize("paged", [False, True], ids=["per-request", "paged"])
def test_truncate_then_refeed_equals_never_feeding_the_rejected_tokens(paged):
    model = build(paged=paged)
    prefix, drafts, fresh = tokens(6, seed=40), tokens(4, seed=41), tokens(3, seed=42)
    cache = prefilled(model, prefix)
    model([drafts], [cache])  # verify 4 drafts, then accept only the first one
    cache.truncate(len(prefix) + 1)
    (rolled_back,) = model([fresh], [cache])
    clean = prefilled(model, torch.cat([prefix, drafts[:1]]))
    (expected,) = model([fresh], [clean])
    torch.testing.assert_close(rolled_back, expected, **TIGHT)
    with pytest.raises(ValueError):
        cache.truncate(cache.length + 1)


def test_gqa_equals_mha_with_duplicated_kv_heads():
    gqa_state = hf_state(TINY, seed=5)
    group, d = TINY.heads // TINY.kv_heads, TINY.head_dim
    mha_shape = dataclasses.replace(TINY, kv_heads=TINY.heads)
    mha_state = dict(gqa_state)
    for i in range(TINY.layers):
        for name in ("k", "v"):
            key = f"model.layers.{i}.self_attn.{name}_proj.weight"
            per_head = gqa_state[key].view(TINY.kv_heads, d, TINY.hidden)
            mha_state[key] = per_head.repeat_interleave(group, dim=0).reshape(-1, TINY.hidden)
    mha = LlamaModel(LlamaConfig(mha_shape, rope_theta=THETA, rms_eps=EPS))
    mha.load_hf_state_dict(mha_state)
    gqa = build(TINY, seed=5)
    seq = tokens(9, seed=6)
    torch.testing.assert_close(
        gqa([seq], [gqa.new_cache()])[0], mha([seq], [mha.new_cache()])[0], **TIGHT
    )


def test_rotary_matches_naive_rotate_half():
    d, theta = 16, 500_000.0
    table = RotaryTable(d, theta, torch.float32, torch.device("cpu"), capacity=8)
    positions = torch.tensor([0, 1, 2, 7, 37, 300])  # 300 is past the capacity: the table grows
    cos, sin = table.gather(positions, end=301)
    x = torch.randn(len(positions), 3, d, generator=torch.Generator().manual_seed(7))
    rotated = apply_rotary(x, cos, sin)
    inv_freq = (1.0 / theta ** (torch.arange(0, d, 2).float() / d)).double()
    for row, pos in enumerate(positions.tolist()):
        for i in range(d // 2):  # the pair (i, i + d/2) turns by pos * theta^(-2i/d)
            a = pos * inv_freq[i]
            x1, x2 = x[row, :, i].double(), x[row, :, i + d // 2].double()
            torch.testing.assert_close(
                rotated[row, :, i].double(), x1 * a.cos() - x2 * a.sin(), atol=1e-5, rtol=0
            )
            torch.testing.assert_close(
                rotated[row, :, i + d // 2].double(), x2 * a.cos() + x1 * a.sin(), atol=1e-5,
                rtol=0,
            )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_the_hugging_face_formula(dtype):
    gen = torch.Generator().manual_seed(12)
    x = (torch.randn(5, 64, generator=gen) * 3).to(dtype)
    weight = (1 + torch.randn(64, generator=gen) * 0.1).to(dtype)
    xf = x.float()
    expected = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(dtype)
    torch.testing.assert_close(rms_norm(x, weight, EPS), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("paged", [False, True], ids=["per-request", "paged"])
def test_float64_model_matches_the_reference_to_rounding(paged):
    # Another dtype end to end (bf16 matmuls can crash CPUs whose AMX the OS has not enabled)
    state = hf_state(TINY, seed=13)
    seq = tokens(10, seed=14)
    model = LlamaModel(LlamaConfig(TINY, rope_theta=THETA, rms_eps=EPS, dtype=torch.float64,
                                   paged=paged))
    model.load_hf_state_dict(state)
    cache = model.new_cache()
    logits = torch.cat([model([seq[:6]], [cache])[0], model([seq[6:]], [cache])[0]])
    assert logits.dtype == torch.float64
    # not 1e-12: rotary angles are fp32 in any dtype, as in Hugging Face
    torch.testing.assert_close(logits, naive_logits(TINY, state, seq), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("paged", [False, True], ids=["per-request", "paged"])
def test_cache_grows_past_its_capacity_without_changing_logits(paged):
    model = build(paged=paged)
    seq = tokens(10, seed=8)
    (full,) = model([seq], [model.new_cache(64)])
    small = model.new_cache(capacity=2)
    parts = [model([chunk], [small])[0] for chunk in seq.split(3)]
    assert small.capacity >= 10
    grown = small.pool.kv if paged else small.keys[0]
    assert not grown.is_inference()  # grown inside a forward pass, still writable outside
    torch.testing.assert_close(torch.cat(parts), full, **TIGHT)


@pytest.mark.parametrize("paged", [False, True], ids=["per-request", "paged"])
def test_clone_is_independent(paged):
    model = build(paged=paged)
    cache = prefilled(model, tokens(5, seed=9))
    fork = cache.clone()
    model([tokens(2, seed=10)], [cache])
    assert (cache.length, fork.length) == (7, 5)
    next_token = tokens(1, seed=11)
    (from_fork,) = model([next_token], [fork])
    (from_fresh,) = model([next_token], [prefilled(model, tokens(5, seed=9))])
    torch.testing.assert_close(from_fork, from_fresh, **TIGHT)


@pytest.mark.parametrize("name", ["SmolLM2-135M", "Llama-68M", "Qwen2.5-0.5B"])
def test_parameter_count_equals_the_shape(name):
    shape = get_model(name)
    model = LlamaModel(config_for(shape, device="meta"))
    assert sum(p.numel() for p in model.parameters()) == shape.params


def test_same_seed_same_weights():
    config = LlamaConfig(TINY)
    a, b, c = (
        LlamaModel.random(config, 3),
        LlamaModel.random(config, 3),
        LlamaModel.random(config, 4),
    )
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm"):
            assert not torch.equal(pa, pc), name
    assert a.norm.eq(1).all()
    assert 0.015 < a.embed.std().item() < 0.025


def test_config_for_uses_known_hyperparameters():
    assert config_for(get_model("SmolLM2-135M")).rope_theta == 100_000.0
    assert config_for(get_model("Llama-3.1-8B")).rope_theta == 500_000.0
    assert config_for(TINY).rope_theta == 10_000.0
    assert config_for(TINY, rope_theta=5.0, rms_eps=1e-6).rms_eps == 1e-6
    assert config_for(get_model("SmolLM2-135M")).tie_embeddings


@pytest.mark.parametrize("kwargs", [{"rope_theta": 0.0}, {"rms_eps": -1.0}, {"dtype": torch.int64}])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        LlamaConfig(TINY, **kwargs)


def test_forward_rejects_bad_calls():
    model = build()
    cache = model.new_cache()
    with pytest.raises(ValueError, match="logits"):
        model([tokens(2, 0)], [cache], logits="first")
    with pytest.raises(ValueError, match="per request"):
        model([tokens(2, 0)], [cache], logits=["all", "last"])
    with pytest.raises(ValueError, match="features=True"):
        model([tokens(2, 0)], [cache], logits="hidden", features=True)
    with pytest.raises(ValueError, match="cannot be mixed"):
        model([tokens(2, 0), tokens(2, 1)], [cache, model.new_cache()], logits=["hidden", "all"])
    with pytest.raises(ValueError, match="one cache per request"):
        model([tokens(2, 0), tokens(2, 1)], [cache])
    with pytest.raises(ValueError, match=">= 1 new token"):
        model([tokens(0, 0)], [cache])
    with pytest.raises(ValueError, match="twice"):
        model([tokens(2, 0), tokens(2, 1)], [cache, cache])
    with pytest.raises(ValueError, match="1-D"):
        model([tokens(4, 0).view(2, 2)], [cache])
    assert cache.length == 0


def test_load_rejects_missing_and_unknown_weights():
    model = LlamaModel(LlamaConfig(TINY))
    state = hf_state(TINY)
    del state["model.layers.1.self_attn.v_proj.weight"]
    with pytest.raises(ValueError, match="fills"):
        model.load_hf_state_dict(state)
    with pytest.raises(ValueError, match="unknown weight name"):
        model.load_hf_state_dict({**hf_state(TINY), "model.layers.0.extra.weight": torch.ones(1)})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_greedy_tokens_breaks_ties_as_argmax_does(dtype):
    """Plain decoding and verification must pick the same token on exact ties: rows drawn from
    four values have thousands of tied maxima, and the first one must win, as `argmax` has it."""
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 3, 80):
        logits = torch.randint(0, 4, (rows, 49152), generator=gen).to(getattr(torch, dtype))
        logits[0, 7] = 3  # a tie near the front, so "first" is not just index 0
        assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))
        view = logits[:, 5:]  # a strided view, as the per-request splits of a pass are
        assert torch.equal(greedy_tokens(view), view.argmax(dim=-1))


# -- the paged pool (models/paged_kv.py) ---------------------------------------------------------


def test_paged_tree_pass_and_keep_equal_the_per_request_caches():
    """A batch with a draft tree (siblings share positions, each node sees its ancestors) beside
    a plain verify: the paged pass gives the per-request path's logits, and keeping the accepted
    path then feeding on gives the same logits as the per-request cache."""
    from drafters.tree_layout import tree_layout

    parents = [-1, -1, 0, 0, 2]  # two roots' children, a branch under node 0, a leaf under 2
    outputs = []
    for paged in (False, True):
        model = build(paged=paged)
        caches = [prefilled(model, tokens(6, seed=50)), prefilled(model, tokens(4, seed=51))]
        feeds = [tokens(len(parents) + 1, seed=52), tokens(3, seed=53)]
        layouts = [tree_layout(parents, 6), None]
        logits = model(feeds, caches, layouts=layouts)
        caches[0].keep(6, [0, 1, 3, 5])  # the root, node 0, node 2, node 4
        after = model([tokens(2, seed=54)], [caches[0]])[0]
        outputs.append((logits, after, caches[0].length))
    (per_request, after_a, len_a), (paged_out, after_b, len_b) = outputs
    for a, b in zip(per_request, paged_out):
        torch.testing.assert_close(b, a, **TIGHT)
    assert len_a == len_b == 12
    torch.testing.assert_close(after_b, after_a, **TIGHT)


def test_paged_pool_accounting():
    from models.paged_kv import KVPool, KVPoolFull

    pool = KVPool(layers=1, kv_heads=1, head_dim=4, blocks=4, block_size=2, growable=False)
    assert pool.free_blocks == 3  # block 0 is the null block
    a = pool.sequence(3)  # 2 blocks
    assert len(a.blocks) == 2 and 0 not in a.blocks and a.capacity == 4
    with pytest.raises(KVPoolFull, match="1 of 3 free"):
        pool.sequence(4)
    a.release()
    assert pool.free_blocks == 3 and a.blocks == []
    b = pool.sequence(6)
    assert sorted(b.blocks) == [1, 2, 3]
    del b  # garbage-collected: its blocks come back
    assert pool.free_blocks == 3
    growable = KVPool(layers=1, kv_heads=1, head_dim=4, blocks=2, block_size=2)
    c = growable.sequence(1)
    growable.kv[:, :, c.slots(0, 1)] = 7.0
    d = growable.sequence(9)  # 5 more blocks: the storage doubles, what it held is kept
    assert growable.generation == 1 and growable.free_blocks >= 0
    assert (growable.kv[:, :, c.slots(0, 1)] == 7.0).all()
    assert len(set(c.blocks) | set(d.blocks)) == 6 and 0 not in d.blocks


def test_blocks_for_memory_literal_cases():
    from models.paged_kv import blocks_for_memory

    gib = 2**30
    # 60 GiB free of 80: 8 kept back (0.9 utilisation), 2 for activations: 50 GiB of 1 MiB blocks
    assert blocks_for_memory(60 * gib, 80 * gib, 2**20, 0.9, 2 * gib) == 50 * 1024
    assert blocks_for_memory(5 * gib, 80 * gib, 2**20, 0.9) == 0  # less free than kept back
    with pytest.raises(ValueError, match="utilisation"):
        blocks_for_memory(gib, gib, 1, 1.5)


@pytest.mark.parametrize("backend_width", [None, 64], ids=["pow2-width", "fixed-width"])
def test_graph_buffers_give_the_eager_logits(backend_width):
    """What a CUDA graph replays, run on the CPU: 3 requests padded to a batch of 8, their
    tokens and indices copied into static buffers: decode, verify of 3 tokens, ragged batches
    flattened (and "last" logits of one). Logits and caches equal the eager paged pass's."""
    from models.cuda_graphs import GraphRunner

    model, eager = build(paged=True), build(paged=True)
    runner = GraphRunner(model._graph_body, model.pool(), "torch", max_context=256,
                         row_multiple=8)
    if backend_width:
        runner.width_blocks = lambda longest: backend_width // model.pool().block_size
    prefixes = [tokens(n, seed=60 + n) for n in (5, 17, 1)]
    caches = [prefilled(model, p) for p in prefixes]
    references = [prefilled(eager, p) for p in prefixes]
    for q, seed, last in (((1, 1, 1), 70, False), ((3, 3, 3), 71, False), ((2, 3, 1), 72, False),
                          ((1, 3, 2), 73, True)):
        feeds = [tokens(n, seed=seed + r) for r, n in enumerate(q)]
        got = runner.run(feeds, caches, last=last)
        want = eager(feeds, references, logits="last" if last else "all")
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, **TIGHT)
    # uniform: 3 requests padded to 8 (rows a multiple of 8), 5 of them padding requests;
    # ragged (6 tokens): flattened, 8 token rows, attention over a [4, 3] layout
    assert {(key[0], key[1], key[3]) for key in runner.graphs} == {
        (8, 1, None), (8, 3, None), (4, 3, 8)}
    for cache, reference in zip(caches, references):
        assert cache.length == reference.length
        torch.testing.assert_close(cached_keys(cache, 0), cached_keys(reference, 0), **TIGHT)


def test_bucket_floor_keeps_rows_a_multiple_of_eight():
    from models.cuda_graphs import bucket_floor

    assert [bucket_floor(1, q) for q in (1, 2, 3, 4, 5, 8)] == [1, 8, 16, 4, 16, 2]
    assert [bucket_floor(b, 1) for b in (2, 3, 16, 17)] == [16, 16, 16, 17]
    assert bucket_floor(2, 6, multiple=8) == 4 and bucket_floor(3, 5, multiple=1) == 3


def test_compiled_layers_give_the_eager_logits():
    """torch.compile of the parts around attention (the CUDA default) computes the same pass:
    prefill, then a ragged decode/verify batch, on the paged path (~30 s of compiling here)."""
    eager, compiled = build(paged=True), build(paged=True, compiled=True)
    prefixes = [tokens(n, seed=80 + n) for n in (6, 11)]
    feeds = [tokens(1, seed=90), tokens(4, seed=91)]
    results = []
    for model in (eager, compiled):
        caches = [prefilled(model, p) for p in prefixes]
        results.append(model(feeds, caches))
    from models.llama import _COMPILED

    assert all(part.error is None for part in _COMPILED)  # compiled, not fallen back
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_weights_that_cannot_fit_are_one_line():
    from models.llama import weights_problem

    gib = 2**30
    assert weights_problem("Llama-3.1-8B", 8_030_000_000, 2, 70 * gib, 80 * gib, "cuda:0") is None
    line = weights_problem("Llama-3.1-70B", 70_550_000_000, 2, 79 * gib, 80 * gib, "cuda:0")
    assert line == ("Llama-3.1-70B needs 131.4 GiB for its weights (70.55 B parameters x 2 "
                    "bytes) and cuda:0 has 79.0 GiB free of 80.0: use a card with more memory "
                    "or a smaller model")

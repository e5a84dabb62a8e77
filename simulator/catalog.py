"""Model shapes and GPU specs: what the roofline needs to price a pass and to size a KV cache.

Shapes are Llama-style decoders (q/k/v/o projections, SwiGLU gate/up/down MLP, RMSNorm), taken
from each model's Hugging Face `config.json`. GPU numbers are the vendor's datasheet peaks, dense
bf16 (no 2:4 sparsity): the roofline derates them with measured efficiencies, never the reverse.
Each GPU names the link between the GPUs of a server (its `interconnect`), over which a
tensor-parallel group's all-reduces travel (simulator/tensor_parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """A decoder's dimensions; parameter counts and per-token costs are derived from them."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    source: str  # where the numbers come from, e.g. "config.json of meta-llama/Llama-3.1-8B"
    qkv_bias: bool = False  # Qwen2 adds biases to q/k/v (negligible bytes, counted for exactness)

    def __post_init__(self) -> None:
        if not self.name or not self.source:
            raise ConfigError(f"model shape needs a name and a source, got {self.name!r}")
        for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model {self.name}: {field} must be an int >= 1, got {value!r}")
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"model {self.name}: heads ({self.heads}) must be a multiple of kv_heads "
                f"({self.kv_heads})"
            )

    @property
    def _layer_matmul_params(self) -> int:
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attention = self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden
        return attention + 3 * self.hidden * self.ffn

    @property
    def _layer_params(self) -> int:
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return self._layer_matmul_params + bias + 2 * self.hidden  # + two RMSNorm weights

    @property
    def non_embedding_params(self) -> int:
        """Parameters outside the embedding and LM-head matrices (the convention of Qwen's card)."""
        return self.layers * self._layer_params + self.hidden  # + final RMSNorm

    @property
    def params(self) -> int:
        """All parameters; a tied LM head shares the embedding matrix and is counted once."""
        matrices = 1 if self.tied_embeddings else 2
        return self.non_embedding_params + matrices * self.vocab * self.hidden

    @property
    def weight_params_read_per_pass(self) -> int:
        """Parameters a forward pass streams from memory: every layer, the final norm, the LM head.

        The input embedding is a gather of a few rows, not a stream, so it is left out (for a
        tied model the same matrix is still read once, as the LM head).
        """
        return self.non_embedding_params + self.vocab * self.hidden

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a matrix product per token: layer projections and LM head."""
        return self.layers * self._layer_matmul_params + self.vocab * self.hidden

    @property
    def flops_per_token(self) -> int:
        """Matrix-product FLOPs per token, attention scores excluded (2 FLOPs per weight)."""
        return 2 * self.matmul_params

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes one token occupies in the KV cache: K and V, every layer, every KV head."""
        if dtype_bytes < 1:
            raise ConfigError(f"dtype_bytes must be >= 1, got {dtype_bytes}")
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes the weights occupy in device memory."""
        return self.params * dtype_bytes


@dataclass(frozen=True)
class Interconnect:
    """The GPU-to-GPU link of a server, as one GPU sees it: `bytes_per_s` is what one GPU can
    send in one direction (datasheets quote the sum of both directions; it is halved here),
    which is what bounds a ring all-reduce (every GPU sends and receives at once)."""

    name: str
    bytes_per_s: float
    source: str  # datasheet citation

    def __post_init__(self) -> None:
        if not self.name or not self.source:
            raise ConfigError(f"interconnect needs a name and a source, got {self.name!r}")
        if not self.bytes_per_s > 0:
            raise ConfigError(f"interconnect {self.name}: bytes_per_s must be > 0")


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's datasheet peaks; `bf16_flops_per_s` is dense (no sparsity).
    `interconnect`: the link between GPUs of one server (None: not known, and no tensor
    parallelism is priced on it)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    source: str  # datasheet citation
    interconnect: Interconnect | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.source:
            raise ConfigError(f"GPU spec needs a name and a source, got {self.name!r}")
        for field in ("memory_bytes", "bandwidth_bytes_per_s", "bf16_flops_per_s"):
            if not getattr(self, field) > 0:
                raise ConfigError(f"GPU {self.name}: {field} must be > 0")


def _llama(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    repo: str,
    tied: bool = False,
    qkv_bias: bool = False,
) -> ModelShape:
    """A Llama-style shape whose head_dim is hidden / heads (true of every model below)."""
    return ModelShape(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hidden // heads,
        ffn=ffn,
        vocab=vocab,
        tied_embeddings=tied,
        source=f"config.json of {repo}",
        qkv_bias=qkv_bias,
    )


# Values from each repository's config.json (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings). Totals the tests check:
# Llama-2-7B 6.74e9, 13B 13.0e9, Llama-3.1-8B 8.03e9, 70B 70.6e9, Llama-3.2-1B 1.23e9 (Meta's
# model cards), Qwen2.5-7B 7.61e9 and 0.5B 0.49e9 (Qwen's), llama-68m 68e6, SmolLM2-135M 134.5e6.
_MODELS: tuple[tuple[ModelShape, tuple[str, ...]], ...] = (
    (_llama("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, "meta-llama/Llama-2-7b-hf"),
     ("llama2-7b",)),
    (_llama("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000, "meta-llama/Llama-2-13b-hf"),
     ("llama2-13b",)),
    (_llama("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, "meta-llama/Llama-2-70b-hf"),
     ("llama2-70b",)),
    (_llama("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, "meta-llama/Llama-3.1-8B"),
     ("llama3.1-8b", "meta-llama-3.1-8b")),
    (_llama("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256, "meta-llama/Llama-3.1-70B"),
     ("llama3.1-70b", "meta-llama-3.1-70b")),
    # Llama-3.1-8B's own-vocabulary draft (the 128k head): the pairing real deployments use.
    (_llama("Llama-3.2-1B", 16, 2048, 32, 8, 8192, 128256, "meta-llama/Llama-3.2-1B", tied=True),
     ("llama3.2-1b", "meta-llama-3.2-1b")),
    # Qwen2 attention has q/k/v biases; head_dim = 3584 / 28 = 128.
    (_llama("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, "Qwen/Qwen2.5-7B", qkv_bias=True),
     ("qwen2.5-7b",)),
    (_llama("Qwen2.5-0.5B", 24, 896, 14, 2, 4864, 151936, "Qwen/Qwen2.5-0.5B", tied=True,
            qkv_bias=True), ("qwen2.5-0.5b",)),
    # The SpecInfer drafts (Miao et al. 2024): 2 and 12 layers of a 768-wide Llama.
    (_llama("Llama-68M", 2, 768, 12, 12, 3072, 32000, "JackFram/llama-68m"), ("llama-68m",)),
    (_llama("Llama-160M", 12, 768, 12, 12, 3072, 32000, "JackFram/llama-160m"), ("llama-160m",)),
    (_llama("SmolLM2-135M", 30, 576, 9, 3, 1536, 49152, "HuggingFaceTB/SmolLM2-135M", tied=True),
     ("smollm2-135m",)),
    # An early-exit drafter of SmolLM2-135M: its first 4 layers, final norm and tied head. The
    # shape a CPU profile uses as the draft (the real early exit shares the target's weights).
    (replace(_llama("SmolLM2-135M-EE4", 4, 576, 9, 3, 1536, 49152, "HuggingFaceTB/SmolLM2-135M",
                    tied=True), source="first 4 layers of HuggingFaceTB/SmolLM2-135M"),
     ("smollm2-135m-ee4",)),
    # Llama-3.1-8B's early exit at the recorded one's depth (`smollm2-early-exit-24-lens`: 24 of
    # 30 layers): its first 26 of 32 layers, final norm and head, charged as a draft model.
    (replace(_llama("Llama-3.1-8B-EE26", 26, 4096, 32, 8, 14336, 128256,
                    "meta-llama/Llama-3.1-8B"),
             source="first 26 layers of meta-llama/Llama-3.1-8B"),
     ("llama3.1-8b-ee26",)),
)  # fmt: skip

_MIB = 2**20
# Datasheets give NVLink and PCIe bandwidth as the sum of both directions (NVLink 4: 18 links x
# 50 GB/s = 900 GB/s); a ring all-reduce sends and receives at once, so one direction's half is
# the rate each GPU's share of it moves at. HGX/DGX boards join their 8 SXM GPUs through NVSwitch,
# so every GPU reaches any other at that full rate.
_NVLINK3 = Interconnect(
    "NVLink 3 via NVSwitch", 300e9,
    "NVIDIA A100 datasheet (SXM4): NVLink 600 GB/s (both directions): 300 GB/s each way per GPU; "
    "HGX A100 joins 8 GPUs through NVSwitch")
_NVLINK4_H100 = Interconnect(
    "NVLink 4 via NVSwitch", 450e9,
    "NVIDIA H100 datasheet (SXM5): NVLink 900 GB/s (both directions): 450 GB/s each way per GPU; "
    "HGX H100 joins 8 GPUs through NVSwitch")
_NVLINK4_H200 = Interconnect(
    "NVLink 4 via NVSwitch", 450e9,
    "NVIDIA H200 datasheet (SXM): NVLink 900 GB/s (both directions): 450 GB/s each way per GPU; "
    "HGX H200 joins 8 GPUs through NVSwitch")
_PCIE4 = Interconnect(
    "PCIe Gen4 x16", 32e9,
    "NVIDIA L4 datasheet: PCIe Gen4 x16, 64 GB/s (both directions): 32 GB/s each way; the L4 has "
    "no NVLink, so a group's all-reduces cross PCIe")

# memory_bytes is the total the driver reports (nvidia-smi memory.total), which is what a serving
# engine's memory-utilization fraction applies to; the datasheet's round figure is in `source`.
_GPUS: tuple[tuple[GpuSpec, tuple[str, ...]], ...] = (
    (GpuSpec("A100-80GB", 81920 * _MIB, 2.039e12, 312e12,
             "NVIDIA A100 datasheet (SXM4 80GB): 2,039 GB/s HBM2e, 312 TFLOP/s bf16 dense "
             "(624 with sparsity), 80 GB; nvidia-smi reports 81920 MiB", _NVLINK3),
     ("a100", "a100-sxm", "a100-sxm4-80gb", "a100-80gb-sxm")),
    (GpuSpec("H100-SXM", 81559 * _MIB, 3.35e12, 989e12,
             "NVIDIA H100 datasheet (SXM5): 3.35 TB/s HBM3, 989 TFLOP/s bf16 dense (the "
             "datasheet's 1,979 is with sparsity), 80 GB; nvidia-smi reports 81559 MiB",
             _NVLINK4_H100),
     ("h100", "h100-sxm5", "h100-80gb", "h100-80gb-hbm3", "h100-sxm5-80gb")),
    (GpuSpec("H200", 143771 * _MIB, 4.8e12, 989e12,
             "NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e, 989 TFLOP/s bf16 dense (1,979 with "
             "sparsity), 141 GB; nvidia-smi reports 143771 MiB", _NVLINK4_H200),
     ("h200-sxm", "h200-141gb")),
    (GpuSpec("L4", 23034 * _MIB, 300e9, 121e12,
             "NVIDIA L4 datasheet: 300 GB/s GDDR6, 121 TFLOP/s bf16 dense (242 with sparsity), "
             "24 GB; nvidia-smi reports 23034 MiB", _PCIE4),
     ("l4-24gb",)),
)  # fmt: skip


def _key(name: str) -> str:
    """Case-, separator- and vendor-insensitive lookup key ("NVIDIA H100 80GB HBM3" -> h100-...)."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = key.rsplit("/", 1)[-1]  # drop a hub organisation: meta-llama/Llama-3.1-8B
    if key.startswith("nvidia-"):
        key = key[len("nvidia-") :]
    for suffix in ("-hf", "-chat", "-instruct"):  # fine-tunes share their base model's shape
        key = key.removesuffix(suffix)
    return key


def _index(table: tuple) -> dict[str, object]:
    index: dict[str, object] = {}
    for item, aliases in table:
        for alias in (item.name, *aliases):
            index[_key(alias)] = item
    return index


_MODEL_INDEX = _index(_MODELS)
_GPU_INDEX = _index(_GPUS)


def model_names() -> list[str]:
    """Canonical names of the catalogued models."""
    return [shape.name for shape, _ in _MODELS]


def gpu_names() -> list[str]:
    """Canonical names of the catalogued GPUs."""
    return [gpu.name for gpu, _ in _GPUS]


def get_model(name: str) -> ModelShape:
    """A model shape by name or alias ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct")."""
    shape = _MODEL_INDEX.get(_key(name))
    if shape is None:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(model_names())}")
    return shape  # type: ignore[return-value]


def get_gpu(name: str) -> GpuSpec:
    """A GPU by name or alias ("h100", "H100-SXM", "NVIDIA H100 80GB HBM3")."""
    gpu = _GPU_INDEX.get(_key(name))
    if gpu is None:
        raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(gpu_names())}")
    return gpu  # type: ignore[return-value]


#: Memory kept free for activations, the CUDA-graph pool and library workspaces. An assumption
#: (a serving engine measures its own peak with a dummy forward pass); the profiler may replace it.
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * 2**30


def kv_capacity_tokens(
    gpu: GpuSpec,
    target: ModelShape,
    draft: ModelShape | None = None,
    dtype_bytes: int = 2,
    memory_utilization: float = 0.9,
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
) -> int:
    """Tokens of KV cache that fit beside the weights of the target and the draft.

    A draft model keeps its own KV cache for the same tokens, so each token costs the target's
    KV bytes plus the draft's.
    """
    if not 0 < memory_utilization <= 1:
        raise ConfigError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
    if activation_reserve_bytes < 0:
        raise ConfigError(f"activation_reserve_bytes must be >= 0, got {activation_reserve_bytes}")
    models = [target] if draft is None else [target, draft]
    weights = sum(m.weight_bytes(dtype_bytes) for m in models)
    per_token = sum(m.kv_bytes_per_token(dtype_bytes) for m in models)
    usable = gpu.memory_bytes * memory_utilization - activation_reserve_bytes
    tokens = int((usable - weights) // per_token)
    if tokens < 1:
        who = " + ".join(m.name for m in models)
        raise ConfigError(
            f"{who} ({weights / 1e9:.1f} GB of weights) leaves no room for a KV cache on "
            f"{gpu.name}: {usable / 1e9:.1f} GB usable ({gpu.memory_bytes / 1e9:.1f} GB x "
            f"{memory_utilization} - {activation_reserve_bytes / 1e9:.1f} GB activation reserve)"
        )
    return tokens

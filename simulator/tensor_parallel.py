"""Tensor parallelism: a replica that is a group of N GPUs (Megatron-style, as vLLM serves it).

Each layer's q/k/v, o, gate/up and down projections are split N ways (by heads for attention,
by columns/rows of the FFN), as are the embedding and LM head (by vocabulary rows); the RMSNorm
weights are copied to every GPU. Two all-reduces per layer join the partial sums: after the
attention output projection and after the MLP's down projection. What one GPU holds and does:

    weights  = the split matrices / N + the copied norms
    KV heads = kv_heads / N while N <= kv_heads; past that, N % kv_heads == 0 and every GPU keeps
               one KV head (each head copied N / kv_heads times), as vLLM does
    FLOPs    = the matrix products of its share (a copied KV head's projection included)

A ring all-reduce of B bytes over N GPUs moves 2(N-1)/N x B through each GPU's link in each
direction (reduce-scatter, then all-gather), plus a fixed latency per call:

    t = 2(N-1)/N x B / link_bytes_per_s + latency_s

The whole cost model, its constants and what it leaves out: docs/tensor-parallel.md.
"""

from __future__ import annotations

from simulator.catalog import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    GpuSpec,
    ModelShape,
    kv_capacity_tokens,
)
from simulator.errors import ConfigError

#: the degrees a replica may have: one HGX/DGX server's 8 GPUs, split in powers of two
TP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)
#: all-reduces per decoder layer: after attention's output projection and after the MLP
ALLREDUCES_PER_LAYER = 2


def check_degree(model: ModelShape, degree: int, flag: str = "--tp") -> None:
    """A clear error unless `model` splits over `degree` GPUs: a degree of TP_DEGREES that
    divides its attention heads, and its KV heads either split evenly or copied evenly."""
    if isinstance(degree, bool) or degree not in TP_DEGREES:
        raise ConfigError(f"{flag} must be one of {', '.join(map(str, TP_DEGREES))} (GPUs per "
                          f"replica), got {degree!r}")
    if model.heads % degree:
        fits = [d for d in TP_DEGREES if model.heads % d == 0]
        raise ConfigError(f"{flag} {degree}: {model.name}'s {model.heads} attention heads do "
                          f"not split {degree} ways; use {flag} {_either(fits)}")
    if model.kv_heads % degree and degree % model.kv_heads:
        fits = [d for d in TP_DEGREES if model.heads % d == 0
                and not (model.kv_heads % d and d % model.kv_heads)]
        raise ConfigError(f"{flag} {degree}: {model.name}'s {model.kv_heads} KV heads neither "
                          f"split {degree} ways nor copy evenly onto {degree} GPUs; use {flag} "
                          f"{_either(fits)}")


def _either(degrees: list[int]) -> str:
    """Degrees as a reader writes them: 1, 2 or 4."""
    words = [str(d) for d in degrees]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def kv_heads_per_gpu(model: ModelShape, degree: int) -> int:
    """KV heads one GPU holds: kv_heads / N, or 1 once N exceeds kv_heads (heads copied)."""
    return max(model.kv_heads // degree, 1)


def kv_bytes_per_token_per_gpu(model: ModelShape, degree: int, dtype_bytes: int = 2) -> int:
    """Bytes of one token's K and V on one GPU of the group (every layer, its KV heads)."""
    if degree == 1:
        return model.kv_bytes_per_token(dtype_bytes)
    return 2 * model.layers * kv_heads_per_gpu(model, degree) * model.head_dim * dtype_bytes


def _layer_params_per_gpu(model: ModelShape, degree: int, matmul_only: bool) -> float:
    """One layer's parameters on one GPU: its share of the split matrices, its KV heads' k/v
    projections, and (unless `matmul_only`) the copied norms and its share of q/k/v biases."""
    kv = kv_heads_per_gpu(model, degree)
    q_out = model.heads * model.head_dim
    matmul = (2 * model.hidden * q_out / degree  # q and o projections: split by heads
              + 2 * model.hidden * kv * model.head_dim  # k and v: this GPU's KV heads
              + 3 * model.hidden * model.ffn / degree)  # gate, up, down: split by FFN columns
    if matmul_only:
        return matmul
    bias = (q_out / degree + 2 * kv * model.head_dim) if model.qkv_bias else 0
    return matmul + bias + 2 * model.hidden  # + the two RMSNorm weights, copied


def params_per_gpu(model: ModelShape, degree: int) -> float:
    """Parameters one GPU of the group holds (model.params at degree 1)."""
    if degree == 1:
        return model.params
    matrices = 1 if model.tied_embeddings else 2
    return (model.layers * _layer_params_per_gpu(model, degree, False) + model.hidden
            + matrices * model.vocab * model.hidden / degree)


def params_read_per_gpu(model: ModelShape, degree: int) -> float:
    """Parameters one GPU streams per pass: its layers' share, the final norm, its LM-head rows
    (model.weight_params_read_per_pass at degree 1; the embedding is a gather, not a stream)."""
    if degree == 1:
        return model.weight_params_read_per_pass
    return (model.layers * _layer_params_per_gpu(model, degree, False) + model.hidden
            + model.vocab * model.hidden / degree)


def matmul_params_per_gpu(model: ModelShape, degree: int) -> float:
    """Weights one GPU multiplies per token (model.matmul_params at degree 1)."""
    if degree == 1:
        return model.matmul_params
    return (model.layers * _layer_params_per_gpu(model, degree, True)
            + model.vocab * model.hidden / degree)


def allreduce_latency_s(fixed_s: float, per_gpu_s: float, degree: int) -> float:
    """The fixed cost of one all-reduce point over `degree` GPUs: a part of its own and a part
    per GPU past the first (RooflineParams says where the two come from)."""
    return fixed_s + per_gpu_s * (degree - 1)


def ring_allreduce_s(nbytes: float, degree: int, link_bytes_per_s: float,
                     latency_s: float) -> float:
    """Seconds of one ring all-reduce of `nbytes` over `degree` GPUs (0 for one GPU)."""
    if degree == 1:
        return 0.0
    return 2 * (degree - 1) / degree * nbytes / link_bytes_per_s + latency_s


def group_kv_capacity_tokens(
    gpu: GpuSpec,
    target: ModelShape,
    draft: ModelShape | None = None,
    tp: int = 1,
    draft_tp: int = 1,
    dtype_bytes: int = 2,
    memory_utilization: float = 0.9,
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
) -> int:
    """Tokens of KV cache a replica of `tp` GPUs holds beside the weights.

    Every GPU keeps its KV heads of every token, so the group holds as many tokens as its
    fullest GPU: the first, which also holds the draft model's share when there is one (the
    draft runs on GPUs 0..draft_tp-1; the others keep the difference free, as vLLM sizes every
    worker's cache to the smallest). Each GPU has its own activation reserve. At tp 1 this is
    `kv_capacity_tokens`, to the bit.
    """
    if draft_tp > tp:
        raise ConfigError(f"--draft-tp {draft_tp} is more GPUs than the replica's --tp {tp}")
    if tp == 1:
        return kv_capacity_tokens(gpu, target, draft, dtype_bytes, memory_utilization,
                                  activation_reserve_bytes)
    check_degree(target, tp)
    if draft is not None:
        check_degree(draft, draft_tp, "--draft-tp")
    if not 0 < memory_utilization <= 1:
        raise ConfigError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
    shares = [(target, tp)] if draft is None else [(target, tp), (draft, draft_tp)]
    weights = sum(params_per_gpu(m, n) * dtype_bytes for m, n in shares)
    per_token = sum(kv_bytes_per_token_per_gpu(m, n, dtype_bytes) for m, n in shares)
    usable = gpu.memory_bytes * memory_utilization - activation_reserve_bytes
    tokens = int((usable - weights) // per_token)
    if tokens < 1:
        who = " + ".join(f"{m.name} (TP {n})" for m, n in shares)
        raise ConfigError(
            f"{who} leave no room for a KV cache on {tp} x {gpu.name}: {weights / 1e9:.1f} GB "
            f"of weights on one GPU against {usable / 1e9:.1f} GB usable "
            f"({gpu.memory_bytes / 1e9:.1f} GB x {memory_utilization} - "
            f"{activation_reserve_bytes / 1e9:.1f} GB activation reserve)")
    return tokens

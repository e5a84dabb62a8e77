"""A Llama-family decoder in plain torch, built from a catalog `ModelShape`.

One forward pass serves the profiler (random weights, timed) and the live speculative engine
(real weights, ragged batches): every request brings its own KV cache and its own number of new
tokens. All new tokens of the batch are packed into one [tokens, hidden] matrix, so each
projection is one matmul for the whole batch; only attention is per request, because each request
attends over its own cache.

The maths is Hugging Face's `LlamaForCausalLM` and its weights load by name, but stored for speed:
q/k/v fused into one matrix and gate/up into another (fewer kernels), and every matrix [in, out]
so a projection is `x @ W`. MKL's fp32 GEMM for a few rows (a verify pass, a small batch) is up to
2x faster that way than with HF's [out, in] (SmolLM2-135M verify of 5 tokens: 100 -> 74 ms on one
CPU thread); GPUs do not mind either layout.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.cuda_graphs import GraphRunner
from models.kv_cache import BatchAttention, KVCache, RowLayout
from models.paged_kv import (
    BLOCK_SIZE,
    KVPool,
    PagedBatch,
    PagedOps,
    PagedSeq,
    blocks_for_memory,
)
from simulator.catalog import ModelShape
from simulator.errors import ConfigError

#: (rope_theta, rms_norm_eps) from each model's config.json; other shapes get the defaults.
KNOWN_HYPERPARAMETERS: dict[str, tuple[float, float]] = {
    "SmolLM2-135M": (100_000.0, 1e-5),
    "Llama-2-7B": (10_000.0, 1e-5),
    "Llama-2-13B": (10_000.0, 1e-5),
    "Llama-3.1-8B": (500_000.0, 1e-5),  # its "llama3" rope scaling is not modelled
    "Llama-3.1-70B": (500_000.0, 1e-5),
    "Qwen2.5-7B": (1_000_000.0, 1e-6),
    "Qwen2.5-0.5B": (1_000_000.0, 1e-6),
}  # Llama-68M/160M (JackFram) are not checked here: they get the defaults

_LOGITS = ("all", "last", "hidden")


@dataclass(frozen=True)
class LlamaConfig:
    """A shape plus what the shape leaves out: rotary base, norm epsilon, dtype and device."""

    shape: ModelShape
    rope_theta: float = 10_000.0
    rms_eps: float = 1e-5
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    # One SDPA call for a batch whose requests share (new, cached) lengths: it stacks their caches,
    # which on CPU costs more than a per-request loop (measured), so None means "not on CPU".
    batched_attention: bool | None = None
    # One paged KV pool for all sequences, one attention call per layer (models/paged_kv.py).
    # None means "on CUDA only": on the 2-core CPU the per-request caches are faster
    # (docs/gpu-engine.md), and the shipped CPU profiles were measured with them.
    paged: bool | None = None
    #: "torch" (gather + SDPA, any device) or "triton" (CUDA: reads the blocks in place);
    #: None: triton on CUDA where it is installed (docs/gpu-engine.md has both measured)
    paged_backend: str | None = None
    #: share of the device's memory the engine may fill (weights, KV pool, activations) on CUDA
    memory_utilisation: float = 0.9
    # Decode-shaped passes replayed as CUDA graphs (models/cuda_graphs.py); None: on CUDA when
    # paged. Graphs cover sequences up to `graph_context` tokens; longer ones run eagerly.
    cuda_graphs: bool | None = None
    graph_context: int = 8448
    #: a graph's rows are padded to a multiple of this (cuda_graphs.bucket_floor); 1: none
    graph_row_multiple: int = 16
    # The layer's parts around attention through torch.compile (fused norms, rotary, SwiGLU):
    # fewer kernels per pass. None: on CUDA (docs/gpu-engine.md has both measured).
    compiled: bool | None = None

    def __post_init__(self) -> None:
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_eps > 0:
            raise ValueError(f"rms_eps must be > 0, got {self.rms_eps}")
        if not self.dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {self.dtype}")
        object.__setattr__(self, "device", torch.device(self.device))
        if self.batched_attention is None:
            object.__setattr__(self, "batched_attention", self.device.type != "cpu")
        if self.paged is None:
            object.__setattr__(self, "paged", self.device.type == "cuda")
        if self.compiled is None:
            object.__setattr__(self, "compiled", self.device.type == "cuda")
        if self.cuda_graphs is None:
            object.__setattr__(self, "cuda_graphs", self.device.type == "cuda" and self.paged)
        if self.cuda_graphs and not (self.device.type == "cuda" and self.paged):
            raise ValueError("CUDA graphs need a CUDA device and the paged KV cache")
        if self.paged_backend is None:
            from models.paged_triton import available

            triton = self.device.type == "cuda" and available()
            object.__setattr__(self, "paged_backend", "triton" if triton else "torch")
        if self.paged_backend not in ("torch", "triton"):
            raise ValueError(f"paged_backend must be 'torch' or 'triton', got "
                             f"{self.paged_backend!r}")
        if not 0 < self.memory_utilisation <= 1:
            raise ValueError(f"memory_utilisation must be in (0, 1], got "
                             f"{self.memory_utilisation}")

    @property
    def tie_embeddings(self) -> bool:
        """Whether the LM head is the embedding matrix (the shape decides, so counts agree)."""
        return self.shape.tied_embeddings


def config_for(
    shape: ModelShape,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    rope_theta: float | None = None,
    rms_eps: float | None = None,
) -> LlamaConfig:
    """The config of a catalog shape, with its known rope_theta and epsilon unless overridden."""
    known_theta, known_eps = KNOWN_HYPERPARAMETERS.get(
        shape.name, (LlamaConfig.rope_theta, LlamaConfig.rms_eps)
    )
    return LlamaConfig(
        shape=shape,
        rope_theta=known_theta if rope_theta is None else rope_theta,
        rms_eps=known_eps if rms_eps is None else rms_eps,
        dtype=dtype,
        device=device,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm. fp32 takes torch's fused kernel (one op instead of six: this runs 2N+1 times a
    pass); other dtypes round as Hugging Face does: statistics in fp32, weight in x's dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RotaryTable:
    """cos and sin of every position up to a capacity that grows on demand, in the model dtype.

    Rotate-half convention (Hugging Face's LlamaRotaryEmbedding): dimension i pairs with
    i + head_dim/2, at frequency theta^(-2i/head_dim); angles are computed in fp32 as HF does.
    `sin` is stored with the sign of rotate_half folded in: [-sin, +sin] over the two halves.
    """

    def __init__(
        self,
        head_dim: int,
        theta: float,
        dtype: torch.dtype,
        device: torch.device,
        capacity: int = 4096,
    ) -> None:
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {head_dim}")
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.inv_freq = 1.0 / (theta**exponents)
        self.dtype, self.device = dtype, device
        self._build(capacity)

    def _build(self, capacity: int) -> None:
        angles = torch.outer(torch.arange(capacity, dtype=torch.int64).float(), self.inv_freq)
        half = angles.shape[1]
        emb = torch.cat((angles, angles), dim=-1)
        sin = emb.sin()
        sin[:, :half].neg_()
        self.cos = emb.cos().to(self.dtype).to(self.device)
        self.sin = sin.to(self.dtype).to(self.device)

    def gather(self, positions: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [tokens, 1, head_dim] at `positions` (all below `end`), ready to broadcast."""
        if end > self.cos.shape[0]:
            self._build(max(end, 2 * self.cos.shape[0]))
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half's sign already in `sin`."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row of `logits` [..., vocab], first index on ties as `argmax` gives it.

    `max(dim).indices` is the same reduction (both return the first maximal index; the tests
    check it on tie-heavy rows), but on CPU bf16 `argmax` is not vectorised: 80 rows of
    SmolLM2's 49,152 logits take 6.6 ms against 1.4 ms, a batch-16 verify step's worth of host
    time. Every greedy choice over target logits goes through here, so plain decoding, the
    live engine and the recorder always agree on ties."""
    return logits.max(dim=-1).indices


def _matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight (+ bias), with the bias fused into the product when there is one."""
    return x @ weight if bias is None else torch.addmm(bias, x, weight)


def _parameter(*size: int, config: LlamaConfig) -> nn.Parameter:
    empty = torch.empty(*size, dtype=config.dtype, device=config.device)
    return nn.Parameter(empty, requires_grad=False)


class DecoderLayer(nn.Module):
    """One layer's weights, each [in, out]; the maths lives in `LlamaModel` (no module calls)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        s = config.shape
        qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.attn_norm = _parameter(s.hidden, config=config)
        self.qkv = _parameter(s.hidden, qkv_out, config=config)  # columns: q, then k, then v
        self.qkv_bias = _parameter(qkv_out, config=config) if s.qkv_bias else None
        self.o = _parameter(s.heads * s.head_dim, s.hidden, config=config)
        self.mlp_norm = _parameter(s.hidden, config=config)
        self.gate_up = _parameter(s.hidden, 2 * s.ffn, config=config)  # columns: gate, then up
        self.down = _parameter(s.ffn, s.hidden, config=config)


class LlamaModel(nn.Module):
    """Decoder-only Llama: embedding, N pre-norm layers (GQA attention, SwiGLU MLP), LM head."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        s = config.shape
        if config.device.type == "cuda":  # weights that cannot fit: one line, not an OOM
            free, total = torch.cuda.mem_get_info(config.device)
            problem = weights_problem(s.name, s.params, config.dtype.itemsize, free, total,
                                      str(config.device))
            if problem:
                raise ConfigError(problem)
        self.embed = _parameter(s.hidden, s.vocab, config=config)  # [in, out] as the LM head
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(s.layers))
        self.norm = _parameter(s.hidden, config=config)
        self.lm_head = None if s.tied_embeddings else _parameter(s.hidden, s.vocab, config=config)
        self.rotary = RotaryTable(s.head_dim, config.rope_theta, config.dtype, config.device)
        self.exit_map: tuple[torch.Tensor, torch.Tensor] | None = None  # see `forward`
        self.feature_layers: tuple[int, ...] = ()  # see `set_feature_layers`
        self.kv_pool: KVPool | None = None  # made by the first `new_cache` when paged

    def set_feature_layers(self, layers: Sequence[int]) -> None:
        """Make `forward(logits="hidden")` return, before the last layer's output, the outputs
        of these decoder layers (0-based, ascending, below the last): [q_r, (len + 1) * hidden].
        An EAGLE-3-style head fuses low, middle and high features (Li et al. 2025,
        arXiv:2503.01840); `logits_of` reads the last block, so every caller of "hidden" still
        gets the right logits."""
        layers = tuple(int(i) for i in layers)
        last = self.config.shape.layers - 1
        if any(not 0 <= i < last for i in layers) or list(layers) != sorted(set(layers)):
            raise ValueError(f"feature layers must be distinct ascending decoder-layer indices in "
                             f"0..{last - 1} (the last layer's output always comes last); "
                             f"got {list(layers)}")
        self.feature_layers = layers

    @classmethod
    def random(cls, config: LlamaConfig, seed: int = 0) -> LlamaModel:
        """Random weights (normal, std 0.02; norms 1): latency does not depend on the values.

        The same seed on the same device type gives the same weights; a meta-device model (for
        counting parameters) is left uninitialised.
        """
        model = cls(config)
        if config.device.type == "meta":
            return model
        generator = torch.Generator(device=config.device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=generator)
        return model

    def new_cache(self, capacity: int = 256) -> KVCache | PagedSeq:
        """An empty KV cache sized for this model (it grows if a sequence outruns it): a
        sequence of the model's paged pool when the config is paged."""
        if self.config.paged:
            return self.pool().sequence(capacity)
        s = self.config.shape
        return KVCache(
            s.layers, s.kv_heads, s.head_dim, capacity, self.config.dtype, self.config.device
        )

    def reserve_pool(self, sequences: int, tokens_each: int) -> None:
        """Make the paged pool exactly big enough for `sequences` of `tokens_each` tokens (a
        profile knows what it will cache; the device's other memory stays free), or say in one
        line why it cannot fit. A no-op for per-request caches."""
        if self.config.paged:
            self.kv_pool = None
            self.kv_pool = exact_pool(self.config, sequences, tokens_each)

    def pool(self, headroom_bytes: int | None = None) -> KVPool:
        """The paged KV pool, made on first use: sized once from the device's free memory on
        CUDA (what `memory_utilisation` leaves after the weights and `headroom_bytes` for
        activations), growable on other devices."""
        if self.kv_pool is None:
            self.kv_pool = make_pool(self.config, headroom_bytes)
        return self.kv_pool

    @torch.inference_mode()
    def forward(
        self, tokens: list[torch.Tensor], caches: list[KVCache],
        logits: str | Sequence[str] = "all", features: bool = False,
        layouts: list[RowLayout | None] | None = None,
    ) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Feed tokens[r] (int64, 1-D, >= 1 token) after caches[r]'s cached tokens, for every r.

        Appends the new K/V to each cache and returns per request the logits of every new token
        [q_r, vocab] ("all", for verification) or of its last one [1, vocab] ("last", prefill),
        or the last layer's output of every new token before the final norm [q_r, hidden]
        ("hidden": what a tuned lens is fitted on), after the outputs of `feature_layers` if
        any are set. An `exit_map` (weight [hidden, hidden], bias [hidden]) set on the model
        maps that output before the norm and head.

        `logits` may also name "all" or "last" per request (a mixed iteration verifies some
        requests and prefills others). `features=True` returns (logits, the "hidden" rows)
        from the same pass: an EAGLE drafter needs both, and computing the logits here keeps
        the LM head inside the pass that the engine times and the profile charges.
        `layouts[r]`, when given, places request r's new tokens as a draft tree's nodes
        (kv_cache.RowLayout: their positions and what each may attend to).
        """
        modes = [logits] * len(tokens) if isinstance(logits, str) else list(logits)
        if len(modes) != len(tokens) or any(m not in _LOGITS for m in modes):
            raise ValueError(f"logits must be one of {_LOGITS} or one of them per request, got "
                             f"{logits!r} for {len(tokens)} requests")
        if features and "hidden" in modes:
            raise ValueError('features=True returns the "hidden" rows beside the logits: ask '
                             'for "all" or "last" logits with it')
        if "hidden" in modes and len(set(modes)) > 1:
            raise ValueError('"hidden" cannot be mixed with other logits modes in one pass')
        if any(t.dim() != 1 for t in tokens):
            raise ValueError("each request's tokens must be a 1-D tensor")
        q = [t.shape[0] for t in tokens]
        if (self.config.cuda_graphs and not features and len(set(modes)) == 1
                and modes[0] != "hidden" and layouts is None and self.exit_map is None
                and isinstance(caches[0], PagedSeq)):
            runner = self._graph_runner(caches[0].pool)
            if runner.accepts(q, caches):
                return runner.run(tokens, caches, last=modes[0] == "last")
        device = self.config.device
        batch = batch_attention(q, caches, self.config, layouts)
        x = self.embed.index_select(1, torch.cat(tokens).to(device, non_blocking=True)).t()
        cos, sin = self.rotary.gather(batch.positions(), batch.max_length)
        taps = []
        tapping = features or modes[0] == "hidden"
        for index, layer in enumerate(self.layers):
            x = decoder_layer(self.config, index, layer, x, cos, sin, batch)
            if tapping and index in self.feature_layers:
                taps.append(x)
        batch.commit()
        hidden = list((torch.cat((*taps, x), dim=-1) if taps else x).split(batch.q)) \
            if tapping else None
        if modes[0] == "hidden":
            return hidden
        if all(m == "all" for m in modes):
            out = list(self.logits_of(x).split(batch.q))
        else:  # "last" rows only where asked: the LM head is most of a short pass's work
            sizes = [q if m == "all" else 1 for q, m in zip(batch.q, modes)]
            rows = [r for end, size in zip(batch.bounds[1:], sizes) for r in range(end - size, end)]
            out = list(self.logits_of(x[torch.tensor(rows, device=x.device)]).split(sizes))
        return (out, hidden) if features else out

    def _graph_runner(self, pool: KVPool) -> GraphRunner:
        return graph_runner(self, pool, self.rotary)

    def _graph_body(self, tokens: torch.Tensor, batch: PagedOps) -> torch.Tensor:
        """The pass a graph captures: packed token ids to the logits of every row."""
        x = self.embed.index_select(1, tokens).t()
        cos, sin = self.rotary.gather(batch.positions(), batch.max_length)
        for index, layer in enumerate(self.layers):
            x = decoder_layer(self.config, index, layer, x, cos, sin, batch)
        return self.logits_of(x)

    def logits_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits [rows, vocab] of last-layer outputs [rows, hidden] (before the final norm),
        through the `exit_map` if one is set: what `forward` does after its last layer. Wider
        rows (`feature_layers`) are read by their last `hidden` columns."""
        hidden = hidden[..., -self.config.shape.hidden :]
        if self.exit_map is not None:
            weight, bias = self.exit_map
            hidden = torch.addmm(bias, hidden, weight)
        head = self.embed if self.lm_head is None else self.lm_head
        return rms_norm(hidden, self.norm, self.config.rms_eps) @ head

    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy weights named as in Hugging Face's LlamaForCausalLM (q/k/v and gate/up fused here).

        Every parameter must be filled and every name known; a tied model ignores "lm_head".
        """
        s = self.config.shape
        q_rows, kv_rows = s.heads * s.head_dim, s.kv_heads * s.head_dim
        spans = {"q": (0, q_rows), "k": (q_rows, kv_rows), "v": (q_rows + kv_rows, kv_rows)}
        spans |= {"gate": (0, s.ffn), "up": (s.ffn, s.ffn)}
        params = dict(self.named_parameters())
        filled = dict.fromkeys(params, 0)
        with torch.no_grad():
            for name, tensor in state.items():
                target, part = _hf_target(name)
                if target == "lm_head" and self.lm_head is None:
                    continue
                if target not in params:
                    raise ValueError(f"{name}: this model has no {target}")
                dest = params[target].t()  # HF stores [out, in]; a vector's .t() is itself
                if part is not None:
                    start, rows = spans[part]
                    dest = dest[start : start + rows]
                if dest.shape != tensor.shape:
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {tuple(dest.shape)}")
                dest.copy_(tensor)
                filled[target] += dest.shape[0]
        unset = [n for n, p in params.items() if filled[n] != p.t().shape[0]]
        if unset:
            raise ValueError(f"state dict fills {len(unset)} parameters wrongly, e.g. {unset[:3]}")


def graph_runner(owner, pool: KVPool, rotary: RotaryTable,
                 feature_width: int | None = None) -> GraphRunner:
    """`owner`'s CUDA graphs over `pool` (a model, or an EAGLE head with `feature_width`): the
    pool owns them (they read and write its storage), so a profile's pool and the engine's each
    keep theirs. The rotary table is built once for every graph; if it is rebuilt, they are
    captured again."""
    config = owner.config
    key = (id(owner), config.paged_backend, config.graph_row_multiple, feature_width)
    runner = pool.runners.get(key)
    if runner is None:
        rotary.gather(torch.zeros(1, dtype=torch.int64, device=config.device),
                      config.graph_context)
        runner = GraphRunner(owner._graph_body, pool, config.paged_backend,
                             config.graph_context, lambda: (id(rotary.cos),),
                             config.graph_row_multiple, feature_width)
        pool.runners[key] = runner
    return runner


def batch_attention(q: list[int], caches: Sequence[KVCache | PagedSeq], config: LlamaConfig,
                    layouts: list[RowLayout | None] | None = None) -> BatchAttention | PagedBatch:
    """How a pass reads and writes these caches: one paged batch, or per-request caches."""
    if caches and isinstance(caches[0], PagedSeq):
        return PagedBatch(q, caches, layouts, config.paged_backend)
    return BatchAttention(q, list(caches), config.batched_attention, layouts)


def make_pool(config: LlamaConfig, headroom_bytes: int | None = None) -> KVPool:
    """A KV pool for this config's model (see `LlamaModel.pool`)."""
    s, device = config.shape, torch.device(config.device)
    block_bytes = _block_bytes(config)
    if device.type != "cuda":
        return KVPool(s.layers, s.kv_heads, s.head_dim, 64, config.dtype, device)
    free, total = torch.cuda.mem_get_info(device)
    if headroom_bytes is None:
        headroom_bytes = default_headroom(config)
    blocks = blocks_for_memory(free, total, block_bytes, config.memory_utilisation,
                               headroom_bytes)
    if blocks < 2:
        raise KVPoolTooSmall(
            f"no room for a KV cache of {s.name} on {device}: {free / 2**30:.1f} GiB free of "
            f"{total / 2**30:.1f}, {(1 - config.memory_utilisation) * total / 2**30:.1f} kept "
            f"back and {headroom_bytes / 2**30:.1f} for activations. Use a larger device, a "
            f"smaller model or a higher memory utilisation.")
    return KVPool(s.layers, s.kv_heads, s.head_dim, blocks, config.dtype, device,
                  growable=False)


def _block_bytes(config: LlamaConfig) -> int:
    """Bytes of one block of a pool for this config's model (K and V, every layer)."""
    s = config.shape
    return s.layers * 2 * BLOCK_SIZE * s.kv_heads * s.head_dim * config.dtype.itemsize


def exact_pool(config: LlamaConfig, sequences: int, tokens_each: int) -> KVPool:
    """A pool of `sequences` x `tokens_each` tokens (whole blocks each, plus the null block)."""
    s, device = config.shape, torch.device(config.device)
    blocks = sequences * -(-tokens_each // BLOCK_SIZE) + 1
    block_bytes = _block_bytes(config)
    if device.type == "cuda":
        gc.collect()  # a pool given up may still be held in a cycle (its CUDA graphs)
        torch.cuda.empty_cache()  # and what it freed counts as free only once released
        free, total = torch.cuda.mem_get_info(device)
        room = blocks_for_memory(free, total, block_bytes, config.memory_utilisation,
                                 default_headroom(config))
        if blocks > room:
            raise KVPoolTooSmall(
                f"{sequences} sequences of {tokens_each} tokens of {s.name} need "
                f"{blocks * block_bytes / 2**30:.1f} GiB of KV cache, and {device} has room "
                f"for {room * block_bytes / 2**30:.1f} GiB ({free / 2**30:.1f} free of "
                f"{total / 2**30:.1f}, less activations and the share kept back). Use fewer "
                f"or shorter sequences (smaller batch sizes or contexts).")
    return KVPool(s.layers, s.kv_heads, s.head_dim, max(blocks, 2), config.dtype, device,
                  growable=device.type != "cuda")


def weights_problem(name: str, params: int, itemsize: int, free: int, total: int,
                    device: str) -> str | None:
    """Why a model's weights cannot be loaded on a device (with the numbers), or None. Half a
    GiB is kept for the CUDA context's and libraries' workspaces."""
    need = params * itemsize
    if need + 2**29 <= free:
        return None
    return (f"{name} needs {need / 2**30:.1f} GiB for its weights ({params / 1e9:.2f} B "
            f"parameters x {itemsize} bytes) and {device} has {free / 2**30:.1f} GiB free of "
            f"{total / 2**30:.1f}: use a card with more memory or a smaller model")


class KVPoolTooSmall(ConfigError):
    """The device has no room for a KV pool after the weights: a setting to change (one
    line from the CLI), not a crash."""


def default_headroom(config: LlamaConfig, max_tokens: int = 8192) -> int:
    """Bytes kept for one pass's activations: `max_tokens` rows of logits (fp32 and the model
    dtype), of the MLP's [tokens, 2 * ffn] and of a few hidden-wide tensors, plus 1 GiB for
    the allocator, CUDA graphs and libraries' workspaces."""
    s = config.shape
    item = torch.empty((), dtype=config.dtype).element_size()
    per_token = s.vocab * (4 + item) + 3 * s.ffn * item + 8 * s.hidden * item
    return max_tokens * per_token + 2**30


def decoder_layer(
    config: LlamaConfig,
    index: int,
    layer: DecoderLayer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attention: BatchAttention | PagedOps,
) -> torch.Tensor:
    """One pre-norm layer: x + attention(norm(x)), then + SwiGLU(norm(x)); every matmul covers
    the whole batch. `attention` stores the new K/V (`store`) and attends (`attend`): a
    `BatchAttention` over KV caches here, the EAGLE head's training attention elsewhere.
    With `config.compiled` the parts around attention run as torch.compile'd kernels."""
    s = config.shape
    before, after = (_COMPILED if config.compiled else _EAGER)
    q, k, v = before(x, layer.attn_norm, layer.qkv, layer.qkv_bias, cos, sin, s.heads,
                     s.kv_heads, s.head_dim, config.rms_eps)
    attention.store(index, k, v)
    return after(x, attention.attend(index, q), layer.o, layer.mlp_norm, layer.gate_up,
                 layer.down, config.rms_eps)


def _attention_inputs(x: torch.Tensor, norm: torch.Tensor, qkv_weight: torch.Tensor,
                      qkv_bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                      heads: int, kv_heads: int, head_dim: int, eps: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (both rotated) and v [tokens, heads, head_dim] of the layer's input."""
    qkv = _matmul(rms_norm(x, norm, eps), qkv_weight, qkv_bias)
    qkv = qkv.view(x.shape[0], heads + 2 * kv_heads, head_dim)
    qk = apply_rotary(qkv[:, : heads + kv_heads], cos, sin)  # rotate q and k at once
    return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]


def _layer_output(x: torch.Tensor, attended: torch.Tensor, o: torch.Tensor,
                  mlp_norm: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """The residual after attention, then the SwiGLU MLP's."""
    x = x + attended @ o
    gate, up = (rms_norm(x, mlp_norm, eps) @ gate_up).chunk(2, dim=-1)
    return x + (F.silu(gate) * up) @ down


class _CompiledOrEager:
    """torch.compile of `fn` (dynamic shapes: one compilation serves every batch), falling
    back to `fn` for good, with one warning, if compiling fails: a missing compiler must cost
    speed, never a run."""

    def __init__(self, fn) -> None:
        self.fn, self.compiled, self.error = fn, None, None

    def __call__(self, *args):
        if self.error is None:
            try:
                if self.compiled is None:
                    self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
                return self.compiled(*args)
            except Exception as error:  # any compiler failure: run eagerly
                import warnings

                self.error = error
                warnings.warn(f"torch.compile of {self.fn.__name__} failed, running it "
                              f"eagerly: {type(error).__name__}: {error}"[:500], stacklevel=2)
        return self.fn(*args)


_EAGER = (_attention_inputs, _layer_output)
_COMPILED = (_CompiledOrEager(_attention_inputs), _CompiledOrEager(_layer_output))


_HF_TOP = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm"}
_HF_LAYER = {  # name after "model.layers.N." -> (our parameter in layer N, slice of it or None)
    "input_layernorm.weight": ("attn_norm", None),
    "post_attention_layernorm.weight": ("mlp_norm", None),
    **{f"self_attn.{p}_proj.weight": ("qkv", p) for p in "qkv"},
    **{f"self_attn.{p}_proj.bias": ("qkv_bias", p) for p in "qkv"},
    "self_attn.o_proj.weight": ("o", None),
    "mlp.gate_proj.weight": ("gate_up", "gate"),
    "mlp.up_proj.weight": ("gate_up", "up"),
    "mlp.down_proj.weight": ("down", None),
}


def _hf_target(name: str) -> tuple[str, str | None]:
    """(our parameter name, the q/k/v or gate/up slice it fills or None) of an HF weight name."""
    if name in _HF_TOP:
        return _HF_TOP[name], None
    if name == "lm_head.weight":
        return "lm_head", None
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _HF_LAYER:
        target, part = _HF_LAYER[parts[3]]
        return f"layers.{parts[2]}.{target}", part
    raise ValueError(f"unknown weight name {name!r}")

"""The analytical latency model: a forward pass costs the slower of its bytes and its FLOPs.

It is the default so that spectune runs with nothing profiled. Per pass:

    bytes = weights streamed (every layer, final norm, LM head)
          + KV read (cached tokens) + KV written (query tokens)
    flops = 2 * matmul weights * query tokens + 4 * layers * heads * head_dim * attention pairs
    time  = max(bytes / (bandwidth * eff_bw), flops / (peak * eff_flops))
          + pass_fixed_s + layers * per_layer_s

Activations are left out of the bytes: per token they are a few hidden-sized vectors per layer,
against megabytes of weights, and at the sizes where they would count the pass is compute-bound.
The LM head is charged for every query token; a prefill that computes logits only for its last
position costs slightly less than this (the LM head is ~7% of Llama-3.1-8B's matmul weights).

A model served tensor-parallel over N GPUs (`tp`, `draft_tp`: simulator/tensor_parallel.py) is
priced per GPU: its share of the bytes over one GPU's bandwidth, its share of the FLOPs over one
GPU's peak, and then the 2 x layers ring all-reduces of its query tokens' hidden states over the
GPU's interconnect, which wait for the pass and are not overlapped with it:

    time += 2 * layers * (2(N-1)/N * query_tokens * hidden * activation bytes / link
                          + allreduce_latency_s + allreduce_latency_per_gpu_s * (N-1))

At N = 1 none of this applies and a pass costs what it always did, to the bit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from simulator.catalog import GpuSpec, ModelShape
from simulator.errors import ConfigError
from simulator.latency import ArrayLike, LatencyModel, Role
from simulator.tensor_parallel import (
    ALLREDUCES_PER_LAYER,
    allreduce_latency_s,
    check_degree,
    kv_bytes_per_token_per_gpu,
    matmul_params_per_gpu,
    params_read_per_gpu,
)


@dataclass(frozen=True)
class RooflineParams:
    """Efficiency and overhead constants. Defaults are assumptions that a profile will replace.

    bandwidth_efficiency 0.85: the fraction of datasheet bandwidth a decode pass streams at.
      A large device-to-device copy on an H100 80GB HBM3 measures ~3.0 TB/s (90% of 3.35), the
      ceiling for any kernel; gpt-fast's compiled bf16 Llama-2-7B decode reached 1,397 GB/s on an
      A100-80GB power-capped at 330 W, 69% (pytorch.org/blog/accelerating-generative-ai-2);
      tuned engines quote 80-90% at batch 1. 0.85 sits between those.
    flops_efficiency 0.70: the fraction of dense bf16 peak that large matrix products reach.
      An 8192^3 bf16 GEMM measures ~790-800 TFLOP/s on an H100/H200 (81% of 989); a model's
      narrower projections, attention and elementwise kernels lose more. Assumption.
    pass_fixed_s 30 us: per pass, independent of size: graph launch, embedding gather, final
      norm, logits to the sampler. Assumption.
    per_layer_s 5 us: per decoder layer, ~8-10 kernels (norms, projections, rotary + cache
      write, attention, activation) whose launch gaps and ramp-up/tail under CUDA-graph replay
      cost ~0.5 us each. Assumption.
    step_overhead_s 200 us + per_seq_overhead_s 2 us: host work per iteration outside the
      passes (scheduling, input metadata, sampling and acceptance bookkeeping), which engines
      that overlap scheduling with the GPU partly hide. Assumption.
    allreduce_latency_s 32.5 us + allreduce_latency_per_gpu_s 1.75 us x (N - 1): the fixed
      cost of each all-reduce point of a pass on a group of N GPUs (tp > 1 only), whatever its
      size: the collective's own latency (SGLang measured 3.7-11.8 us for decode-sized
      all-reduces on an H100 node, pull request 2904) and what else a layer costs a group and
      not one GPU (each kernel waits for the slowest GPU). Fitted on TensorRT-LLM 0.9.0's
      published Llama-2-70B decode steps on H100 at TP 2/4/8; held-out NIM and SGLang steps
      came within 12.9% median (benchmarks/tp_published.py --fit, docs/tensor-parallel.md).
      The same for every interconnect: over PCIe it is optimistic.
    """

    bandwidth_efficiency: float = 0.85
    flops_efficiency: float = 0.70
    pass_fixed_s: float = 30e-6
    per_layer_s: float = 5e-6
    step_overhead_s: float = 200e-6
    per_seq_overhead_s: float = 2e-6
    allreduce_latency_s: float = 32.5e-6
    allreduce_latency_per_gpu_s: float = 1.75e-6

    def __post_init__(self) -> None:
        for name in ("bandwidth_efficiency", "flops_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"RooflineParams.{name} must be in (0, 1], got {value}")
        for name in ("pass_fixed_s", "per_layer_s", "step_overhead_s", "per_seq_overhead_s",
                     "allreduce_latency_s", "allreduce_latency_per_gpu_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"RooflineParams.{name} must be >= 0, got {value}")


_DTYPE_NAMES = {1: "8-bit", 2: "bf16", 4: "fp32"}


_SCALARS = (int, float, np.integer, np.floating)


class RooflineLatency(LatencyModel):
    """Roofline pass times for a target, an optional draft model, and one GPU or a group.

    `draft=None` stands for a model-free drafter (n-gram lookup): its passes cost nothing.
    The FLOP rate is the GPU's dense bf16 peak whatever `dtype_bytes` says; a narrower dtype
    only shrinks the bytes. `tp`: the target's tensor-parallel degree (GPUs per replica);
    `draft_tp`: the draft model's (1: it runs on one GPU of the group).
    """

    arrays_match_scalars = True  # max/+/* on the same numbers, as Python floats or float64

    def __init__(
        self,
        target: ModelShape,
        draft: ModelShape | None,
        gpu: GpuSpec,
        dtype_bytes: int = 2,
        params: RooflineParams | None = None,
        tp: int = 1,
        draft_tp: int = 1,
    ) -> None:
        if dtype_bytes not in _DTYPE_NAMES:
            known = sorted(_DTYPE_NAMES)
            raise ConfigError(f"dtype_bytes must be one of {known}, got {dtype_bytes}")
        check_degree(target, tp)
        if draft is not None:
            check_degree(draft, draft_tp, "--draft-tp")
            if draft_tp > tp:
                raise ConfigError(f"--draft-tp {draft_tp} is more GPUs than the replica's "
                                  f"--tp {tp}")
        else:
            draft_tp = 1  # a model-free drafter runs on no GPU
        if max(tp, draft_tp) > 1 and gpu.interconnect is None:
            raise ConfigError(f"--tp {tp}: {gpu.name} names no interconnect, so its "
                              "all-reduces cannot be priced; use --tp 1")
        self.target = target
        self.draft = draft
        self.gpu = gpu
        self.dtype_bytes = dtype_bytes
        self.params = params or RooflineParams()
        self.tp = tp
        self.draft_tp = draft_tp
        self._coef_target = self._shape_coefficients(target, tp)
        self._coef_draft = self._shape_coefficients(draft, draft_tp)
        self._comm_target = self._allreduce_coefficients(target, tp)
        self._comm_draft = self._allreduce_coefficients(draft, draft_tp)
        p = self.params
        drafter = f"{draft.name} draft" if draft else "model-free draft"
        self.source = (
            f"roofline: {target.name} target + {drafter} on {gpu.name}, "
            f"{_DTYPE_NAMES[dtype_bytes]} (datasheet peaks x efficiency: "
            f"{p.bandwidth_efficiency:g} of bandwidth, {p.flops_efficiency:g} of dense FLOP/s)"
        )
        if max(tp, draft_tp) > 1:
            link = gpu.interconnect
            assert link is not None
            where = "on one GPU" if draft_tp == 1 else f"at TP {draft_tp}"
            self.source += (
                f"; tensor parallel: target on {tp} GPUs" + (f", draft {where}" if draft else "")
                + f", all-reduces over {link.name} ({link.bytes_per_s / 1e9:g} GB/s each way, "
                f"{p.allreduce_latency_s * 1e6:g} us + "
                f"{p.allreduce_latency_per_gpu_s * 1e6:g} us per further GPU each)"
            )

    @property
    def has_draft_model(self) -> bool:
        return self.draft is not None

    def forward_s(
        self,
        role: Role,
        num_seqs: ArrayLike,
        query_tokens: ArrayLike,
        cached_tokens: ArrayLike,
        attn_pairs: ArrayLike,
    ) -> ArrayLike:
        """Roofline seconds of one pass; elementwise over arrays (see the module docstring)."""
        coef = self._coefficients(role)
        if coef is None:
            return np.zeros(np.broadcast(num_seqs, query_tokens, cached_tokens, attn_pairs).shape)
        m0, m1, f_q, f_pair, fixed = coef
        memory_s = m0 + m1 * (cached_tokens + query_tokens)
        compute_s = f_q * query_tokens + f_pair * attn_pairs
        comm = self._comm_target if role == "target" else self._comm_draft
        if comm is not None:  # a tensor-parallel pass: its all-reduces follow the work
            fixed = fixed + comm[0] + comm[1] * query_tokens
        if isinstance(memory_s, _SCALARS) and isinstance(compute_s, _SCALARS):
            if num_seqs == 0 or query_tokens == 0:
                return 0.0
            return float(max(memory_s, compute_s) + fixed)
        t = np.maximum(memory_s, compute_s) + fixed
        if isinstance(num_seqs, _SCALARS) and num_seqs > 0 and np.asarray(query_tokens).min() > 0:
            return t  # every pass runs (a verify pass: query >= seqs > 0): no mask to apply
        if np.ndim(num_seqs) or np.ndim(query_tokens) or num_seqs == 0 or query_tokens == 0:
            t = np.where((np.asarray(num_seqs) > 0) & (np.asarray(query_tokens) > 0), t, 0.0)
        return t

    def pass_coefficients(self, role: Role) -> tuple[float, ...] | None:
        """`forward_s`'s numbers for `role`, for a loop that prices its passes the same way
        (simulator/compiled.py): memory s, memory s per token, compute s per query token and
        per pair, fixed s, and the all-reduces' s per pass and per query token (0 on one GPU);
        None for a draft that is no model."""
        coef = self._coefficients(role)
        if coef is None:
            return None
        comm = self._comm_target if role == "target" else self._comm_draft
        return (*coef, *(comm if comm is not None else (0.0, 0.0)))

    def _coefficients(self, role: Role) -> tuple[float, float, float, float, float] | None:
        """(memory s, memory s per token, compute s per query token, per pair, fixed s)."""
        if role == "target":
            return self._coef_target
        if role == "draft":
            return self._coef_draft
        raise ConfigError(f"role must be 'target' or 'draft', got {role!r}")

    def _shape_coefficients(self, m: ModelShape | None, degree: int = 1):
        """The five coefficients of `forward_s`, for one GPU's share of `m` over `degree`."""
        if m is None:
            return None
        p, gpu = self.params, self.gpu
        bandwidth = gpu.bandwidth_bytes_per_s * p.bandwidth_efficiency
        rate = gpu.bf16_flops_per_s * p.flops_efficiency
        if degree == 1:  # one GPU: the expressions as they always were, for the same floats
            return (
                m.weight_params_read_per_pass * self.dtype_bytes / bandwidth,
                m.kv_bytes_per_token(self.dtype_bytes) / bandwidth,
                m.flops_per_token / rate,
                4.0 * m.layers * m.heads * m.head_dim / rate,
                p.pass_fixed_s + m.layers * p.per_layer_s,
            )
        return (
            params_read_per_gpu(m, degree) * self.dtype_bytes / bandwidth,
            kv_bytes_per_token_per_gpu(m, degree, self.dtype_bytes) / bandwidth,
            2 * matmul_params_per_gpu(m, degree) / rate,
            4.0 * m.layers * (m.heads // degree) * m.head_dim / rate,  # its heads' pairs
            p.pass_fixed_s + m.layers * p.per_layer_s,  # the same kernels, each on a share
        )

    def _allreduce_coefficients(self, m: ModelShape | None, degree: int
                                ) -> tuple[float, float] | None:
        """(seconds per pass, seconds per query token) of a pass's all-reduces: 2 per layer,
        each a ring over `degree` GPUs of query tokens x hidden activations (bf16 also under
        8-bit weights); None on one GPU."""
        if m is None or degree == 1:
            return None
        link = self.gpu.interconnect
        assert link is not None  # checked in __init__
        calls = ALLREDUCES_PER_LAYER * m.layers
        per_token_bytes = m.hidden * max(self.dtype_bytes, 2)
        p = self.params
        return (calls * allreduce_latency_s(p.allreduce_latency_s,
                                            p.allreduce_latency_per_gpu_s, degree),
                calls * 2 * (degree - 1) / degree * per_token_bytes / link.bytes_per_s)

    def allreduce_s(self, role: Role, query_tokens: ArrayLike) -> ArrayLike:
        """Seconds of one pass's all-reduces (0 on one GPU): the part of `forward_s` that is
        communication, for a pass feeding `query_tokens` tokens."""
        self._coefficients(role)  # a clear error for an unknown role
        comm = self._comm_target if role == "target" else self._comm_draft
        q = np.asarray(query_tokens, dtype=np.float64)
        t = np.zeros(q.shape) if comm is None else comm[0] + comm[1] * q
        return float(t) if t.ndim == 0 else t

    def step_overhead_s(self, num_seqs: ArrayLike, drafted_tokens: ArrayLike = 0) -> ArrayLike:
        """Host seconds per iteration: a fixed part plus a part per running request (0 if idle;
        the roofline has no per-draft host term)."""
        p = self.params
        if isinstance(num_seqs, _SCALARS):
            return p.step_overhead_s + p.per_seq_overhead_s * num_seqs if num_seqs > 0 else 0.0
        n = np.asarray(num_seqs, dtype=np.float64)
        t = np.where(n > 0, p.step_overhead_s + p.per_seq_overhead_s * n, 0.0)
        return float(t) if t.ndim == 0 else t

    def describe(self) -> dict:
        """Every input of the model, for a run's meta block."""
        return {
            "kind": "roofline",
            "source": self.source,
            "target": asdict(self.target),
            "draft": asdict(self.draft) if self.draft else None,
            "gpu": asdict(self.gpu),
            "dtype_bytes": self.dtype_bytes,
            "params": asdict(self.params),
            "tp": self.tp,
            "draft_tp": self.draft_tp,
        }

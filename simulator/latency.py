"""The latency-model interface: seconds for one forward pass over a ragged batch.

Every latency model (roofline, profiled table) answers one question: how long does one forward
pass of the target or of the draft take, given the batch's aggregate shape. Aggregates, not
per-request lists, so that the engine can evaluate many steps at once with numpy arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import numpy as np

from simulator.draft_tree import TreeShape
from simulator.errors import ConfigError

Role = Literal["target", "draft"]
ArrayLike = float | int | np.ndarray


def attention_pairs(query_tokens: ArrayLike, cached_tokens: ArrayLike) -> ArrayLike:
    """Query-key pairs one request's pass computes under a causal mask.

    A request with `cached_tokens` already in the KV cache that feeds `query_tokens` new tokens
    attends q·cached + q(q+1)/2 pairs. Sum this over the batch for `LatencyModel.pass_s`.
    """
    q = np.asarray(query_tokens)
    return q * np.asarray(cached_tokens) + q * (q + 1) // 2


class LatencyModel(ABC):
    """Predicts forward-pass and step-overhead times. Arguments may be numpy arrays (broadcast).

    Arguments of `pass_s`, all sums over the requests in the pass:
      num_seqs        requests in the pass
      query_tokens    new tokens fed (prefill chunk, or k+1 for a verify, 1 for a draft step)
      cached_tokens   tokens already in the KV cache that the pass reads
      attn_pairs      query-key pairs under the causal mask (see `attention_pairs`)
    """

    #: where the numbers come from, e.g. "roofline: Llama-3.1-8B on H100-SXM, bf16"
    source: str = "unspecified"
    #: what the draft model feeds in a chain's first pass (simulator/draft_feed.py)
    draft_catch_up: str = "bonus"
    #: the static tree a drafter drafts instead of a chain (simulator/draft_tree.py), if any:
    #: how a step's passes are composed (StepCostModel), not a pass's time
    draft_tree: TreeShape | None = None
    #: `forward_s` and `step_overhead_s` give over arrays, element by element, the very floats
    #: they give for scalars (the same IEEE operations in the same order): a planner may then
    #: price its alternatives at once (StepCostModel.steps_s) and decide exactly as one by one
    arrays_match_scalars: bool = False
    #: planners may price many alternatives of a step in one call, from their verify pass's
    #: sums (`StepCostModel.chain_sums_s`, `steps_s`); what a planner weighs may depend on it
    #: (auto weighs every draft total where it can, else a subset: docs/policy-auto.md)
    batch_pricing: bool = True

    def pass_s(
        self,
        role: Role,
        num_seqs: ArrayLike,
        query_tokens: ArrayLike,
        cached_tokens: ArrayLike,
        attn_pairs: ArrayLike,
    ) -> ArrayLike:
        """Seconds for one forward pass of `role` (0 for a model-free drafter, or an empty pass).

        Checks its arguments, then calls `forward_s`. Scalars in, a float out; arrays broadcast.
        """
        if role not in ("target", "draft"):
            raise ConfigError(f"role must be 'target' or 'draft', got {role!r}")
        for name, value in (("num_seqs", num_seqs), ("query_tokens", query_tokens),
                            ("cached_tokens", cached_tokens), ("attn_pairs", attn_pairs)):
            a = np.asarray(value, dtype=np.float64)
            if not (a >= 0 if a.ndim == 0 else a.min(initial=0.0) >= 0):  # NaN fails too
                raise ValueError(f"pass_s: {name} must be >= 0, got {value!r}")
        t = self.forward_s(role, num_seqs, query_tokens, cached_tokens, attn_pairs)
        return float(t) if np.ndim(t) == 0 else t

    @abstractmethod
    def forward_s(
        self,
        role: Role,
        num_seqs: ArrayLike,
        query_tokens: ArrayLike,
        cached_tokens: ArrayLike,
        attn_pairs: ArrayLike,
    ) -> ArrayLike:
        """`pass_s` without the argument checks: the engine's hot path calls this directly.

        Must cost 0 where num_seqs or query_tokens is 0.
        """

    #: a speculating engine's extra time in a step that verifies no drafts (its proposer ran
    #: and found nothing); 0 unless measured (a vLLM profile: live/vllm_profile.py)
    idle_proposer_s: float = 0.0

    @abstractmethod
    def step_overhead_s(self, num_seqs: ArrayLike, drafted_tokens: ArrayLike = 0) -> ArrayLike:
        """Seconds of per-iteration work outside the forward passes (scheduling, sampling,
        drafting by lookup, acceptance), for `num_seqs` requests and `drafted_tokens` drafts."""

    @property
    @abstractmethod
    def has_draft_model(self) -> bool:
        """False for model-free drafters (n-gram lookup): drafting costs no GPU time."""

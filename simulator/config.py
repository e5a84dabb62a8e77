"""Scheduler and cluster settings: the knobs that must mirror a live engine's exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from simulator.errors import ConfigError
from simulator.scheduler import scheduler_names
from simulator.scheduler_vllm import DEFAULT_MAX_BATCHED_TOKENS  # also registers "vllm-v1"

Router = Literal["round-robin", "least-loaded"]
ROUTERS: tuple[str, ...] = ("round-robin", "least-loaded")


@dataclass(frozen=True)
class SchedulerConfig:
    """One replica's iteration-level scheduler.

    Each iteration admits waiting requests first-come first-served while the batch cap, the KV
    cache and the token budget allow. Without chunked prefill, newly admitted prompts are
    prefilled in an iteration of their own (running requests wait, as in vLLM's V0 scheduler);
    with it, every iteration runs the decode requests first and fills the rest of the token
    budget with prompt chunks (Sarathi-style mixed batches).

    KV cache: a request reserves prompt + output + k_max tokens when it is admitted and keeps
    them until it finishes, so a running request never runs out of cache (no preemption). The
    output length stands in for the max_tokens a real request declares: an engine that reserves
    max_tokens behaves the same when requests use all of it; one that allocates pages on demand
    and preempts (vLLM) packs more requests and pays recomputation instead.

    Token budget: decode requests always run, with their k + 1 tokens each; the budget limits
    the prompt tokens that join them (so an iteration can exceed it by its decode tokens). vLLM's
    V1 scheduler instead counts draft tokens against the budget and defers what does not fit.

    `scheduler="vllm-v1"` selects those vLLM V1 rules instead (simulator/scheduler_vllm.py,
    docs/vllm-v1-scheduler.md): 128-token KV blocks allocated as sequences grow, one budget
    for every scheduled token, preemption by recompute. It always chunks prompts (the field is
    set to True so the records say so), and an unset budget becomes vLLM's CPU default, 2048.
    """

    max_num_seqs: int = field(default=256, metadata={"help": "requests in one batch, at most"})
    max_batched_tokens: int | None = field(
        default=None, metadata={"help": "token budget per iteration; unset: unlimited "
                                          f"(vllm-v1: {DEFAULT_MAX_BATCHED_TOKENS})"}
    )
    chunked_prefill: bool = field(
        default=False, metadata={"help": "split prompts into chunks that share iterations "
                                          "(always on under vllm-v1)"}
    )
    kv_capacity_tokens: int | None = field(
        default=None,
        metadata={"help": "KV-cache tokens per replica; unset: derived from GPU memory "
                          "(vllm-v1: vLLM's 'KV cache size', 128-token blocks, one of them "
                          "the null block)"},
    )
    k_max: int = field(default=10, metadata={
        "help": "hard cap on k; reserved as KV look-ahead (vllm-v1: num_speculative_tokens, "
                "nothing reserved)"})
    scheduler: str = field(default="fcfs-reserve", metadata={
        "help": "the rules that admit, chunk and finish requests (simulator/scheduler.py's "
                "registry): fcfs-reserve, or vllm-v1 (vLLM V1's scheduler: blocks, one token "
                "budget, preemption; docs/vllm-v1-scheduler.md)"})

    def __post_init__(self) -> None:
        if self.scheduler not in scheduler_names():
            raise ConfigError(f"unknown scheduler {self.scheduler!r}; known: "
                              f"{', '.join(scheduler_names())}")
        if self.scheduler == "vllm-v1":  # vLLM V1 always chunks, with a budget (doc 0)
            object.__setattr__(self, "chunked_prefill", True)
            if self.max_batched_tokens is None:
                object.__setattr__(self, "max_batched_tokens", DEFAULT_MAX_BATCHED_TOKENS)
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_batched_tokens is not None and self.max_batched_tokens < 1:
            raise ConfigError(f"max_batched_tokens must be >= 1, got {self.max_batched_tokens}")
        if self.chunked_prefill and self.max_batched_tokens is None:
            raise ConfigError("chunked_prefill needs a token budget: set max_batched_tokens")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ConfigError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        if not 0 <= self.k_max <= 64:
            raise ConfigError(f"k_max must be in 0..64, got {self.k_max}")


@dataclass(frozen=True)
class ServedSchedulerConfig(SchedulerConfig):
    """`SchedulerConfig` plus a vLLM server's max_model_len, which the vllm-v1 scheduler reads:
    the cap on lengths and drafts, and vLLM's zero drafts near it (docs/vllm-v1-scheduler.md
    5.3). A subclass, not a field of SchedulerConfig: that would change every golden summary."""

    max_model_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass(frozen=True)
class ClusterConfig:
    """Replicas behind one router."""

    replicas: int = field(default=1, metadata={
        "help": "model replicas (one GPU each, or --tp GPUs each)"})
    router: str = field(default="round-robin", metadata={"help": "round-robin or least-loaded"})

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if self.router not in ROUTERS:
            raise ConfigError(f"unknown router {self.router!r}; known: {', '.join(ROUTERS)}")

"""Scheduler and cluster settings: the knobs that must mirror a live engine's exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from simulator.errors import ConfigError
from simulator.scheduler import scheduler_names

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
    """

    max_num_seqs: int = field(default=256, metadata={"help": "requests in one batch, at most"})
    max_batched_tokens: int | None = field(
        default=None, metadata={"help": "token budget per iteration; unset: unlimited"}
    )
    chunked_prefill: bool = field(
        default=False, metadata={"help": "split prompts into chunks that share iterations"}
    )
    kv_capacity_tokens: int | None = field(
        default=None,
        metadata={"help": "KV-cache tokens per replica; unset: derived from GPU memory"},
    )
    k_max: int = field(default=10, metadata={"help": "hard cap on k; reserved as KV look-ahead"})
    scheduler: str = field(default="fcfs-reserve", metadata={
        "help": "the rules that admit, chunk and finish requests (simulator/scheduler.py's "
                "registry): fcfs-reserve"})

    def __post_init__(self) -> None:
        if self.scheduler not in scheduler_names():
            raise ConfigError(f"unknown scheduler {self.scheduler!r}; known: "
                              f"{', '.join(scheduler_names())}")
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
class ClusterConfig:
    """Replicas behind one router."""

    replicas: int = field(default=1, metadata={"help": "model replicas (one GPU each)"})
    router: str = field(default="round-robin", metadata={"help": "round-robin or least-loaded"})

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if self.router not in ROUTERS:
            raise ConfigError(f"unknown router {self.router!r}; known: {', '.join(ROUTERS)}")

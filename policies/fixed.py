"""`fixed`: every running request drafts the same k every step (k = 0: no speculation)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import Policy, StepContext
from policies.registry import register


@register
@dataclass
class Fixed(Policy):
    name: ClassVar[str] = "fixed"
    description: ClassVar[str] = "the same k for every request and step; k=0 is plain decoding"
    stateless_per_batch: ClassVar[bool] = True

    k: int = field(default=4, metadata={"help": "draft tokens per request per step (0 = none)",
                                         "grid": (0, 1, 2, 3, 4, 5, 6, 8, 10),
                                         "extend": (12, 16, 24, 32)})

    def __post_init__(self) -> None:
        if not 0 <= self.k <= 64:
            raise ValueError(f"k must be in 0..64, got {self.k}")

    def may_draft(self, k_max: int) -> bool:
        return self.k > 0 and k_max > 0

    def choose(self, ctx: StepContext) -> Sequence[int]:
        return [self.k] * len(ctx.requests)

    def constant_k(self, k_max: int) -> int | None:
        return self.k if self.k <= k_max else None  # (above it: the engine's refusal)

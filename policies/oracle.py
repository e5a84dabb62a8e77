"""`oracle` (simulation only): knows how many drafts each request will get accepted.

With every request's future accepted run in hand (the speculation trace's run[t], which a real
engine never sees), a step drafts k_r = min(run_r, c): no draft is ever rejected, and the batch
cap c in 0..k_max is the one that maximises this step's goodput, emitted tokens / step time, on
the engine's own cost model. It is the yardstick that shows how much a real policy leaves on the
table (DISCO, Mamou et al. 2024, arXiv 2405.04304, reports an oracle up to 39% over static k).

It is greedy per step: the best tokens/s now, not a plan over the whole run, so it bounds what
a per-step policy can do with perfect foresight of acceptance, not every conceivable schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import Policy, StepContext
from policies.registry import register


@register
@dataclass
class Oracle(Policy):
    name: ClassVar[str] = "oracle"
    description: ClassVar[str] = (
        "simulation only: knows future acceptance; per-step goodput-optimal k (upper bound)")
    simulation_only: ClassVar[bool] = True

    k_max: int = field(default=10, metadata={"help": "largest k considered (also <= engine's)"})

    def __post_init__(self) -> None:
        if not 0 <= self.k_max <= 64:
            raise ValueError(f"k_max must be in 0..64, got {self.k_max}")

    def choose(self, ctx: StepContext) -> Sequence[int]:
        if ctx.lookahead is None:
            raise RuntimeError("the oracle needs the simulator's lookahead; it cannot run live")
        bound = min(self.k_max, ctx.k_max)
        runs = []
        for r in ctx.requests:
            left = r.output_tokens - r.generated - 1  # drafts past the last token are wasted
            runs.append(min(int(ctx.lookahead(r.request_id)[r.generated]), left, bound))
        contexts = [r.context_tokens for r in ctx.requests]
        best_ks, best_rate = [0] * len(runs), -1.0
        for cap in range(0, max(runs, default=0) + 1):
            ks = [min(run, cap) for run in runs]
            rate = (len(ks) + sum(ks)) / ctx.cost.step_s(ks, contexts)
            if rate > best_rate:
                best_ks, best_rate = ks, rate
        return best_ks

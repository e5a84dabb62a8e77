"""`gammatune` and `gammatune_plus`: GammaTune's switching rule (Gautam, Shrestha, Reddy 2025).

"Token-Driven GammaTune: Adaptive Calibration for Enhanced Speculative Decoding", arXiv 2504.00030
(+15% ±5% and +16% ±3% over fixed k on SpecBench). The paper's method section could not be read
here (only its abstract); the rule below is docs/policies.md §5's restatement *(rule secondary)*.

Per request, after each step with A drafts accepted of g drafted:

* every draft accepted (A == g): g <- clip(A + δ, g_min, g_max); the smoothed estimate is left
  alone, so one lucky step cannot drag the long-run estimate up;
* otherwise: ĝ <- clip((1 - η)·ĝ + η·A, g_min, g_max), g <- ceil(ĝ): a rejection is an uncensored
  observation of the run, smoothed so one unlucky step does not collapse g.

Defaults η = 0.3, δ = 2, g_min = 1, g_max = 10, initial g = ĝ = 3. Example: 3 drafted, 3 accepted
-> g = 5; then 5 drafted, 2 accepted -> ĝ = 0.7·3 + 0.3·2 = 2.7 -> g = 3.

GammaTune+ adds a draft-confidence stop: within a step, drafting stops when the draft's top-1
probability falls below τ (0.4, the transformers default; the paper's value is unconfirmed).

Choice where the sources are silent, when the stop cut the chain short (the engine reports the
drafts actually proposed, d < g): "A accepted of g drafted" is read against what was drafted, as
transformers' heuristic does under its confidence stop (`num_matches == len(scores[0]) - 1`). If all
d drafts were accepted, it is the success branch, and the length grows from the planned g, g + δ
(= A + δ when nothing was cut): the confidence rule, not a shrinking g, trims uncertain stretches.
If a draft was rejected, the smoothing branch takes A as is. By the same reading, a chain the
engine clamped to its own k_max counts as all-accepted when every clamped draft was accepted.
`ceil` ignores float noise below 1e-9 (with η = 0.2, 0.8·6 + 0.2·1 must give 5, not 6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import DraftOutcome, Policy, RequestView, StepContext
from policies.heuristic import below
from policies.registry import register

_K_LIMIT = 64
_CEIL_TOLERANCE = 1e-9


@register
@dataclass
class GammaTune(Policy):
    """GammaTune: grow by δ after a fully accepted step, else follow a smoothed accepted count."""

    name: ClassVar[str] = "gammatune"
    description: ClassVar[str] = (
        "GammaTune: all accepted -> g+δ, else g = ceil(EMA of accepted), per request")

    eta: float = field(default=0.3, metadata={"help": "smoothing weight η of the newest accepted",
                                               "bounds": (0.1, 0.9)})
    delta: int = field(default=2, metadata={"help": "growth δ after a fully accepted step",
                                             "grid": (1, 2, 3)})
    g_min: int = field(default=1, metadata={"help": "smallest speculation length"})
    g_max: int = field(default=10, metadata={"help": "largest speculation length"})
    g_init: int = field(default=3, metadata={"help": "initial g and smoothed ĝ of a request"})

    def __post_init__(self) -> None:
        if isinstance(self.eta, bool) or not isinstance(self.eta, (int, float)) \
                or not 0.0 < self.eta <= 1.0:
            raise ValueError(f"eta must be a number in (0, 1], got {self.eta!r}")
        for key, lo in (("delta", 0), ("g_min", 1), ("g_max", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= _K_LIMIT:
                raise ValueError(f"{key} must be an integer in {lo}..{_K_LIMIT}, got {value!r}")
        # g_min >= 1: a request at g = 0 drafts nothing, so it would never learn to draft again.
        if self.g_min > self.g_max:
            raise ValueError(f"g_min ({self.g_min}) must be <= g_max ({self.g_max})")
        if isinstance(self.g_init, bool) or not isinstance(self.g_init, int) \
                or not self.g_min <= self.g_init <= self.g_max:
            raise ValueError(f"g_init must be an integer in g_min..g_max "
                             f"({self.g_min}..{self.g_max}), got {self.g_init!r}")
        self._g: dict[int, int] = {}
        self._g_hat: dict[int, float] = {}

    def _clip(self, value: float) -> float:
        return min(max(value, self.g_min), self.g_max)

    def choose(self, ctx: StepContext) -> Sequence[int]:
        return [min(self._g.get(r.request_id, self.g_init), ctx.k_max) for r in ctx.requests]

    def observe(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        for o in outcomes:
            if o.k <= 0:
                continue  # nothing drafted, nothing learned
            rid = o.request_id
            g = self._g.get(rid, self.g_init)
            if o.accepted >= o.k:
                self._g[rid] = int(self._clip(g + self.delta))
                continue
            g_hat = self._clip((1.0 - self.eta) * self._g_hat.get(rid, float(self.g_init))
                               + self.eta * o.accepted)
            self._g_hat[rid] = g_hat
            self._g[rid] = int(self._clip(math.ceil(g_hat - _CEIL_TOLERANCE)))

    def finish(self, request_id: int) -> None:
        self._g.pop(request_id, None)
        self._g_hat.pop(request_id, None)


@register
@dataclass
class GammaTunePlus(GammaTune):
    """GammaTune+: GammaTune's length, with drafting stopped early when the draft is unsure."""

    name: ClassVar[str] = "gammatune_plus"
    description: ClassVar[str] = (
        "GammaTune+: GammaTune, plus drafting stops when draft top-1 probability < τ")
    uses_draft_stop: ClassVar[bool] = True

    tau: float = field(default=0.4, metadata={
        "help": "stop drafting when the draft's top-1 probability is below τ",
        "bounds": (0.1, 0.8)})

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) \
                or not 0.0 <= self.tau <= 1.0:
            raise ValueError(f"tau must be a number in [0, 1], got {self.tau!r}")

    def stop_drafting(
        self, request: RequestView, depth: int, draft_top1: float, draft_entropy: float
    ) -> bool:
        return below(float(draft_top1), self.tau)

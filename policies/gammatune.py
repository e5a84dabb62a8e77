"""`gammatune` and `gammatune_plus`: GammaTune's switching rule (Gautam, Shrestha, Reddy 2025).

"Token-Driven GammaTune: Adaptive Calibration for Enhanced Speculative Decoding", arXiv 2504.00030
(+15% ±5% and +16% ±3% over fixed k on SpecBench). Per request: a fully accepted step grows g by δ
and leaves the smoothed estimate alone, so one lucky step cannot drag it up; a rejection updates an
EMA of accepted drafts and g follows its ceiling, so one unlucky step does not collapse g. The rule
is docs/policies.md §5's restatement *(rule secondary: only the paper's abstract could be read)*;
a worked example and the choices made where the sources are silent: docs/policy-gammatune.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from policies.base import DraftOutcome, Policy, RequestStates, RequestView, StepContext
from policies.heuristic import below
from policies.kernels import compiled
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

    def choose(self, ctx: StepContext) -> Sequence[int]:
        return [min(self._g.get(r.request_id, self.g_init), ctx.k_max) for r in ctx.requests]

    def observe(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        for o in outcomes:
            if o.k <= 0:
                continue  # nothing drafted, nothing learned
            rid = o.request_id
            g, g_hat = self._next(self._g.get(rid, self.g_init),
                                  self._g_hat.get(rid, float(self.g_init)), o.k, o.accepted)
            self._g[rid] = g
            if o.accepted < o.k:
                self._g_hat[rid] = g_hat

    def _next(self, g: int, g_hat: float, drafted: int, accepted: int) -> tuple[int, float]:
        """A request's next (g, ĝ) after a step that drafted: ĝ moves on a rejection only."""
        lo, hi = self.g_min, self.g_max  # each value clipped to them (a walk's every step)
        if accepted >= drafted:
            return int(min(max(g + self.delta, lo), hi)), g_hat
        g_hat = float(min(max((1.0 - self.eta) * g_hat + self.eta * accepted, lo), hi))
        return int(min(max(math.ceil(g_hat - _CEIL_TOLERANCE), lo), hi)), g_hat

    def walks_apart(self) -> bool:
        return True  # (each request's g and g_hat its own)

    def walker(self, request_id: int, k_max: int,
               signals: Mapping[str, np.ndarray]) -> _GammaTuneWalk:
        return _GammaTuneWalk(self, request_id, k_max)

    def request_states(self, request_ids: Sequence[int], k_max: int) -> RequestStates:
        """Each request's g and g_hat, for compiled engine steps (`RequestStates`): knobs
        delta, g_min, g_max; weights eta and the ceiling's tolerance."""
        start = float(self.g_init)
        return RequestStates(
            "gammatune",
            np.array([self._g.get(rid, self.g_init) for rid in request_ids], dtype=np.int64),
            np.array([self._g_hat.get(rid, start) for rid in request_ids], dtype=np.float64),
            np.zeros(0), np.array([self.delta, self.g_min, self.g_max], dtype=np.int64),
            np.array([self.eta, _CEIL_TOLERANCE], dtype=np.float64))

    def keep_states(self, request_ids: Sequence[int], states: RequestStates,
                    touched: np.ndarray) -> None:
        """The states after compiled engine steps, as `observe` writes them: g where a request
        drafted (`touched` bit 1), g_hat where a draft was rejected (bit 2)."""
        for rid, g, g_hat, how in zip(request_ids, states.state.tolist(),
                                      states.level.tolist(), touched.tolist()):
            if how & 1:
                self._g[rid] = g
            if how & 2:
                self._g_hat[rid] = g_hat

    def finish(self, request_id: int) -> None:
        self._g.pop(request_id, None)
        self._g_hat.pop(request_id, None)


class _GammaTuneWalk:
    """`GammaTune.choose` and `observe` for one request (`Policy.walker`); gammatune_plus's
    stop reads each token alone, so a simulator folds it into the drafter's cap."""

    __slots__ = ("_g", "_g_hat", "_k_max", "_policy", "_request_id")

    def __init__(self, policy: GammaTune, request_id: int, k_max: int) -> None:
        self._policy, self._request_id, self._k_max = policy, request_id, k_max
        self._g = policy._g.get(request_id, policy.g_init)
        self._g_hat = policy._g_hat.get(request_id, float(policy.g_init))

    def k(self, position: int) -> int:
        return min(self._g, self._k_max)

    def saw(self, drafted: int, accepted: int, emitted: int, position: int) -> None:
        if drafted > 0:  # as observe
            policy, rid = self._policy, self._request_id
            self._g, g_hat = policy._next(self._g, self._g_hat, drafted, accepted)
            policy._g[rid] = self._g
            if accepted < drafted:
                self._g_hat = policy._g_hat[rid] = g_hat

    def walk_all(self, start: int, run: np.ndarray, cap: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """The whole walk at once (`RequestWalker.walk_all`), compiled where the simulator's
        loops run (policies/compiled.py: k and saw step after step, the same integers and
        floats), else None. Leaves the policy's state as the last saw would."""
        loops = compiled()
        if loops is None:
            return None
        policy, rid = self._policy, self._request_id
        walk, drafts, g, g_hat, drafted, rejected = loops.gammatune_walk(
            run, loops.NO_CAP if cap is None else cap, cap is not None, self._k_max, self._g,
            float(self._g_hat), policy.delta, float(policy.eta), policy.g_min, policy.g_max,
            _CEIL_TOLERANCE)
        if drafted:
            self._g = policy._g[rid] = int(g)
        if rejected:
            self._g_hat = policy._g_hat[rid] = float(g_hat)
        return walk, drafts


@register
@dataclass
class GammaTunePlus(GammaTune):
    """GammaTune+: GammaTune's length, with drafting stopped early when the draft is unsure."""

    name: ClassVar[str] = "gammatune_plus"
    description: ClassVar[str] = (
        "GammaTune+: GammaTune, plus drafting stops when draft top-1 probability < τ")
    uses_draft_stop: ClassVar[bool] = True
    stop_signals: ClassVar[frozenset[str]] = frozenset({"draft_top1"})

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

    def stop_positions(self, signals: Mapping[str, np.ndarray]) -> np.ndarray:
        return ~(signals["draft_top1"] >= self.tau)  # `below`, NaN included

"""`heuristic` and `confidence`: the two schedules of transformers' assisted generation.

Both come from Hugging Face transformers, `src/transformers/generation/candidate_generator.py`
(`AssistedCandidateGenerator.update_candidate_strategy`) and `stopping_criteria.py`
(`ConfidenceCriteria`); docs/policies.md §6: the schedules users of assisted generation expect.
heuristic grows k by 2 after a fully accepted step and shrinks it by 1 otherwise; confidence drafts
up to 20 tokens and stops after one whose draft probability is below 0.4. How that code was read
(per request or per generation, which token the stop keeps): docs/policy-heuristic.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from policies.base import DraftOutcome, Policy, RequestStates, RequestView, StepContext
from policies.kernels import compiled
from policies.registry import register

_K_LIMIT = 64
_NO_FLOATS = np.zeros(0)  # (a state or parameter the policy has none of)


def below(value: float, threshold: float) -> bool:
    """value < threshold, with NaN counted as below (an unreadable signal is no confidence)."""
    return not value >= threshold


def chain_lengths(stop: np.ndarray, ks: Sequence[int]) -> list[int]:
    """Each chain's length under a stop rule, for `Policy.stop_chains`: through its first stop
    (`stop`: requests x max k, True where the rule fires after that token) within its k, else k."""
    stop = stop & (np.arange(stop.shape[1]) < np.asarray(ks)[:, None])
    return np.where(stop.any(axis=1), stop.argmax(axis=1) + 1, ks).tolist()


def _check_int(name: str, value: int, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")


def _check_unit(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


@register
@dataclass
class Heuristic(Policy):
    """transformers' "heuristic" schedule per request: all accepted k += 2, else max(1, k - 1)."""

    name: ClassVar[str] = "heuristic"
    description: ClassVar[str] = (
        "transformers assisted generation: all accepted -> k+2, else k-1 (>= 1); per request")

    k_init: int = field(default=5, metadata={"help": "draft length of a new request",
                                              "grid": (2, 5)})
    k_max: int = field(default=20, metadata={
        "help": "largest draft length it grows to (transformers has none; the engine's k_max also "
                "caps it)"})
    grow: int = field(default=2, metadata={"help": "added when every drafted token was accepted",
                                            "grid": (1, 2)})
    shrink: int = field(default=1, metadata={"help": "subtracted otherwise (never below 1)",
                                              "grid": (1, 2)})
    carry_over: bool = field(default=False, metadata={
        "help": "start a new request from the k the last finished request ended with "
                "(transformers 'heuristic'); False starts each at k_init ('heuristic_transient')"})

    def __post_init__(self) -> None:
        _check_int("k_max", self.k_max, 1, _K_LIMIT)
        _check_int("k_init", self.k_init, 1, self.k_max)
        _check_int("grow", self.grow, 0, _K_LIMIT)
        _check_int("shrink", self.shrink, 0, _K_LIMIT)
        self._k: dict[int, int] = {}
        self._carried: int | None = None

    def _start(self) -> int:
        return self._carried if self.carry_over and self._carried is not None else self.k_init

    def choose(self, ctx: StepContext) -> Sequence[int]:
        out = []
        for r in ctx.requests:
            k = self._k.setdefault(r.request_id, self._start())
            out.append(min(k, ctx.k_max))
        return out

    def observe(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        # The state is kept within what can be drafted: growing past the engine's cap while every
        # clamped chain is accepted would take as many failures to come back down.
        ceiling = max(1, min(self.k_max, ctx.k_max))
        for o in outcomes:
            if o.k <= 0:
                continue  # nothing was drafted: nothing learned
            k = self._next(self._k.get(o.request_id, self._start()), o.k, o.accepted, ceiling)
            self._k[o.request_id] = k

    def _next(self, k: int, drafted: int, accepted: int, ceiling: int) -> int:
        """A request's next k after a step that drafted some (observe)."""
        return min(k + self.grow if accepted >= drafted else max(1, k - self.shrink), ceiling)

    def walks_apart(self) -> bool:
        return not self.carry_over  # (carried over: a start from the last finished request)

    def walker(self, request_id: int, k_max: int,
               signals: Mapping[str, np.ndarray]) -> _HeuristicWalk:
        # a new request's start (carried over) is read at its first step, as choose reads it
        return _HeuristicWalk(self, request_id, k_max)

    def request_states(self, request_ids: Sequence[int], k_max: int) -> RequestStates:
        """Each request's k as `choose` reads it (a new one's start), for compiled engine
        steps (`RequestStates`): knobs grow, shrink and the ceiling `observe` keeps k under."""
        start = self._start()
        return RequestStates(
            "heuristic", np.array([self._k.get(rid, start) for rid in request_ids],
                                  dtype=np.int64),
            _NO_FLOATS, _NO_FLOATS,
            np.array([self.grow, self.shrink, max(1, min(self.k_max, k_max))], dtype=np.int64),
            _NO_FLOATS)

    def keep_states(self, request_ids: Sequence[int], states: RequestStates,
                    touched: np.ndarray) -> None:
        """The ks after compiled engine steps, each of which chose for every request."""
        self._k.update(zip(request_ids, states.state.tolist()))

    def finish(self, request_id: int) -> None:
        k = self._k.pop(request_id, None)
        if k is not None:
            self._carried = k


class _HeuristicWalk:
    """`Heuristic.choose` and `observe` for one request (`Policy.walker`)."""

    __slots__ = ("_ceiling", "_k_max", "_policy", "_request_id", "_state")

    def __init__(self, policy: Heuristic, request_id: int, k_max: int) -> None:
        self._policy, self._request_id, self._k_max = policy, request_id, k_max
        self._state = policy._k.setdefault(request_id, policy._start())
        self._ceiling = max(1, min(policy.k_max, k_max))

    def k(self, position: int) -> int:
        return min(self._state, self._k_max)

    def saw(self, drafted: int, accepted: int, emitted: int, position: int) -> None:
        if drafted > 0:
            k = self._state = self._policy._next(self._state, drafted, accepted, self._ceiling)
            self._policy._k[self._request_id] = k

    def walk_all(self, start: int, run: np.ndarray, cap: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """The whole walk at once (`RequestWalker.walk_all`), compiled where the simulator's
        loops run (policies/compiled.py: k and saw step after step, the same integers), else
        None. Leaves the policy's state as the last saw would."""
        loops = compiled()
        if loops is None:
            return None
        policy = self._policy
        walk, drafts, k, drafted = loops.heuristic_walk(
            run, loops.NO_CAP if cap is None else cap, cap is not None, self._k_max,
            self._state, policy.grow, policy.shrink, self._ceiling)
        if drafted:
            self._state = policy._k[self._request_id] = int(k)
        return walk, drafts


@register
@dataclass
class Confidence(Policy):
    """transformers >= 4.45: draft up to `max_k`, stop when the draft's confidence < threshold."""

    name: ClassVar[str] = "confidence"
    description: ClassVar[str] = (
        "transformers assisted generation: draft up to max_k, stop when draft top-1 < threshold")
    # k is max_k throughout; the stop reads only each token's top-1 (`stop_positions`)
    stateless_per_batch: ClassVar[bool] = True
    uses_draft_stop: ClassVar[bool] = True
    stop_signals: ClassVar[frozenset[str]] = frozenset({"draft_top1"})

    max_k: int = field(default=20, metadata={"help": "longest chain (num_assistant_tokens)",
                                              "grid": (4, 8, 20)})
    threshold: float = field(default=0.4, metadata={
        "help": "stop when the draft's top-1 probability is below this "
                "(assistant_confidence_threshold)",
        "bounds": (0.1, 0.9)})

    def __post_init__(self) -> None:
        _check_int("max_k", self.max_k, 0, _K_LIMIT)
        _check_unit("threshold", self.threshold)

    def choose(self, ctx: StepContext) -> Sequence[int]:
        return [min(self.max_k, ctx.k_max)] * len(ctx.requests)

    def constant_k(self, k_max: int) -> int | None:
        return min(self.max_k, k_max)

    def stop_drafting(
        self, request: RequestView, depth: int, draft_top1: float, draft_entropy: float
    ) -> bool:
        return below(float(draft_top1), self.threshold)

    def stop_positions(self, signals: Mapping[str, np.ndarray]) -> np.ndarray:
        return ~(signals["draft_top1"] >= self.threshold)  # `below`, NaN included



"""`adaedl`: AdaEDL, early draft stopping on an entropy-based lower bound on acceptance.

Agrawal, Jeon, Lee 2024, "AdaEDL: Early Draft Stopping for Speculative Decoding of Large Language
Models via an Entropy-based Lower Bound on Token Acceptance Probability", arXiv 2410.18351
(docs/policies.md §6). The draft's entropy H (nats) at a position bounds how likely the target is to
accept the drafted token from below by about 1 - sqrt(γ·H); drafting stops once that bound falls
below a threshold λ, so a chain runs long where the drafter is sure and stops where it is not,
without a trained stop predictor. λ adapts per request toward an acceptance target, as in DSDE's
implementation *(secondary)*; the update and where this differs from DSDE's code:
docs/policy-adaedl.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from policies.base import DraftOutcome, Policy, RequestStates, RequestView, StepContext
from policies.heuristic import below, chain_lengths
from policies.kernels import compiled
from policies.registry import register

_K_LIMIT = 64


def acceptance_bound(entropy: float, gamma: float) -> float:
    """AdaEDL's lower bound on the drafted token's acceptance: 1 - sqrt(γ·H) (H in nats)."""
    return 1.0 - math.sqrt(max(gamma * entropy, 0.0)) if not math.isnan(entropy) else math.nan


def _number(name: str, value: float, lo: float, hi: float, open_lo: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (lo < value if open_lo else lo <= value) and value <= hi
    if not ok:
        bracket = "(" if open_lo else "["
        raise ValueError(f"{name} must be a number in {bracket}{lo:g}, {hi:g}], got {value!r}")


@register
@dataclass
class AdaEDL(Policy):
    """AdaEDL: draft until 1 - sqrt(γ·H_draft) < λ; λ tracks an acceptance-rate target."""

    name: ClassVar[str] = "adaedl"
    description: ClassVar[str] = (
        "AdaEDL: stop drafting when 1 - sqrt(γ·draft entropy) < λ; λ tracks an acceptance target")
    uses_draft_stop: ClassVar[bool] = True
    walker_stops: ClassVar[bool] = True  # its walker applies λ's stop

    max_k: int = field(default=10, metadata={"help": "longest chain drafted"})
    gamma: float = field(default=0.2, metadata={"help": "γ in the bound 1 - sqrt(γ·H)",
                                                 "bounds": (0.05, 1.0)})
    target_acceptance: float = field(default=0.9, metadata={
        "help": "acceptance rate α that λ is adapted toward", "bounds": (0.5, 0.95)})
    beta1: float = field(default=0.5, metadata={"help": "EMA weight β1 of the acceptance rate"})
    beta2: float = field(default=0.9, metadata={"help": "EMA weight β2 of λ"})
    epsilon: float = field(default=0.01, metadata={"help": "step ε of λ's target per round"})
    lambda_init: float = field(default=0.5, metadata={"help": "λ of a new request"})

    def __post_init__(self) -> None:
        if isinstance(self.max_k, bool) or not isinstance(self.max_k, int) \
                or not 0 <= self.max_k <= _K_LIMIT:
            raise ValueError(f"max_k must be an integer in 0..{_K_LIMIT}, got {self.max_k!r}")
        _number("gamma", self.gamma, 0.0, 1e6, open_lo=True)
        _number("target_acceptance", self.target_acceptance, 0.0, 1.0)
        _number("beta1", self.beta1, 0.0, 1.0)
        _number("beta2", self.beta2, 0.0, 1.0)
        _number("epsilon", self.epsilon, 0.0, 1.0)
        _number("lambda_init", self.lambda_init, 0.0, 1.0)
        self._lambda: dict[int, float] = {}
        self._rate: dict[int, float] = {}

    def threshold(self, request_id: int) -> float:
        """The request's current λ."""
        return self._lambda.get(request_id, self.lambda_init)

    def choose(self, ctx: StepContext) -> Sequence[int]:
        return [min(self.max_k, ctx.k_max)] * len(ctx.requests)

    def stop_drafting(
        self, request: RequestView, depth: int, draft_top1: float, draft_entropy: float
    ) -> bool:
        bound = acceptance_bound(float(draft_entropy), self.gamma)
        return below(bound, self.threshold(request.request_id))

    def stop_chains(self, requests: Sequence[RequestView], ks: Sequence[int],
                    draft_top1: np.ndarray, draft_entropy: np.ndarray) -> list[int]:
        """`stop_drafting` over the whole batch at once: the same bound (sqrt is correctly
        rounded in numpy as in math; NaN stays NaN and counts as below), the same first stop."""
        lam = np.array([self.threshold(r.request_id) for r in requests])[:, None]
        bound = 1.0 - np.sqrt(np.maximum(self.gamma * draft_entropy, 0.0))
        return chain_lengths(~(bound >= lam), ks)

    def observe(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        cap = min(self.max_k, ctx.k_max)
        for o in outcomes:
            if o.k > 0:
                self._observe_one(o.request_id, o.k, o.accepted, cap)

    def _observe_one(self, rid: int, drafted: int, accepted: int, cap: int) -> float:
        """One step's outcome of a request that drafted; returns its next λ."""
        rate = self.beta1 * self._rate.get(rid, 0.0) + (1.0 - self.beta1) * (accepted / drafted)
        lam = self.threshold(rid)
        if rate < self.target_acceptance:
            aim = lam + self.epsilon
        elif rate > self.target_acceptance and accepted >= cap:
            aim = lam - self.epsilon
        else:
            aim = lam
        self._rate[rid] = rate
        lam = self._lambda[rid] = self.beta2 * lam + (1.0 - self.beta2) * aim
        return lam

    def walks_apart(self) -> bool:
        return True  # (each request's lambda and rate its own)

    def walker(self, request_id: int, k_max: int,
               signals: Mapping[str, np.ndarray]) -> _AdaEDLWalk:
        return _AdaEDLWalk(self, request_id, k_max, signals["draft_entropy"])

    def request_states(self, request_ids: Sequence[int], k_max: int) -> RequestStates:
        """Each request's lambda and acceptance rate, for compiled engine steps
        (`RequestStates`): knob its depth; weights gamma, beta1, beta2, epsilon and the
        target acceptance."""
        return RequestStates(
            "adaedl", np.zeros(0, dtype=np.int64),
            np.array([self.threshold(rid) for rid in request_ids], dtype=np.float64),
            np.array([self._rate.get(rid, 0.0) for rid in request_ids], dtype=np.float64),
            np.array([min(self.max_k, k_max)], dtype=np.int64),
            np.array([self.gamma, self.beta1, self.beta2, self.epsilon, self.target_acceptance],
                     dtype=np.float64))

    def keep_states(self, request_ids: Sequence[int], states: RequestStates,
                    touched: np.ndarray) -> None:
        """The states after compiled engine steps, where a request drafted (`touched` bit 1),
        as `observe` writes them."""
        for rid, lam, rate, how in zip(request_ids, states.level.tolist(),
                                       states.rate.tolist(), touched.tolist()):
            if how & 1:
                self._lambda[rid], self._rate[rid] = lam, rate

    def finish(self, request_id: int) -> None:
        self._lambda.pop(request_id, None)
        self._rate.pop(request_id, None)


class _AdaEDLWalk:
    """`AdaEDL.choose`, its stop and `observe` for one request (`Policy.walker`): the bound at
    every position computed once (numpy's sqrt is correctly rounded, as `math.sqrt`)."""

    __slots__ = ("_bound", "_bounds", "_cap", "_lambda", "_policy", "_request_id")

    def __init__(self, policy: AdaEDL, request_id: int, k_max: int, entropy: np.ndarray) -> None:
        self._policy, self._request_id = policy, request_id
        self._cap = min(policy.max_k, k_max)
        entropy = np.asarray(entropy, dtype=np.float64)
        self._bounds = 1.0 - np.sqrt(np.maximum(policy.gamma * entropy, 0.0))  # (walk_all)
        self._bound = self._bounds.tolist()
        self._lambda = policy.threshold(request_id)

    def k(self, position: int) -> int:
        lam = self._lambda
        # the chain stops after its first token below λ; past the request's end it reads the
        # last position, which was read within the slice and did not stop it
        for d, bound in enumerate(self._bound[position: position + self._cap]):
            if not bound >= lam:
                return d + 1
        return self._cap

    def saw(self, drafted: int, accepted: int, emitted: int, position: int) -> None:
        if drafted > 0:
            self._lambda = self._policy._observe_one(self._request_id, drafted, accepted,
                                                     self._cap)

    def walk_all(self, start: int, run: np.ndarray, cap: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """The whole walk at once (`RequestWalker.walk_all`), compiled where the simulator's
        loops run (policies/compiled.py: k and saw step after step, the same integers and
        floats), else None. Leaves the policy's state as the last saw would."""
        policy, rid = self._policy, self._request_id
        loops = compiled()
        if loops is None or self._lambda != policy.threshold(rid):  # (one lambda read by
            return None  # both k and saw, as where the walker is walked as soon as it is made)
        walk, drafts, rate, lam, drafted = loops.adaedl_walk(
            run, loops.NO_CAP if cap is None else cap, cap is not None, start,
            self._bounds, self._cap, float(self._lambda),
            float(policy._rate.get(rid, 0.0)), float(policy.beta1), float(policy.beta2),
            float(policy.epsilon), float(policy.target_acceptance))
        if drafted:
            policy._rate[rid] = float(rate)
            self._lambda = policy._lambda[rid] = float(lam)
        return walk, drafts

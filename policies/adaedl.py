"""`adaedl`: AdaEDL, early draft stopping on an entropy-based lower bound on acceptance.

Agrawal, Jeon, Lee 2024, "AdaEDL: Early Draft Stopping for Speculative Decoding of Large Language
Models via an Entropy-based Lower Bound on Token Acceptance Probability", arXiv 2410.18351
(docs/policies.md §6). The draft's entropy H (nats) at a position bounds how likely the target is to
accept the drafted token from below by about 1 - sqrt(γ·H); drafting stops once that bound falls
below a threshold λ, so a chain runs long where the drafter is sure and stops where it is not,
without a trained stop predictor.

The stopping test is from the paper's abstract and docs/policies.md: stop when 1 - sqrt(γ·H) < λ.

λ is adapted per request after every verified round *(secondary: the paper's own text could not be
read here; this follows the only implementation found, `AdaEDLScheduler` and the drafting loop in
DSDE's vLLM fork, samsungsds-research-paper/DSDE, vllm/spec_decode/dynamic_scheduler.py and
draft_model_runner.py, whose parameter names and defaults β1 0.5, β2 0.9, α 0.9, ε 0.01 match
docs/policies.md)*:

    AR_n   = accepted / drafted                                 (this round)
    AR     = β1·AR + (1 - β1)·AR_n                              (EMA, starts at 0)
    λ'     = λ + ε   if AR < α                                  (accepting too little: stop sooner)
           = λ - ε   if AR > α and the whole allowed chain was accepted   (draft further)
           = λ       otherwise
    λ      = β2·λ + (1 - β2)·λ'                                 (starts at 0.5, DSDE's value)

Differences from DSDE's code, and choices where it is silent:
- "The whole allowed chain" is DSDE's `accepted == max_k`; here max_k is this step's chain cap,
  min(max_k, engine k_max), so an engine cap below max_k does not freeze λ. As in DSDE, a chain cut
  short by the stop rule never lowers λ: λ only falls after a round that ran to the cap and was
  accepted whole, so once every chain is cut short λ can no longer fall (with a weak drafter it
  climbs until each chain keeps one draft).
- γ defaults to 0.2 (docs/policies.md); DSDE's `gamma_risk` defaults to 0.1.
- DSDE checks the draft token it has just sampled and keeps it (the loop breaks after appending
  it); `Policy.stop_drafting` means the same, so every chain keeps at least one draft, like DSDE's
  `steps_done >= min_k` with min_k defaulting to 1. DSDE stops the whole batch when any row
  fires (vLLM V0 proposes equal lengths); here each request stops on its own (docs/policies.md §7).
- max_k defaults to 10 (the paper's own maximum is unconfirmed; DSDE's `max_spec_tokens` is 20).
- A NaN entropy counts as zero confidence (the rule fires); +inf fires too.
- A round with nothing drafted teaches nothing (DSDE skips k = 0 rounds as well).
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

    def observe(self, ctx: StepContext, outcomes: Sequence[DraftOutcome]) -> None:
        cap = min(self.max_k, ctx.k_max)
        for o in outcomes:
            if o.k <= 0:
                continue
            rid = o.request_id
            rate = self.beta1 * self._rate.get(rid, 0.0) + (1.0 - self.beta1) * (o.accepted / o.k)
            lam = self.threshold(rid)
            if rate < self.target_acceptance:
                aim = lam + self.epsilon
            elif rate > self.target_acceptance and o.accepted >= cap:
                aim = lam - self.epsilon
            else:
                aim = lam
            self._rate[rid] = rate
            self._lambda[rid] = self.beta2 * lam + (1.0 - self.beta2) * aim

    def finish(self, request_id: int) -> None:
        self._lambda.pop(request_id, None)
        self._rate.pop(request_id, None)

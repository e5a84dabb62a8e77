"""Fakes for unit-testing policies without the engine: requests, a cost model, contexts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from policies import DraftOutcome, StepContext


@dataclass
class FakeRequest:
    """Satisfies `policies.RequestView`."""

    request_id: int
    prompt_tokens: int = 100
    output_tokens: int = 200
    generated: int = 1
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_feed: int = 1

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated


class LinearCost:
    """A `StepCost`: a target pass costs `target_s` plus `per_token_s` per verified token (the
    compute knee is `knee_tokens`: above it every token costs 20x more), a draft pass `draft_s`
    per chain position. Simple enough to reason about in literal tests."""

    def __init__(self, target_s: float = 10e-3, draft_s: float = 1e-3,
                 per_token_s: float = 1e-6, knee_tokens: int = 256) -> None:
        self.target_s, self.draft_s = target_s, draft_s
        self.per_token_s, self.knee = per_token_s, knee_tokens

    def step_s(self, ks: Sequence[int], context_tokens: Sequence[int],
               feeds: Sequence[int] | None = None) -> float:
        tokens = sum(k + 1 for k in ks)
        over = max(0, tokens - self.knee)
        verify = self.target_s + self.per_token_s * (tokens + 20 * over)
        return verify + self.draft_s * max(ks, default=0)


def context(requests: Sequence[FakeRequest], k_max: int = 10, cost=None, step_index: int = 0,
            kv_capacity_tokens: int = 1_000_000, kv_free_tokens: int | None = None,
            waiting: int = 0, lookahead=None) -> StepContext:
    return StepContext(
        now_s=0.0, replica=0, step_index=step_index, requests=list(requests), k_max=k_max,
        cost=cost or LinearCost(), kv_capacity_tokens=kv_capacity_tokens,
        kv_free_tokens=kv_capacity_tokens if kv_free_tokens is None else kv_free_tokens,
        waiting=waiting, lookahead=lookahead,
    )


def outcome(request_id: int, k: int, accepted: int, position: int = 1, **signals) -> DraftOutcome:
    """An outcome; signals given as lists are trimmed to the observed positions
    (accepted drafts + the first rejection), as the engine does."""
    seen = min(accepted + 1, k)
    observed = {name: np.asarray(v, dtype=np.float32)[:seen] for name, v in signals.items()}
    return DraftOutcome(request_id, k, accepted, accepted + 1, position, observed)


def verified(rng: np.random.Generator, batch: Sequence[FakeRequest],
             ks: Sequence[int]) -> list[DraftOutcome]:
    """A random verification of `batch` drafting `ks` (each accepting 0..k, with random draft
    confidences): its outcomes, each request moved on by what it emitted."""
    outcomes = []
    for request, k in zip(batch, ks):
        accepted = int(rng.integers(0, k + 1)) if k else 0
        outcomes.append(outcome(request.request_id, k, accepted, request.generated,
                                draft_top1=rng.random(k)))
        request.generated = min(request.output_tokens, request.generated + accepted + 1)
    return outcomes

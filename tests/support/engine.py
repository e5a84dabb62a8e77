"""Small, exactly computable inputs for engine tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies import Policy
from simulator.latency import LatencyModel
from traces import RequestSpeculation, SpeculationTrace, Workload


class LinearLatency(LatencyModel):
    """A latency model simple enough to sum by hand: every term linear in its argument."""

    source = "test: linear"
    arrays_match_scalars = True  # numpy either way, the same operations

    def __init__(self, draft: bool = True, overhead_s: float = 1e-3) -> None:
        self._draft = draft
        self.overhead = overhead_s

    def forward_s(self, role, num_seqs, query_tokens, cached_tokens, attn_pairs):
        if role == "draft":
            if not self._draft:
                return 0.0 * np.asarray(cached_tokens, dtype=float)
            return 1e-4 + 1e-6 * np.asarray(query_tokens) + 1e-9 * np.asarray(cached_tokens)
        return 5e-3 + 1e-5 * np.asarray(query_tokens) + 1e-8 * np.asarray(cached_tokens)

    def step_overhead_s(self, num_seqs, drafted_tokens=0):
        return self.overhead + 0.0 * np.asarray(num_seqs, dtype=float)

    @property
    def has_draft_model(self) -> bool:
        return self._draft


def workload(arrivals, prompts, outputs) -> Workload:
    n = len(arrivals)
    return Workload(
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        request_ids=np.arange(n, dtype=np.int64),
        source="test",
    )


def trace_from_runs(runs) -> SpeculationTrace:
    reqs = tuple(RequestSpeculation(run=np.asarray(r, dtype=np.int32)) for r in runs)
    return SpeculationTrace(requests=reqs, meta={"source": "test", "parametric": False})


@dataclass
class CyclingPolicy(Policy):
    """k by step and request, with runs of k = 0 between chains: a draft's catch-up grows."""

    name: ClassVar[str] = "cycling-test"

    def choose(self, ctx):
        return [(0, 0, 3, 1, 4)[(ctx.step_index + r.request_id) % 5] for r in ctx.requests]


@dataclass
class ByParity(Policy):
    """Asked per running set, with two ks: odd request ids draft 4 tokens, even ones none."""

    name: ClassVar[str] = "parity-test"
    stateless_per_batch: ClassVar[bool] = True

    def choose(self, ctx):
        return [4 if r.request_id % 2 else 0 for r in ctx.requests]


def feed_recorder(seen: list) -> Policy:
    """A `CyclingPolicy` that appends, at every step, what it sees of each request: (id,
    generated, draft_feed). `seen` is shared through the closure: engines deep-copy policies."""

    class FeedRecorder(CyclingPolicy):
        def choose(self, ctx):
            seen.append(tuple((r.request_id, r.generated, r.draft_feed) for r in ctx.requests))
            return super().choose(ctx)

    return FeedRecorder()


class KeptPolicies:
    """Keeps the policy object each replica of a run uses (they copy the one given), to compare
    their state after the run: `policies`, in the order the replicas were built."""

    def __init__(self, monkeypatch) -> None:
        from simulator.replica import Replica

        self.policies: list[Policy] = []
        real = Replica.__init__

        def init(replica, *args, **kwargs):
            real(replica, *args, **kwargs)
            self.policies.append(replica.policy)

        monkeypatch.setattr(Replica, "__init__", init)

"""Replay mode: real forward passes of any shape, acceptance taken from a speculation trace.

Latency does not depend on weight values, so a random-weight model (Llama-3.1-8B's shape on a
GPU, say) takes a real pass's time while deciding nothing meaningful. Replay keeps every pass real
and takes what they would have decided from the trace, exactly as the simulator does
(simulator/acceptance.py): the target "writes" a seeded random sequence (`ReplayScript.truth`),
and the drafter's chain at position g matches it for run[g] tokens, so a chain of n has
min(n, run[g]) accepted. Greedy only. How the chains, their lengths and the signals follow the
trace: docs/live-engine.md "Replay mode".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from drafters.base import DraftChain, Drafter, StopRule
from live.verify import FedPass, Verified, _verify_pass
from models.kv_cache import KVCache
from models.llama import LlamaModel, greedy_tokens
from simulator.acceptance import replay_for
from simulator.draft_feed import FIRST_FEED, next_feed
from traces import SpeculationTrace, Workload

__all__ = ["ReplayDrafter", "ReplayScript", "verify_replay"]


class ReplayScript:
    """Per workload request: the token sequence the target writes, and the trace's acceptance.

    Request i uses trace request i mod M, tiled or cut to its output length (the simulator's
    own `replay_for`, with its checks against the policy and k_max), so the live run and a
    simulation of the same workload replay the same runs. Tokens are drawn below `vocab` (the
    smaller of the target's and the draft model's vocabulary: both embed them), fixed by
    (seed, request index).
    """

    def __init__(self, trace: SpeculationTrace, workload: Workload, policy, vocab: int,
                 k_max: int, seed: int = 0) -> None:
        if vocab < 2:
            raise ValueError(f"replay needs a vocabulary of at least 2 tokens, got {vocab}")
        self.acceptance = replay_for(trace, workload.output_tokens, policy, k_max)
        self.vocab, self.k_max, self.seed = int(vocab), int(k_max), int(seed)
        self.index_of = {int(rid): i for i, rid in enumerate(workload.request_ids)}
        self._truth: dict[int, np.ndarray] = {}

    def truth(self, request_id: int) -> np.ndarray:
        """The request's output tokens, plus k_max + 1 more (chains may run past its end)."""
        index = self.index_of[request_id]
        if index not in self._truth:
            n = int(self.acceptance.output_tokens[index]) + self.k_max + 1
            rng = np.random.default_rng([self.seed, index])
            self._truth[index] = rng.integers(0, self.vocab, n, dtype=np.int64)
        return self._truth[index]

    def first_token(self, request_id: int) -> int:
        return int(self.truth(request_id)[0])

    def run(self, request_id: int) -> np.ndarray:
        return self.acceptance.run(self.index_of[request_id])

    def signal(self, request_id: int, name: str) -> np.ndarray:
        return self.acceptance.signal(self.index_of[request_id], name)

    def has(self, name: str) -> bool:
        return name in self.acceptance.available

    def chain_length(self, request_id: int, g: int, k: int, stop: StopRule | None,
                     row: int) -> int:
        """How many tokens the request drafts at position g when the policy chose k: the
        simulator's `_draft_stop` (stop rule on the trace's signals), then its proposable cap."""
        last = int(self.acceptance.output_tokens[self.index_of[request_id]]) - 1
        if stop is not None and k > 0:
            top1, ent = self._confidence(request_id)
            for d in range(k):
                t = min(g + d, last)
                if stop(row, d, float(top1[t]), float(ent[t])):
                    k = d + 1
                    break
        if self.acceptance.limits_proposals:
            k = min(k, int(self.acceptance.proposable(self.index_of[request_id])[g]))
        return k

    def chain(self, request_id: int, g: int, n: int) -> DraftChain:
        """n draft tokens at position g: the sequence for run[g] of them, then a wrong one."""
        truth = self.truth(request_id)
        right = min(n, int(self.run(request_id)[g]))
        tokens = truth[g : g + n].tolist()
        for j in range(right, n):  # every token past the accepted run differs from the sequence
            tokens[j] = (tokens[j] + 1) % self.vocab
        top1, ent = self._confidence(request_id)
        last = len(top1) - 1
        depth = [min(g + j, last) for j in range(n)]
        return DraftChain(tokens, [float(top1[t]) for t in depth], [float(ent[t]) for t in depth])

    def _confidence(self, request_id: int) -> tuple[np.ndarray, np.ndarray]:
        """draft_top1 and draft_entropy per position (a certain draft where the trace has none,
        as a lookup drafter reports)."""
        n = int(self.acceptance.output_tokens[self.index_of[request_id]])
        top1 = (self.signal(request_id, "draft_top1") if self.has("draft_top1")
                else np.ones(n))
        ent = (self.signal(request_id, "draft_entropy") if self.has("draft_entropy")
               else np.zeros(n))
        return top1, ent


class ReplayDrafter(Drafter):
    """The trace's chains (ReplayScript.chain), with `inner`'s real passes if it has a model."""

    def __init__(self, inner: Drafter, script: ReplayScript) -> None:
        self.inner = None if inner.model_free else inner
        self.script = script
        self.model_free = self.inner is None
        self.needs_hidden = inner.needs_hidden and self.inner is not None
        self.name = f"replay of {inner.name}"
        self.catch_up = inner.catch_up  # the replayed chains' first passes feed by its rule
        self.model = None if self.inner is None else inner.model
        self._prompt: dict[int, int] = {}
        self._fed: dict[int, tuple[int, int | None, int]] = {}  # feed, history, chain: last step

    @property
    def timing_model(self):
        """The inner drafter's: the passes a real chain costs are its passes."""
        return None if self.inner is None else self.inner.timing_model

    def start(self, request_ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        for rid, prompt in zip(request_ids, prompts):
            self._prompt[rid] = len(prompt)
        if self.inner is not None:
            self.inner.start(request_ids, prompts)

    def propose(
        self,
        request_ids: Sequence[int],
        histories: Sequence[Sequence[int]],
        ks: Sequence[int],
        stop: StopRule | None = None,
        keep_probs: bool = False,
    ) -> list[DraftChain]:
        positions = [len(h) - self._prompt[rid] for rid, h in zip(request_ids, histories)]
        lengths = [self.script.chain_length(rid, g, k, stop, row)
                   for row, (rid, g, k) in enumerate(zip(request_ids, positions, ks))]
        if self.inner is not None and any(lengths):  # the passes a real chain of these costs
            self.inner.propose(request_ids, histories, lengths)
        chains = [self.script.chain(rid, g, n)
                  for rid, g, n in zip(request_ids, positions, lengths)]
        if self.inner is not None:
            for rid, history, chain in zip(request_ids, histories, chains):
                chain.fed = self._feed(rid, len(history), len(chain))
        return chains

    def _feed(self, request_id: int, history: int, drafted: int) -> int:
        """What the replayed chain's first pass feeds by the inner drafter's catch-up rule, as
        the simulator charges it (the inner model drafts its own tokens, whose agreement with
        the history is not the trace's; EAGLE's catch-up never depends on it)."""
        feed, before, chain = self._fed.get(request_id, (FIRST_FEED, None, 0))
        if before is not None:
            emitted = history - before
            feed = next_feed(self.inner.catch_up, feed, chain, emitted)
        self._fed[request_id] = (feed, history, drafted)
        return feed if drafted else 0

    def observe_hidden(self, request_ids: Sequence[int], hidden: Sequence[torch.Tensor]) -> None:
        if self.inner is not None:
            self.inner.observe_hidden(request_ids, hidden)

    def finish(self, request_id: int) -> None:
        self._prompt.pop(request_id, None)
        self._fed.pop(request_id, None)
        if self.inner is not None:
            self.inner.finish(request_id)


def verify_replay(
    target: LlamaModel,
    caches: Sequence[KVCache],
    lasts: Sequence[int],
    chains: Sequence[DraftChain],
    remaining: Sequence[int],
    script: ReplayScript,
    request_ids: Sequence[int],
    positions: Sequence[int],
    signals: frozenset[str] = frozenset(),
    want_hidden: bool = False,
    fed: FedPass | None = None,
) -> list[Verified]:
    """The real verify pass (and the greedy engine's argmax over it), with acceptance decided by
    the script: the chain's leading tokens that equal the request's sequence at `positions`."""
    starts, logits, hidden = fed or _verify_pass(target, caches, lasts, chains, want_hidden)
    torch.cat([greedy_tokens(rows) for rows in logits]).tolist()  # the work (and sync) of greedy
    out = []
    for r, (cache, start, chain, room, rid, g) in enumerate(
            zip(caches, starts, chains, remaining, request_ids, positions)):
        truth = script.truth(rid)
        accepted = 0
        while accepted < len(chain) and chain.tokens[accepted] == int(truth[g + accepted]):
            accepted += 1
        emitted = [*chain.tokens[:accepted], int(truth[g + accepted])][:room]
        cache.truncate(start + 1 + accepted)
        seen = min(len(emitted), len(chain))
        values = {name: np.asarray(script.signal(rid, name)[g : g + seen], dtype=np.float64)
                  for name in signals}
        kept = hidden[r][: accepted + 1] if hidden is not None else None
        out.append(Verified(len(chain), len(emitted) - 1, emitted, values, kept))
    return out

"""Model drafters: a small LlamaModel (or the target's first L layers) drafting greedy chains.

Each request has its own draft KV cache. It holds the `trusted` tokens fed from the true history
plus the `spec`ulative drafts fed after them (a chain of k feeds k - 1 of its drafts: the last one
is proposed, never fed). At the next `propose` the cache keeps the longest prefix the history
still agrees with and feeds the rest: after a rejection that is the corrected token; after a fully
accepted chain, the last draft and the bonus token (two tokens in one pass).

Chains are batched: chain position j is one draft forward pass over the requests still drafting
(the first pass is ragged: each request feeds its catch-up tokens), the cost the simulator's step
cost model charges ("max k_r draft passes, each over the requests still drafting").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from drafters.base import DraftChain, Drafter, StopRule
from drafters.registry import DraftSetup, Spelling, register
from models.kv_cache import KVCache
from models.llama import LlamaModel, config_for, greedy_tokens
from simulator.catalog import ModelShape, get_model


@dataclass
class _DraftSeq:
    """One request's draft cache: `trusted` tokens agree with the history, then `spec` drafts."""

    cache: KVCache
    trusted: int
    spec: list[int]

    def sync(self, history: Sequence[int]) -> list[int]:
        """Roll back what the history disagrees with; return the tokens to feed (>= 1)."""
        valid = self.trusted
        for token in self.spec:
            if valid >= len(history) or history[valid] != token:
                break
            valid += 1
        valid = min(valid, len(history) - 1)  # the last token must be fed: its logits draft
        self.cache.truncate(valid)
        self.trusted, self.spec = len(history), []
        return list(history[valid:])


class ModelDrafter(Drafter):
    """Greedy chains from a draft LlamaModel with per-request KV caches (see the module doc)."""

    def __init__(self, model: LlamaModel, name: str = "model", cache_tokens: int = 256) -> None:
        self.model = model
        self.name = name
        self.cache_tokens = cache_tokens
        self._seqs: dict[int, _DraftSeq] = {}

    def start(self, request_ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """Prefill the prompts in one batched pass (the draft's share of a prefill iteration)."""
        device = self.model.config.device
        caches = [self.model.new_cache(max(self.cache_tokens, 2 * len(p))) for p in prompts]
        tokens = [torch.tensor(list(p), dtype=torch.int64, device=device) for p in prompts]
        self.model(tokens, caches, logits="last")
        for rid, prompt, cache in zip(request_ids, prompts, caches):
            self._seqs[rid] = _DraftSeq(cache, len(prompt), [])

    def propose(
        self,
        request_ids: Sequence[int],
        histories: Sequence[Sequence[int]],
        ks: Sequence[int],
        stop: StopRule | None = None,
        keep_probs: bool = False,
    ) -> list[DraftChain]:
        chains = [DraftChain() for _ in ks]
        probs: list[list[torch.Tensor]] = [[] for _ in ks]
        active = [i for i, k in enumerate(ks) if k > 0]
        feeds = {i: self._seqs[request_ids[i]].sync(histories[i]) for i in active}
        for i in active:
            chains[i].fed = len(feeds[i])
        depth = 0
        while active:
            seqs = [self._seqs[request_ids[i]] for i in active]
            if depth:  # what this pass feeds are drafts: roll-back material for the next sync
                for seq, i in zip(seqs, active):
                    seq.spec.append(feeds[i][0])
            best, top1, entropy, p = self._pass([feeds[i] for i in active], seqs)
            still = []
            for j, i in enumerate(active):
                chains[i].tokens.append(best[j])
                chains[i].top1.append(top1[j])
                chains[i].entropy.append(entropy[j])
                if keep_probs:
                    probs[i].append(p[j])
                stopped = stop is not None and stop(i, depth, top1[j], entropy[j])
                if not stopped and len(chains[i]) < ks[i]:
                    still.append(i)
                    feeds[i] = [best[j]]
            active, depth = still, depth + 1
        for chain, rows in zip(chains, probs):
            chain.probs = torch.stack(rows) if rows else None
        return chains

    def _pass(
        self, feeds: list[list[int]], seqs: list[_DraftSeq]
    ) -> tuple[list[int], list[float], list[float], torch.Tensor]:
        """One draft pass: per request its greedy token (argmax of the logits), the top-1
        probability, the entropy, and the distribution [requests, vocab] in fp32."""
        device = self.model.config.device
        tokens = [torch.tensor(feed, dtype=torch.int64, device=device) for feed in feeds]
        logits = torch.cat(self.model(tokens, [seq.cache for seq in seqs], logits="last"))
        p = torch.softmax(logits.float(), dim=-1)
        entropy = torch.special.entr(p).sum(dim=-1)
        best = greedy_tokens(logits)
        return best.tolist(), p.max(dim=-1).values.tolist(), entropy.tolist(), p

    def finish(self, request_id: int) -> None:
        self._seqs.pop(request_id, None)

    def cache_length(self, request_id: int) -> int:
        """Tokens in a request's draft cache (for tests of the sync)."""
        return self._seqs[request_id].cache.length


@register("model", "model:<shape name>")
def build_model(spelling: Spelling, setup: DraftSetup) -> ModelDrafter:
    """"model:<shape name>": `setup.draft_model`, or random weights of that shape."""
    draft, target = setup.draft_model, setup.target
    if draft is None:
        draft = random_draft(spelling.arg, target, setup.shapes, setup.seed)
    vocab, target_vocab = draft.config.shape.vocab, target.config.shape.vocab
    if setup.vocab_check and vocab != target_vocab:
        raise ValueError(f"drafter {spelling.spec!r}: vocabulary {vocab} != the target's "
                         f"{target_vocab}")
    return ModelDrafter(draft, name=spelling.spec)


def random_draft(name: str, target: LlamaModel, shapes: Mapping[str, ModelShape] | None,
                 seed: int) -> LlamaModel:
    """Random weights of a named shape, in the target's dtype and on its device."""
    if not name:
        raise ValueError("drafter 'model:' needs a shape name, e.g. model:Llama-68M")
    shape = (shapes or {}).get(name) or get_model(name)
    config = config_for(shape, dtype=target.config.dtype, device=target.config.device)
    return LlamaModel.random(config, seed)

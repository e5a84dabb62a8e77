"""Drafter `eagle`: greedy chains from an EAGLE head fed with the target's features.

The engine hands it the features of the tokens the target committed after every prefill and
verify pass (`observe_hidden`). Per request it keeps a one-layer KV cache of `trusted` entries
from true features, then the chain's speculative ones; `propose` rolls back to the trusted
entries, feeds the catch-up (the last step's accepted drafts and the bonus token) and chains,
feeding back each predicted feature with its drafted token. With a `lookup` (`eagle+ngram`) a
chain step drafts the n-gram lookup's token when it matched at least `lookup_min_match` tokens:
the head is weak where the target copies, the lookup elsewhere. Why, and what it gains:
docs/eagle-head.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drafters.base import DraftChain, Drafter, StopRule
from drafters.ngram import NgramDrafter
from drafters.registry import DraftSetup, Spelling, register
from drafters.tree_layout import SHIPPED_TREE
from models.eagle_head import EagleHead, HeadTiming, load_head
from models.kv_cache import KVCache, RowLayout
from simulator.draft_tree import TreeShape, load_tree


@dataclass
class _HeadSeq:
    """One request: its head cache (`trusted` true entries, then speculative ones) and the true
    features not yet turned into entries (positions trusted, trusted + 1, ...)."""

    cache: KVCache
    trusted: int = 0
    pending: list[torch.Tensor] = field(default_factory=list)
    prompt: list[int] | None = None  # until its features arrive


class EagleDrafter(Drafter):
    """Chains from `head` (models/eagle_head.py); see the module doc."""

    needs_hidden = True
    catch_up = "committed"

    def __init__(self, head: EagleHead, name: str = "eagle", cache_tokens: int = 256,
                 lookup: NgramDrafter | None = None, lookup_min_match: int = 2,
                 tree: TreeShape | None = None) -> None:
        if lookup_min_match < 1:
            raise ValueError(f"lookup_min_match must be >= 1, got {lookup_min_match}")
        if tree is not None and lookup is not None:
            raise ValueError("a draft tree takes the head's candidates only: no lookup with it")
        self.head, self.tree = head, tree
        self.lookup, self.lookup_min_match = lookup, lookup_min_match
        self.model = head  # what the engine checks for the device and times as a draft pass
        self._timing = HeadTiming(head)
        self.name = name
        self.cache_tokens = cache_tokens
        self._seqs: dict[int, _HeadSeq] = {}

    @property
    def timing_model(self) -> HeadTiming:
        """The head called the way a profile sweep calls a draft model."""
        return self._timing

    def start(self, request_ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """New requests: their caches; the prompt's entries are fed when its features arrive."""
        for rid, prompt in zip(request_ids, prompts):
            cache = self.head.new_cache(max(self.cache_tokens, 2 * len(prompt)))
            self._seqs[rid] = _HeadSeq(cache, prompt=list(prompt))

    def observe_hidden(self, request_ids: Sequence[int], hidden: Sequence[torch.Tensor]) -> None:
        """Keep the features; a prefill's are fed at once as entries 0..P-2 (one batched pass,
        in the prefill iteration, where the simulator charges a draft model's prefill): entry
        P-1 waits for the first output token."""
        device = self.head.config.device
        tokens, features, caches = [], [], []
        for rid, rows in zip(request_ids, hidden):
            seq = self._seqs[rid]
            prompt, seq.prompt = seq.prompt, None
            if prompt is not None and len(prompt) > 1:
                n = len(prompt) - 1
                tokens.append(torch.tensor(prompt[1:], dtype=torch.int64, device=device))
                features.append(rows[:n])
                caches.append(seq.cache)
                seq.trusted, rows = n, rows[n:]
            seq.pending.append(rows)
        if tokens:
            self.head(tokens, features, caches)

    def propose(
        self,
        request_ids: Sequence[int],
        histories: Sequence[Sequence[int]],
        ks: Sequence[int],
        stop: StopRule | None = None,
        keep_probs: bool = False,
    ) -> list[DraftChain]:
        if self.tree is not None:
            return self._propose_trees(request_ids, histories, ks, stop, keep_probs)
        chains = [DraftChain() for _ in ks]
        probs: list[list[torch.Tensor]] = [[] for _ in ks]
        device = self.head.config.device
        feeds: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, k in enumerate(ks):
            if k > 0:
                feeds[i] = self._catch_up(self._seqs[request_ids[i]], histories[i], device)
                chains[i].fed = feeds[i][0].shape[0]
        active = list(feeds)
        depth = 0
        while active:
            seqs = [self._seqs[request_ids[i]] for i in active]
            features, logits = self.head([feeds[i][0] for i in active],
                                         [feeds[i][1] for i in active], [s.cache for s in seqs])
            best, top1, entropy, p = self._choose(logits, keep_probs)
            if self.lookup is not None:
                best = [self._looked_up(histories[i], chains[i].tokens, best[j])
                        for j, i in enumerate(active)]
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
                    token = torch.tensor([best[j]], dtype=torch.int64, device=device)
                    feeds[i] = (token, features[j : j + 1])
            active, depth = still, depth + 1
        for chain, rows in zip(chains, probs):
            chain.probs = torch.stack(rows) if rows else None
        return chains

    def _propose_trees(self, request_ids, histories, ks, stop, keep_probs) -> list[DraftChain]:
        """Per request the tree `self.tree.upto(k)`: one head pass per depth over every request's
        nodes of the depth above that have children (each sees the trusted entries and its own
        ancestors: `_node_layout`); a node of rank r is its parent's r-th most likely token.
        The stop rule reads the top-1 path (the chain inside the tree): where it stops, no node
        goes deeper."""
        device = self.head.config.device
        chains = [DraftChain(parents=[]) for _ in ks]
        shapes = {i: self.tree.upto(k) for i, k in enumerate(ks) if k > 0}
        feeds = {i: self._catch_up(self._seqs[request_ids[i]], histories[i], device)
                 for i in shapes}
        for i in shapes:
            chains[i].fed = feeds[i][0].shape[0]
        seqs = {i: self._seqs[request_ids[i]] for i in shapes}
        active = list(shapes)
        if not active:
            return chains
        features, logits = self.head([feeds[i][0] for i in active], [feeds[i][1] for i in active],
                                     [seqs[i].cache for i in active])
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in active}
        base = {i: seqs[i].cache.length for i in active}  # L0: the first speculative column
        column: dict[int, dict[int, int]] = {i: {} for i in active}  # node -> its cache column
        # the distributions to expand: (request, parent node (-1: root), its path, feature row)
        frontier = [(i, -1, (), j) for j, i in enumerate(active)]
        depth = 0
        while frontier:
            q = torch.softmax(logits.float(), dim=-1)
            entropy = torch.special.entr(q).sum(dim=-1).tolist()
            widest = max(shapes[i].child_ranks(path)[-1] + 1 for i, _, path, _ in frontier)
            top_q, top_index = q.topk(widest, dim=-1)
            top_tokens = self.head.vocab_ids[top_index].tolist()
            top1 = top_q[:, 0].tolist()
            full = None
            if keep_probs:
                full = q.new_zeros(q.shape[0], self.head.target.config.shape.vocab)
                full[:, self.head.vocab_ids] = q
            stopped = set()
            if stop is not None:
                stopped = {i for i, _, path, j in frontier
                           if path == (0,) * depth and stop(i, depth, top1[j], entropy[j])}
            parents_of_next = []  # (request, node, its path, the row of its parent's feature)
            for i, parent, path, j in frontier:
                chain = chains[i]
                for rank in shapes[i].child_ranks(path):
                    node = len(chain.tokens)
                    chain.tokens.append(top_tokens[j][rank])
                    chain.parents.append(parent)
                    chain.top1.append(top1[j])
                    chain.entropy.append(entropy[j])
                    if full is not None:
                        probs[i].append(full[j])
                    child = (*path, rank)
                    if i not in stopped and shapes[i].child_ranks(child):
                        parents_of_next.append((i, node, child, j))
            if not parents_of_next:
                break
            depth += 1
            by_request: dict[int, list[tuple[int, tuple, int]]] = {}
            for i, node, path, j in parents_of_next:
                by_request.setdefault(i, []).append((node, path, j))
            order = list(by_request)
            tokens, feats, layouts = [], [], []
            for i in order:
                nodes = by_request[i]
                tokens.append(torch.tensor([chains[i].tokens[n] for n, _, _ in nodes],
                                           dtype=torch.int64, device=device))
                feats.append(features[[j for _, _, j in nodes]])
                layouts.append(self._node_layout(chains[i].parents, [n for n, _, _ in nodes],
                                                 seqs[i].cache.length, base[i], depth,
                                                 column[i], device))
            features, logits = self.head(tokens, feats, [seqs[i].cache for i in order],
                                         layouts, every_row=True)
            frontier, row = [], 0
            for i in order:
                for node, path, _ in by_request[i]:
                    frontier.append((i, node, path, row))
                    row += 1
        for i, rows in probs.items():
            chains[i].probs = torch.stack(rows) if rows else None
        return chains

    @staticmethod
    def _node_layout(parents: list[int], nodes: list[int], cached: int, base: int, depth: int,
                     column: dict[int, int], device) -> RowLayout:
        """Nodes of one depth fed side by side at position base + depth - 1 (where a chain feeds
        its depth's draft): each sees the entries before `base` (the history), the columns of
        its ancestors fed at earlier depths, and itself; it takes the next free column."""
        n = len(nodes)
        mask = torch.zeros(n, cached + n, dtype=torch.bool)
        mask[:, :base] = True
        for row, node in enumerate(nodes):
            ancestor = parents[node]
            while ancestor >= 0:
                mask[row, column[ancestor]] = True
                ancestor = parents[ancestor]
            mask[row, cached + row] = True
            column[node] = cached + row
        positions = torch.full((n,), base + depth - 1, dtype=torch.int64)
        return RowLayout(positions.to(device), mask.to(device), base + depth)

    def _looked_up(self, history: Sequence[int], chain: list[int], head_token: int) -> int:
        """The lookup's next token after history + chain on a long enough match, else the
        head's."""
        proposal, matched = self.lookup.match([*history, *chain], 1)
        return proposal[0] if proposal and matched >= self.lookup_min_match else head_token

    def _catch_up(self, seq: _HeadSeq, history: Sequence[int], device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Roll the cache back to its trusted entries; the entries the new features make."""
        seq.cache.truncate(seq.trusted)
        features = torch.cat(seq.pending) if len(seq.pending) != 1 else seq.pending[0]
        count = min(features.shape[0], len(history) - 1 - seq.trusted)
        if count < 1:
            raise RuntimeError("EAGLE drafter: no new target features since the last chain; "
                               "the engine must call observe_hidden after every target pass")
        tokens = torch.tensor(list(history[seq.trusted + 1 : seq.trusted + 1 + count]),
                              dtype=torch.int64, device=device)
        seq.pending = [features[count:]] if count < features.shape[0] else []
        seq.trusted += count
        return tokens, features[:count]

    def _choose(self, logits: torch.Tensor, keep_probs: bool):
        """Per row: the drafted token id (in the target's vocabulary), top-1, entropy, and the
        distribution over the whole vocabulary if asked (zero outside the draft vocabulary)."""
        q = torch.softmax(logits.float(), dim=-1)
        entropy = torch.special.entr(q).sum(dim=-1)
        top1, index = q.max(dim=-1)
        best = self.head.vocab_ids[index]
        full = None
        if keep_probs:
            vocab = self.head.target.config.shape.vocab
            full = q.new_zeros(q.shape[0], vocab)
            full[:, self.head.vocab_ids] = q
        return best.tolist(), top1.tolist(), entropy.tolist(), full

    def finish(self, request_id: int) -> None:
        self._seqs.pop(request_id, None)


@register("eagle", "eagle[@int8][:PATH]", weights=True)
@register("eagle+ngram", "eagle+ngram[@int8][:PATH]", weights=True)
@register("eagle-tree", "eagle-tree[@int8][:PATH]", weights=True)
def build_eagle(spelling: Spelling, setup: DraftSetup) -> EagleDrafter:
    """The shipped head (or the .npz at PATH), its weights in int8 with "@int8"; "eagle+ngram"
    takes the lookup's token where it matched, "eagle-tree" drafts the shipped static tree."""
    kind, weights = spelling.kind, spelling.weights
    if weights is not None and weights != "int8":
        raise ValueError(f"drafter {spelling.spec!r}: the head's weights can be {kind}@int8, not "
                         f"@{weights}")
    head = load_head(setup.target, Path(spelling.arg) if spelling.arg else None)
    if weights:
        head.quantize()
    lookup = NgramDrafter() if kind == "eagle+ngram" else None
    tree = load_tree(SHIPPED_TREE)[0] if kind == "eagle-tree" else None
    return EagleDrafter(head, name=spelling.spec, lookup=lookup, tree=tree)

"""Every position's draft chain of an EAGLE head in a few batched passes (training and recording).

The live drafter (drafters/eagle.py) drafts from the true prefix one chain at a time; here
the chains of all base positions b of one sequence run side by side, one pass per depth:

- depth 1: entry i = (f_i, x_{i+1}) for every i, causal attention over the entries (teacher
  forcing: these are exactly the entries the live head cache holds for the true prefix);
- depth d >= 2, base b: entry (g_b^{(d-1)}, x_{b+d}) at position b + d - 1, where g^{(d-1)} is the
  feature predicted one depth up; it attends to the true entries 0..b and to its own chain's
  entries at depths 2..d, which is the live chain's view when every earlier draft was accepted
  (a chain only goes on while its drafts match, so feeding the true tokens x_{b+d} is exact).

`ChainAttention` is the store/attend object `decoder_layer` calls, in place of KV caches. The same
passes give training its "training-time test" (EAGLE-3, Li et al. 2025, arXiv:2503.01840: the
head learns from its own predicted features, as it drafts) and the recorder its run lengths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from drafters.ngram import NgramDrafter
from eagle.training_data import target_features
from models.eagle_head import EagleHead
from models.llama import LlamaModel
from simulator.draft_tree import TreeShape


class ChainAttention:
    """Attention for one sequence's chains; `begin(depth, rows)` before each depth's pass.
    Each decoder layer of the head (`index`) keeps its own true and chain keys and values.

    With `segments` (the sequence index of every row), several sequences packed one after
    another are one batch: a row attends only to rows of its own sequence."""

    def __init__(self, heads: int, kv_heads: int, segments: torch.Tensor | None = None) -> None:
        self.group = heads // kv_heads
        self.segments = segments
        self.depth, self.rows = 1, slice(None)
        self.true_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per layer index
        # per layer index: (first base row, k, v) of each chain depth >= 2 so far
        self.own: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}

    def begin(self, depth: int, rows: slice) -> None:
        """The next pass is `depth` for the base rows `rows` (a contiguous range, step 1)."""
        self.depth, self.rows = depth, rows

    def store(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.depth == 1:
            self.true_kv[index] = (keys, values)
        else:
            self.own.setdefault(index, []).append((self.rows.start or 0, keys, values))

    def attend(self, index: int, queries: torch.Tensor) -> torch.Tensor:
        tokens, heads, head_dim = queries.shape
        keys, values = self.true_kv[index]
        if self.depth == 1:
            mask = None
            if self.segments is not None:  # causal within each packed sequence
                seg = self.segments[:tokens]
                mask = (seg[:, None] == seg[None, :]).tril()
            out = F.scaled_dot_product_attention(
                queries.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                values.transpose(0, 1)[None], attn_mask=mask, is_causal=mask is None,
                enable_gqa=True)[0]
            return out.transpose(0, 1).reshape(tokens, heads * head_dim)
        start = self.rows.start or 0
        bases = torch.arange(start, start + tokens, device=queries.device)
        scale = 1.0 / math.sqrt(head_dim)
        k_true = keys.repeat_interleave(self.group, dim=1)  # [M, heads, hd]
        v_true = values.repeat_interleave(self.group, dim=1)
        scores = torch.einsum("thd,jhd->htj", queries, k_true) * scale  # [heads, t, M]
        past = torch.arange(keys.shape[0], device=queries.device)[None, :] > bases[:, None]
        if self.segments is not None:  # and the true entries of other packed sequences
            past = past | (self.segments[None, : keys.shape[0]] != self.segments[bases][:, None])
        scores = scores.masked_fill(past[None], float("-inf"))
        own_k, own_v = [], []
        for first, k, v in self.own[index]:  # this chain's entries at depths 2..d (last: itself)
            lo = start - first
            own_k.append(k[lo : lo + tokens].repeat_interleave(self.group, dim=1))
            own_v.append(v[lo : lo + tokens].repeat_interleave(self.group, dim=1))
        own_scores = torch.stack([(queries * k).sum(-1) for k in own_k], dim=-1) * scale
        weights = torch.softmax(torch.cat((scores, own_scores.permute(1, 0, 2)), dim=-1), dim=-1)
        out = weights[..., : keys.shape[0]] @ v_true.transpose(0, 1)  # [heads, t, hd]
        own_w = weights[..., keys.shape[0] :].permute(1, 0, 2)  # [t, heads, depth - 1]
        out = out.transpose(0, 1) + (own_w[..., None] * torch.stack(own_v, dim=2)).sum(dim=2)
        return out.reshape(tokens, heads * head_dim)


def chain_passes(head: EagleHead, tokens: torch.Tensor, features: torch.Tensor, depths: int,
                 first_base: int = 0, segments: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None):
    """Yield (depth, base rows, predicted features [rows, hidden]) for depth 1..`depths`.

    tokens [N] and features [N, hidden] of one sequence. Depth 1 covers bases 0..N-2; depth d
    the bases first_base..N-1-d (those with a token x_{b+d} to feed; `first_base` skips chains
    nobody asks for). A base b's depth-d feature predicts f_{b+d}, whose draft is x_{b+d+1}.

    Packed sequences (`eagle.losses.PackedBatch`): `segments` [N] the sequence of each row and
    `positions` [N] each row's position in its own sequence; each sequence must be followed by
    `depths` rows of padding, so that a chain of its own never reads the next sequence's tokens.
    """
    shape = head.config.shape
    n = tokens.shape[0]
    attention = ChainAttention(shape.heads, shape.kv_heads, segments)
    if positions is None:
        positions = torch.arange(n, device=tokens.device)
        end = n
    else:
        end = int(positions.max()) + 1
    x = head.entries(tokens[1:], features[:-1])
    predicted = head.layer_forward(x, positions[:-1], end, attention)
    yield 1, slice(0, n - 1), predicted
    offset = 0  # the base row of predicted[0]
    for depth in range(2, depths + 1):
        rows = slice(first_base, n - depth)
        if rows.stop <= rows.start:
            return
        lo, hi = rows.start, rows.stop
        inputs = head.entries(tokens[lo + depth : hi + depth], predicted[lo - offset : hi - offset])
        attention.begin(depth, rows)
        predicted = head.layer_forward(inputs, positions[lo + depth - 1 : hi + depth - 1],
                                       end + depth, attention)
        offset = lo
        yield depth, rows, predicted


@torch.no_grad()
def eagle_runs(head: EagleHead, target: LlamaModel, prompt: Sequence[int], output: Sequence[int],
               max_run: int, features: torch.Tensor | None = None,
               lookup: NgramDrafter | None = None, lookup_min_match: int = 2,
               tree: TreeShape | None = None) -> tuple[np.ndarray, torch.Tensor]:
    """run[t] of the head's greedy chain from the true prefix at every output position t
    (run[0] = 0: the prefill emits it), and the first draft's distribution over the draft
    vocabulary at each t [N, V_d] (row 0: the prefill's position, never drafted).

    The chain at t starts from history prompt + output[:t]: its depth-d draft comes from base
    b = P + t - 2 and predicts output[t + d - 1]; the run is the matching prefix, capped at
    `max_run`. With a `lookup` (the `eagle+ngram` drafter), the draft of output[s] is the
    lookup's token wherever it matched a suffix of >= `lookup_min_match` tokens of the true
    history before s (the live chain's history while its drafts match), else the head's.

    With a draft `tree` (drafters/tree_layout.py) the run is how deep the tree follows the
    target's greedy path: the rank of the true token under the head's distribution at each
    depth (the chain fed the true tokens, as the tree's node on that path is) names the path.
    """
    if tree is not None:
        if lookup is not None:
            raise ValueError("a draft tree takes the head's candidates only: no lookup with it")
        max_run = min(max_run, tree.depth)
        ranks = np.full((len(output), max_run), np.iinfo(np.int32).max, dtype=np.int64)
        in_draft = draft_index(head)
    tokens_list = [int(t) for t in prompt] + [int(t) for t in output]
    n_prompt, n_out = len(prompt), len(output)
    if features is None:
        features = target_features(target, tokens_list[:-1] if n_out > 0 else tokens_list)
    features = features.to(head.config.device, head.config.dtype)  # the head's device (a GPU)
    tokens = torch.tensor(tokens_list, dtype=torch.int64, device=features.device)
    tokens = tokens[:-1]  # x_{N-1} predicts nothing
    matches = np.zeros((n_out, max_run), dtype=bool)
    first = None
    still = np.ones(n_out, dtype=bool)
    still[0] = False
    first_base = max(n_prompt - 1, 0)  # t >= 1 needs b = P + t - 2 >= P - 1
    truth = torch.tensor([int(t) for t in output], dtype=torch.int64)
    looked_up = None
    if lookup is not None:
        token, length = lookup.next_tokens(prompt, output)
        looked_up = torch.as_tensor(np.where(length >= lookup_min_match, token, -1))
    for depth, rows, predicted in chain_passes(head, tokens, features, max_run, first_base):
        logits = head.draft_logits(predicted).float()
        drafts = head.vocab_ids[logits.argmax(dim=-1)].cpu()
        bases = torch.arange(rows.start, rows.stop)
        t = bases - n_prompt + 2  # chain start
        keep = (t >= 1) & (t + depth - 1 < n_out)
        if tree is not None:
            store_ranks(ranks, logits[keep.to(logits.device)].cpu(), in_draft,
                         truth, t[keep], depth)
        t, drafts = t[keep], drafts[keep]
        if looked_up is not None:
            from_lookup = looked_up[t + depth - 1]
            drafts = torch.where(from_lookup >= 0, from_lookup, drafts)
        ok = (drafts == truth[t + depth - 1]).numpy()
        matches[t.numpy(), depth - 1] = ok
        if depth == 1:
            first = torch.zeros(n_out, logits.shape[1])
            rows_t = bases - n_prompt + 2
            sel = (rows_t >= 0) & (rows_t < n_out)
            first[rows_t[sel]] = torch.softmax(logits[sel.to(logits.device)], dim=-1).cpu()
        still[t.numpy()] &= ok
        if not still.any() and tree is None:  # a tree's runners-up may still go deeper
            break
    run = np.zeros(n_out, dtype=np.int32)
    for t in range(1, n_out):
        if tree is not None:
            run[t] = tree.run(ranks[t])
            continue
        m = matches[t]
        run[t] = max_run if m.all() else int(np.argmin(m))
    return run, first


def draft_index(head: EagleHead) -> torch.Tensor:
    """[target vocab]: each token's column in the head's draft vocabulary, -1 outside it (CPU)."""
    index = torch.full((head.target.config.shape.vocab,), -1, dtype=torch.int64)
    index[head.vocab_ids.cpu()] = torch.arange(head.draft_vocab)
    return index


def eagle_ranks(head: EagleHead, target: LlamaModel, prompt: Sequence[int],
                output: Sequence[int], depth: int) -> np.ndarray:
    """ranks[t, d - 1]: the true token's rank under the head's depth-d distribution of the chain
    from output position t (fed the true tokens, as a draft tree's node on the target's greedy
    path is); the int32 maximum outside the draft vocabulary. What a tree shape is chosen and
    scored from (simulator/draft_tree.py)."""
    tokens = [*prompt, *output]
    features = target_features(target, tokens[:-1]).to(head.config.device, head.config.dtype)
    ranks = np.full((len(output), depth), np.iinfo(np.int32).max, dtype=np.int64)
    in_draft, truth = draft_index(head), torch.tensor(list(output))
    fed = torch.tensor(tokens[:-1], device=features.device)
    with torch.no_grad():
        for d, rows, predicted in chain_passes(head, fed, features, depth,
                                               max(len(prompt) - 1, 0)):
            t = torch.arange(rows.start, rows.stop) - len(prompt) + 2
            keep = (t >= 1) & (t + d - 1 < len(output))
            logits = head.draft_logits(predicted).float()[keep.to(predicted.device)].cpu()
            store_ranks(ranks, logits, in_draft, truth, t[keep], d)
    return ranks


def store_ranks(ranks: np.ndarray, logits: torch.Tensor, in_draft: torch.Tensor,
                 truth: torch.Tensor, t: torch.Tensor, depth: int) -> None:
    """ranks[t, depth - 1] = how many draft tokens the head puts above the true next token
    (0: its top-1); a token outside the draft vocabulary keeps the int32 maximum (never drafted)."""
    index = in_draft[truth[t + depth - 1]]
    known = index >= 0
    own = logits.gather(1, index.clamp_min(0)[:, None])
    above = (logits > own).sum(dim=1)
    ranks[t[known].numpy(), depth - 1] = above[known].numpy()

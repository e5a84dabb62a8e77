"""Every position's draft chain of an EAGLE head in a few batched passes (training and recording).

The live drafter (profiler/eagle_drafter.py) drafts from the true prefix one chain at a time; here
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

import torch
import torch.nn.functional as F

from profiler.eagle import EagleHead


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

    Packed sequences (`eagle_train.PackedBatch`): `segments` [N] the sequence of each row and
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

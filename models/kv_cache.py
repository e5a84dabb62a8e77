"""Per-request KV caches, and how a ragged batch reads and writes them in one forward pass.

Speculative decoding appends k + 1 tokens per verify pass and rolls the rejected ones back, so the
cache is a buffer with a logical `length`: truncation is free and the rows past `length` are
simply overwritten by the next pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


class CachedSequence:
    """What every cache of one sequence shares: a logical `length`, rolled back by `truncate`,
    and the checks of `keep` (KVCache here, paged_kv.PagedSeq)."""

    length: int

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (rejected draft tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate length must be in [0, {self.length}], got {length}")
        self.length = length

    def _moved(self, start: int, rows: list[int]) -> list[int]:
        """The j whose row `start + rows[j]` must move to `start + j` (`keep`), after checking
        that the rows ascend within the cached positions."""
        if rows and (rows != sorted(set(rows)) or rows[0] < 0 or start + rows[-1] >= self.length):
            raise ValueError(f"keep: rows {rows} must ascend within the {self.length - start} "
                             f"positions after {start}")
        return [j for j, row in enumerate(rows) if row != j]


class KVCache(CachedSequence):
    """K and V of every layer for one sequence, each [kv_heads, capacity, head_dim].

    `keys[layer][:, :length]` holds the keys of the cached tokens, in position order. The model
    writes rows `length .. length + q` during a forward pass and then advances `length`.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int = 256,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if min(layers, kv_heads, head_dim, capacity) < 1:
            raise ValueError(
                f"KVCache dimensions must be >= 1, got layers={layers}, kv_heads={kv_heads}, "
                f"head_dim={head_dim}, capacity={capacity}"
            )
        self.length = 0
        # One block [layers, 2, kv_heads, capacity, head_dim]: a single allocation per request.
        self._block = torch.empty(
            layers, 2, kv_heads, capacity, head_dim, dtype=dtype, device=device
        )
        self._views()

    def _views(self) -> None:
        """Per-layer views, built once per allocation so the forward pass does no indexing."""
        self.keys: list[torch.Tensor] = [layer[0] for layer in self._block]
        self.values: list[torch.Tensor] = [layer[1] for layer in self._block]

    @property
    def capacity(self) -> int:
        """Tokens the current block holds before it must grow."""
        return self._block.shape[3]

    def reserve(self, tokens: int) -> None:
        """Make room for `tokens` positions in all, doubling the block (amortised O(1) appends)."""
        if tokens <= self.capacity:
            return
        capacity = max(tokens, 2 * self.capacity)
        layers, _, kv_heads, _, head_dim = self._block.shape
        # A normal tensor even when grown inside a forward pass (inference mode), so that callers
        # may still write to the cache outside one.
        with torch.inference_mode(False):
            block = self._block.new_empty(layers, 2, kv_heads, capacity, head_dim)
            block[:, :, :, : self.length] = self._block[:, :, :, : self.length]
        self._block = block
        self._views()

    def keep(self, start: int, rows: list[int]) -> None:
        """Keep, after the first `start` positions, only the rows `start + rows[j]` (ascending),
        moved to `start + j`: a verified tree's accepted path out of all the nodes it fed."""
        moved = self._moved(start, rows)
        if moved:
            src = torch.tensor([start + rows[j] for j in moved], device=self._block.device)
            dst = torch.tensor([start + j for j in moved], device=self._block.device)
            self._block[:, :, :, dst] = self._block[:, :, :, src]
        self.length = start + len(rows)

    def fill_random_(self, length: int, generator: torch.Generator | None = None) -> None:
        """Pretend `length` tokens are cached, with random K/V: for timing only.

        Pass times do not depend on the values, but uninitialised memory may hold denormals,
        which slow CPU arithmetic down, so the cache is filled with normal noise.
        """
        self.reserve(length)
        with torch.no_grad():
            self._block[:, :, :, :length].normal_(generator=generator)
        self.length = length

    def clone(self) -> KVCache:
        """An independent copy of the cached positions (a fork of the sequence)."""
        copy = KVCache.__new__(KVCache)
        copy.length = self.length
        copy._block = self._block.clone()
        copy._views()
        return copy

    def nbytes(self) -> int:
        """Bytes allocated for the block (capacity, not length)."""
        return self._block.numel() * self._block.element_size()


@dataclass(frozen=True)
class RowLayout:
    """Where one request's new tokens sit when they are not a run of consecutive positions: a
    draft tree's nodes (drafters/tree_layout.py) share positions (siblings) and each sees only
    its ancestors. `positions` [n] absolute, `mask` [n, cached + n] bool (True = attend), `end`
    one past the largest position (known to whoever lays the tree out: no device read)."""

    positions: torch.Tensor
    mask: torch.Tensor
    end: int


def check_batch(q: Sequence[int], caches: Sequence) -> None:
    """One cache per request, each appearing once, and >= 1 new token each."""
    if not q or len(q) != len(caches):
        raise ValueError(f"need one cache per request, got {len(q)} and {len(caches)}")
    if min(q) < 1:
        raise ValueError(f"every request needs >= 1 new token, got {q}")
    if len({id(cache) for cache in caches}) != len(caches):
        raise ValueError("a cache appears twice in one batch")


def checked_layouts(layouts: list[RowLayout | None] | None, q: Sequence[int],
                    cached: Sequence[int]) -> list[RowLayout | None] | None:
    """The layouts of a pass (None when no request has one), each checked against its
    request's new and cached tokens."""
    if layouts is None or not any(layouts):
        return None
    if len(layouts) != len(q):
        raise ValueError(f"need one layout (or None) per request, got {len(layouts)}")
    for r, (layout, n, c) in enumerate(zip(layouts, q, cached)):
        if layout is not None and (layout.positions.shape != (n,)
                                   or layout.mask.shape != (n, c + n)):
            raise ValueError(f"request {r}: a layout of {n} new tokens after {c} cached "
                             f"ones needs positions [{n}] and a mask [{n}, {c + n}]")
    return layouts


class BatchAttention:
    """How one ragged batch reads and writes its requests' caches, worked out once per pass.

    Request r brings q_r new tokens after c_r cached ones; its new tokens are rows
    bounds[r]..bounds[r+1] of the packed batch. New token i sees cached keys and new keys 0..i:
    no mask when q_r == 1, SDPA's causal flag when c_r == 0, else a [q_r, c_r + q_r] mask.
    With `batched` and every request at the same (q, c), attention is one SDPA call over stacked
    caches instead of one call per request (fewer kernel launches, one more copy of the caches).
    """

    def __init__(self, q: list[int], caches: list[KVCache], batched: bool = False,
                 layouts: list[RowLayout | None] | None = None) -> None:
        check_batch(q, caches)
        self.q = q
        self.caches = caches
        self.cached = [cache.length for cache in caches]
        self.bounds = [0]
        for n in q:
            self.bounds.append(self.bounds[-1] + n)
        self.device = caches[0].keys[0].device
        self.max_length = max(c + n for c, n in zip(self.cached, q))
        for cache, c, n in zip(caches, self.cached, q):
            cache.reserve(c + n)
        self.layouts = checked_layouts(layouts, q, self.cached)
        self.same_lengths = len(set(zip(q, self.cached))) == 1 and self.layouts is None
        self.uniform = batched and len(q) > 1 and self.same_lengths
        self.masks = [self._mask(n, c) for n, c in zip(q, self.cached)]
        if self.layouts is not None:
            self.masks = [m if layout is None else layout.mask.to(self.device)
                          for m, layout in zip(self.masks, self.layouts)]
            ends = [layout.end for layout in self.layouts if layout is not None]
            self.max_length = max(self.max_length, *ends)

    def _mask(self, n: int, c: int) -> torch.Tensor | None:
        """Boolean [n, c + n] mask (True = attend), or None when no mask or SDPA's causal flag."""
        if n == 1 or c == 0:
            return None
        return torch.ones(n, c + n, dtype=torch.bool, device=self.device).tril(diagonal=c)

    def positions(self) -> torch.Tensor:
        """Absolute position of every packed token within its own sequence."""
        if self.layouts is not None:
            return torch.cat([torch.arange(c, c + n, device=self.device) if layout is None
                              else layout.positions.to(self.device)
                              for c, n, layout in zip(self.cached, self.q, self.layouts)])
        if self.same_lengths:
            c, n = self.cached[0], self.q[0]
            return torch.arange(c, c + n, device=self.device).repeat(len(self.q))
        ranges = [torch.arange(c, c + n, device=self.device) for c, n in zip(self.cached, self.q)]
        return torch.cat(ranges)

    def last_rows(self) -> torch.Tensor:
        """Packed row of each request's last new token."""
        return torch.tensor([end - 1 for end in self.bounds[1:]], device=self.device)

    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write the new tokens' K and V [tokens, kv_heads, head_dim] after each cached prefix."""
        for r, cache in enumerate(self.caches):
            start, end, c = self.bounds[r], self.bounds[r + 1], self.cached[r]
            cache.keys[layer][:, c : c + end - start] = keys[start:end].transpose(0, 1)
            cache.values[layer][:, c : c + end - start] = values[start:end].transpose(0, 1)

    def attend(self, layer: int, queries: torch.Tensor) -> torch.Tensor:
        """Attention output [tokens, heads * head_dim] of queries [tokens, heads, head_dim]."""
        tokens, heads, head_dim = queries.shape
        gqa = heads != self.caches[0].keys[layer].shape[0]
        if self.uniform:
            return self._attend_uniform(layer, queries, gqa).reshape(tokens, heads * head_dim)
        out = queries.new_empty(tokens, heads, head_dim) if len(self.q) > 1 else None
        for r, cache in enumerate(self.caches):
            start, end, length = self.bounds[r], self.bounds[r + 1], self.cached[r] + self.q[r]
            o = F.scaled_dot_product_attention(  # 4-D: CPU's fused kernel skips 3-D inputs
                queries[start:end].transpose(0, 1).unsqueeze(0),
                cache.keys[layer][:, :length].unsqueeze(0),
                cache.values[layer][:, :length].unsqueeze(0),
                attn_mask=self.masks[r],
                is_causal=self.masks[r] is None and self.cached[r] == 0 and self.q[r] > 1,
                enable_gqa=gqa,
            )[0]
            if out is None:
                return o.transpose(0, 1).reshape(tokens, heads * head_dim)
            out[start:end] = o.transpose(0, 1)
        return out.view(tokens, heads * head_dim)

    def _attend_uniform(self, layer: int, queries: torch.Tensor, gqa: bool) -> torch.Tensor:
        """One SDPA call over [batch, heads, q, head_dim] when every request has the same (q, c)."""
        batch, n, length = len(self.q), self.q[0], self.cached[0] + self.q[0]
        q = queries.view(batch, n, *queries.shape[1:]).transpose(1, 2)
        k = torch.stack([cache.keys[layer][:, :length] for cache in self.caches])
        v = torch.stack([cache.values[layer][:, :length] for cache in self.caches])
        o = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=self.masks[0],
            is_causal=self.cached[0] == 0 and n > 1,
            enable_gqa=gqa,
        )
        return o.transpose(1, 2)

    def commit(self) -> None:
        """Advance every cache past the tokens this pass wrote."""
        for cache, n in zip(self.caches, self.q):
            cache.length += n

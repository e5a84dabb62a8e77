"""One paged KV cache per model for the whole batch, and attention over it in one call per layer.

A per-request cache (kv_cache.KVCache) costs a Python-level copy and an attention call per
request and per layer: on a GPU a pass then grows with the number of requests and hardly with
the context, the opposite of a real engine. Here, as in vLLM and nano-vllm, the K/V of every
sequence live in one pool of fixed-size blocks; a sequence owns a list of blocks (its block
table). A pass writes the new tokens of all requests with one `index_copy_` per layer for K and
one for V, and attends with one call per layer (docs/gpu-engine.md):

- `torch` backend: gather each request's blocks into a padded [batch, kv_heads, L, head_dim]
  view and run one SDPA with a [batch, 1, G*q, L] mask. The G query heads that share a KV head
  are folded into the query dimension, so grouped-query attention needs no K/V repeat and any
  SDPA kernel applies (CPU's too).
- `triton` backend (CUDA, models/paged_triton.py): a split-K kernel reads the blocks in place
  through the block table, for passes of a few tokens per request (decode, verify, draft).

Block 0 is a null block that no sequence owns: padded requests (CUDA-graph buckets) point there.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from models import paged_triton
from models.kv_cache import CachedSequence, RowLayout, check_batch, checked_layouts
from models.padded_layout import pad_queries, unpad_output

#: Tokens per block. 16 as vLLM's default on GPUs: small enough that a sequence wastes at most
#: 15 slots, large enough that a block of K for one head is 4 KB (bf16, head_dim 128).
BLOCK_SIZE = 16


#: SDPA kernels for the gathered path on CUDA (prefills, draft trees). In both H200 runs a
#: prompt length's first prefill took ~100 ms more than its repeats (docs/gpu-engine.md), the
#: signature of a per-shape plan; cuDNN's attention builds one, the memory-efficient kernel
#: (which takes a boolean mask) does not. To be confirmed on the next GPU run.
_CUDA_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]

#: The Triton kernel holds a (query heads of a group x new tokens) tile per program: passes of a
#: few tokens per request (decode, verify, draft). Prefills and draft trees take the torch path.
TRITON_ROWS = 128


class KVPoolFull(RuntimeError):
    """The pool has no free block left and may not grow (a CUDA pool is sized once)."""


class KVPool:
    """K/V storage [layers, 2, slots, kv_heads, head_dim] cut into blocks of `block_size` slots.

    `growable` (CPU): when blocks run out the storage doubles, copying what it holds; a CUDA
    pool is sized once from free memory (`blocks_for_memory`), so CUDA graphs captured over its
    storage stay valid, and running out is an error with the numbers in it. `generation` counts
    reallocations: whoever captured the storage checks it.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, blocks: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 block_size: int = BLOCK_SIZE, growable: bool = True) -> None:
        if min(layers, kv_heads, head_dim, block_size) < 1 or blocks < 2:
            raise ValueError(f"a KV pool needs layers, kv_heads, head_dim, block_size >= 1 and "
                             f">= 2 blocks (one is the null block), got layers={layers}, "
                             f"kv_heads={kv_heads}, head_dim={head_dim}, blocks={blocks}, "
                             f"block_size={block_size}")
        self.block_size, self.growable = block_size, growable
        self.generation = 0
        with torch.inference_mode(False):
            self.kv = torch.zeros(layers, 2, blocks * block_size, kv_heads, head_dim,
                                  dtype=dtype, device=device)
        self._views()
        self._free = list(range(blocks - 1, 0, -1))  # a stack; block 0 is the null block
        #: CUDA graphs captured over this storage, per (model, backend): they live and die
        #: with the pool (models/cuda_graphs.py)
        self.runners: dict[tuple, object] = {}

    def _views(self) -> None:
        self.keys: list[torch.Tensor] = [layer[0] for layer in self.kv]
        self.values: list[torch.Tensor] = [layer[1] for layer in self.kv]

    @property
    def blocks(self) -> int:
        return self.kv.shape[2] // self.block_size

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def device(self) -> torch.device:
        return self.kv.device

    def bytes_per_block(self) -> int:
        layers, _, _, kv_heads, head_dim = self.kv.shape
        return layers * 2 * self.block_size * kv_heads * head_dim * self.kv.element_size()

    def allocate(self, n: int) -> list[int]:
        """`n` free blocks (growing the storage if allowed), or KVPoolFull."""
        if n > len(self._free):
            if not self.growable:
                raise KVPoolFull(
                    f"the KV pool is full: {n} more blocks of {self.block_size} tokens asked, "
                    f"{len(self._free)} of {self.blocks - 1} free "
                    f"({self.bytes_per_block() * (self.blocks - 1) / 2**30:.1f} GiB). Serve "
                    f"fewer sequences at once (--max-num-seqs) or shorter ones, or give the "
                    f"cache a larger share of the device's memory.")
            self._grow(max(2 * self.blocks, self.blocks + n + 1))
        taken = self._free[-n:] if n else []
        del self._free[len(self._free) - n:]
        return taken[::-1]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))

    def _grow(self, blocks: int) -> None:
        old = self.kv
        with torch.inference_mode(False):
            self.kv = old.new_zeros(old.shape[0], 2, blocks * self.block_size, *old.shape[3:])
            self.kv[:, :, : old.shape[2]] = old
        self._free = list(range(blocks - 1, old.shape[2] // self.block_size - 1, -1)) + self._free
        self.generation += 1
        self._views()

    def sequence(self, capacity: int = 0) -> PagedSeq:
        """An empty sequence with room for `capacity` tokens."""
        seq = PagedSeq(self)
        seq.reserve(capacity)
        return seq

    def slots(self, blocks: Sequence[int], start: int, end: int) -> torch.Tensor:
        """Slot index of each position start..end-1 of a sequence with these blocks."""
        positions = torch.arange(start, end)
        table = torch.tensor(blocks, dtype=torch.int64)
        slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
        return slots.to(self.device)


def blocks_for_memory(free_bytes: int, total_bytes: int, bytes_per_block: int,
                      utilisation: float = 0.9, headroom_bytes: int = 0) -> int:
    """Blocks a pool may take: what is free, less the share of the device kept back
    ((1 - utilisation) of its total, as vLLM's gpu_memory_utilization) and `headroom_bytes`
    (activations, CUDA graphs); 0 when that leaves nothing."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")
    budget = free_bytes - (1 - utilisation) * total_bytes - headroom_bytes
    return max(0, int(budget // bytes_per_block))


class PagedSeq(CachedSequence):
    """One sequence's block table in a KVPool, with KVCache's interface (length, reserve, keep,
    truncate, fill_random_, clone), so the engine, drafters and profiler use either. Its blocks
    go back to the pool when it is released or garbage-collected."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.length = 0
        self.blocks: list[int] = []
        self._array = np.zeros(0, dtype=np.int64)
        self._finalizer = weakref.finalize(self, pool.release, self.blocks)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.pool.block_size

    def block_array(self) -> np.ndarray:
        """The block table as int64 numpy, cached until the table changes (blocks are only
        appended, or all released): building a batch's table is then one slice copy per
        request, not a Python loop over its blocks."""
        if self._array.shape[0] != len(self.blocks):
            self._array = np.asarray(self.blocks, dtype=np.int64)
        return self._array

    def reserve(self, tokens: int) -> None:
        need = -(-tokens // self.pool.block_size) - len(self.blocks)
        if need > 0:
            self.blocks.extend(self.pool.allocate(need))

    def release(self) -> None:
        """Give the blocks back now (the sequence is finished)."""
        self._finalizer()
        self.blocks = []
        self.length = 0
        self._finalizer = weakref.finalize(self, self.pool.release, self.blocks)

    def slots(self, start: int, end: int) -> torch.Tensor:
        return self.pool.slots(self.blocks, start, end)

    def keep(self, start: int, rows: list[int]) -> None:
        """As KVCache.keep: keep after `start` only the rows `start + rows[j]`, moved to
        `start + j` (a verified tree's accepted path)."""
        moved = self._moved(start, rows)
        if moved:
            every = self.slots(0, start + rows[-1] + 1)
            src = every[torch.tensor([start + rows[j] for j in moved], device=every.device)]
            dst = every[torch.tensor([start + j for j in moved], device=every.device)]
            self.pool.kv[:, :, dst] = self.pool.kv[:, :, src]
        self.length = start + len(rows)

    def fill_random_(self, length: int, generator: torch.Generator | None = None) -> None:
        """Pretend `length` tokens are cached, with random K/V: for timing only (see KVCache)."""
        self.reserve(length)
        kv = self.pool.kv
        noise = torch.empty(kv.shape[0], 2, length, *kv.shape[3:], dtype=kv.dtype,
                            device=kv.device)
        with torch.no_grad():
            noise.normal_(generator=generator)
            kv[:, :, self.slots(0, length)] = noise
        self.length = length

    def clone(self) -> PagedSeq:
        copy = self.pool.sequence(self.capacity)
        copy.length = self.length
        if self.length:
            self.pool.kv[:, :, copy.slots(0, self.length)] = \
                self.pool.kv[:, :, self.slots(0, self.length)]
        return copy

    def nbytes(self) -> int:
        return len(self.blocks) * self.pool.bytes_per_block()


class PagedOps:
    """A pass's two calls per layer over a pool, given the pass's index tensors: `table`
    [B, width blocks], `slots` and `positions` [tokens], `cached` [B], and where the requests'
    new tokens differ in number `padded_rows` (and `read_rows`) [tokens] (pad_queries), and
    `mask` [B, 1, qmax, width] for draft trees. PagedBatch builds them per pass; a CUDA
    graph keeps them in static buffers (models/cuda_graphs.py)."""

    pool: KVPool
    tensors: dict[str, torch.Tensor]
    qmax: int
    backend: str
    max_length: int

    def positions(self) -> torch.Tensor:
        return self.tensors["positions"]

    # -- the layer's two calls -----------------------------------------------------------------

    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write the new tokens' K and V [tokens, kv_heads, head_dim] into their slots."""
        slots = self.tensors["slots"]
        d = keys.shape[-1]
        if (self.backend == "triton" and d & (d - 1) == 0 and keys.stride(-1) == 1
                and values.stride(-1) == 1):  # the kernel's shapes; else index_copy_
            paged_triton.store_kv(keys, values, self.pool.keys[layer], self.pool.values[layer],
                                  slots)
            return
        self.pool.keys[layer].index_copy_(0, slots, keys)
        self.pool.values[layer].index_copy_(0, slots, values)

    def attend(self, layer: int, queries: torch.Tensor) -> torch.Tensor:
        """Attention output [tokens, heads * head_dim] of queries [tokens, heads, head_dim]."""
        if self.backend == "triton" and "mask" not in self.tensors and (
                queries.shape[1] // self.pool.keys[layer].shape[1] * self.qmax <= TRITON_ROWS):
            return paged_triton.paged_attention(
                queries, self.pool.keys[layer], self.pool.values[layer], self.tensors,
                self.qmax, self.pool.block_size)
        return attend_gathered(queries, self.pool.keys[layer], self.pool.values[layer],
                               self.tensors, self.qmax, self.pool.block_size)



class PagedBatch(PagedOps):
    """BatchAttention's interface (store, attend, positions, last_rows, commit) over PagedSeqs of
    one pool: every per-pass index is built once here, so each layer costs one write of K, one
    of V and one attention call. Request r brings q_r new tokens after c_r cached ones.
    """

    def __init__(self, q: list[int], caches: Sequence[PagedSeq],
                 layouts: list[RowLayout | None] | None = None, backend: str = "torch") -> None:
        check_batch(q, caches)
        pools = {id(cache.pool) for cache in caches}
        if len(pools) != 1:
            raise ValueError("the caches of one batch must share one KV pool")
        self.pool = caches[0].pool
        self.q, self.caches = list(q), list(caches)
        self.cached = [cache.length for cache in caches]
        self.bounds = [0]
        for n in q:
            self.bounds.append(self.bounds[-1] + n)
        self.device = self.pool.device
        self.layouts = checked_layouts(layouts, q, self.cached)
        ends = [c + n for c, n in zip(self.cached, q)]
        for cache, end in zip(caches, ends):
            cache.reserve(end)
        self.max_length = max(ends)
        if self.layouts is not None:
            self.max_length = max(self.max_length,
                                  *(layout.end for layout in self.layouts if layout is not None))
        self.backend, self.qmax = backend, max(q)
        self.tensors = self._build_tensors()

    # -- per-pass indices ----------------------------------------------------------------------

    def _build_tensors(self) -> dict[str, torch.Tensor]:
        """Every index the layers read, built on the host and moved in one go per tensor."""
        bs, batch, qmax = self.pool.block_size, len(self.q), max(self.q)
        width_blocks = -(-max(c + n for c, n in zip(self.cached, self.q)) // bs)
        table = torch.zeros(batch, width_blocks, dtype=torch.int64)
        for r, cache in enumerate(self.caches):
            table[r, : len(cache.blocks)] = torch.tensor(cache.blocks[:width_blocks])
        positions = torch.cat([torch.arange(c, c + n) for c, n in zip(self.cached, self.q)])
        rows = torch.repeat_interleave(torch.arange(batch), torch.tensor(self.q))
        slots = table[rows, positions // bs] * bs + positions % bs
        counts = torch.tensor(self.q)
        within = positions - torch.repeat_interleave(torch.tensor(self.cached), counts)
        if self.layouts is not None:
            positions = torch.cat([torch.arange(c, c + n) if layout is None
                                   else layout.positions.cpu()
                                   for c, n, layout in zip(self.cached, self.q, self.layouts)])
        device = self.device
        out = {"table": table, "positions": positions, "slots": slots,
               "cached": torch.tensor(self.cached)}
        if len(set(self.q)) > 1:
            out["padded_rows"] = rows * qmax + within
        out = {name: t.to(device, non_blocking=True) for name, t in out.items()}
        if self.layouts is not None:
            out["mask"] = self._tree_mask(width_blocks * bs)
        return out

    def _tree_mask(self, width: int) -> torch.Tensor:
        """[batch, 1, qmax, width] bool: causal rows, a layout's own mask where one is given."""
        qmax = max(self.q)
        keys = torch.arange(width)
        mask = keys[None, None, :] <= (torch.tensor(self.cached)[:, None, None]
                                       + torch.arange(qmax)[None, :, None])
        for r, layout in enumerate(self.layouts):
            if layout is not None:
                c, n = self.cached[r], self.q[r]
                mask[r, :n, : c + n] = layout.mask.cpu()
                mask[r, :n, c + n :] = False
        return mask.unsqueeze(1).to(self.device)

    def last_rows(self) -> torch.Tensor:
        return torch.tensor([end - 1 for end in self.bounds[1:]], device=self.device)

    def commit(self) -> None:
        for cache, n in zip(self.caches, self.q):
            cache.length += n


def attend_gathered(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    t: dict[str, torch.Tensor], qmax: int, block_size: int) -> torch.Tensor:
    """Gather each request's blocks, then one SDPA with the query heads of a group folded into
    the query dimension: q [B, kvh, G*qmax, d] against k, v [B, kvh, L, d]."""
    table = t["table"]
    batch, width = table.shape[0], table.shape[1] * block_size
    heads, d = queries.shape[1:]
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    slots = (table.unsqueeze(-1) * block_size
             + torch.arange(block_size, device=table.device)).view(batch, width)
    k = keys[slots].transpose(1, 2)  # [B, kvh, L, d]
    v = values[slots].transpose(1, 2)
    q = pad_queries(queries, t, batch, qmax)  # [B, qmax, H, d]
    q = q.view(batch, qmax, kv_heads, group, d).permute(0, 2, 3, 1, 4)
    q = q.reshape(batch, kv_heads, group * qmax, d)
    mask = t.get("mask")
    if mask is None:  # key j is visible to new token i of request r iff j <= c_r + i
        mask = (torch.arange(width, device=table.device).view(1, 1, width)
                <= (t["cached"].view(batch, 1, 1)
                    + torch.arange(qmax, device=table.device).view(1, qmax, 1))).unsqueeze(1)
    mask = mask.expand(batch, group, qmax, width).reshape(batch, 1, group * qmax, width)
    if q.is_cuda:  # not cuDNN's attention: it builds a plan per new shape (see _CUDA_SDPA)
        with sdpa_kernel(_CUDA_SDPA):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(d))
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(d))
    o = o.view(batch, kv_heads, group, qmax, d).permute(0, 3, 1, 2, 4)
    return unpad_output(o.reshape(batch, qmax, heads, d), t)

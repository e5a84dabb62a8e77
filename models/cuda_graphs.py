"""CUDA graphs for the passes of a few tokens per request (decode, verify, draft), as vLLM
captures them: one graph per (padded batch size, tokens per request), replayed with the pass's
indices copied into static buffers. A decode pass of an 8B model launches ~1,000 small kernels;
replaying them as one graph removes the launch gaps, which at small batches are most of a pass.

A batch of B requests, the most new tokens of which is q, runs in the graph of (the next
bucket size, q) over a padded [batch, q] layout: a request with fewer new tokens gets padding
rows after them (written past its length, where the next pass overwrites them, and dropped
from the logits), and padding requests feed token 0 at position 0 of the null block
(paged_kv.py). The padding costs matmul rows, not bytes read: a mixed decode/verify batch
computes B*q rows. Prefills (many tokens per request), draft trees and passes that return
hidden states stay eager.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.paged_kv import KVPool, PagedOps, PagedSeq

#: Padded batch sizes, as vLLM's capture sizes (1, 2, 4, then steps of 8 and more).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
#: The most tokens per request a graph covers (verify of k = 7 drafts).
MAX_GRAPH_QUERY = 8


def bucket_floor(batch: int, q: int, multiple: int = 16) -> int:
    """The least padded batch for `batch` requests of `q` rows each: enough that the rows are
    a multiple of `multiple`, except a single row. On an H200, Llama-3.1-8B passes of 3 and 5
    rows took 13 ms against 7.4 for 1 row, 9.7 for 4 and 8.9 for 16 (cuBLAS picks slower
    kernels for small odd row counts; benchmarks/results/gpu-engine-h200-run1, latency.csv).
    Padding rows cost matmul rows, which a pass this small has to spare."""
    if batch * q == 1 or multiple <= 1:
        return batch
    return max(batch, multiple // math.gcd(q, multiple))


class StaticBatch(PagedOps):
    """PagedOps over static index buffers of a padded batch: what a graph captures. Every
    index lives in one int64 device buffer, so a pass copies its indices in with one copy."""

    def __init__(self, pool: KVPool, batch: int, q: int, width_blocks: int,
                 backend: str) -> None:
        self.pool, self.qmax, self.backend = pool, q, backend
        self.max_length = width_blocks * pool.block_size
        self.batch, self.width = batch, width_blocks
        device, tokens = pool.device, batch * q
        sizes = {"table": batch * width_blocks, "cached": batch, "positions": tokens,
                 "slots": tokens}
        self.buffer = torch.zeros(sum(sizes.values()), dtype=torch.int64, device=device)
        self.host = torch.zeros(self.buffer.shape, dtype=torch.int64,
                                pin_memory=device.type == "cuda")
        self.views: dict[str, np.ndarray] = {}
        self.tensors = {}
        offset = 0
        for name, size in sizes.items():
            self.tensors[name] = self.buffer[offset : offset + size]
            self.views[name] = self.host.numpy()[offset : offset + size]
            offset += size
        self.tensors["table"] = self.tensors["table"].view(batch, width_blocks)
        self.views["table"] = self.views["table"].reshape(batch, width_blocks)
        self.tensors["padded_rows"] = torch.arange(tokens, device=device)
        self.tokens = torch.zeros(tokens, dtype=torch.int64, device=device)
        self._rows = np.repeat(np.arange(batch), q)
        self._steps = np.arange(q)
        # the copy out of the pinned host buffer is asynchronous: the next fill waits for it
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def fill(self, tokens: Sequence[torch.Tensor], caches: Sequence[PagedSeq]) -> torch.Tensor:
        """Copy one pass's tokens and indices in (built in numpy, one copy); the rows of
        the real tokens in the padded layout, or None when every request brings q tokens."""
        bs, q, n = self.pool.block_size, self.qmax, len(caches)
        if self._copied is not None:
            self._copied.synchronize()
        table, cached = self.views["table"], self.views["cached"]
        table.fill(0)
        cached.fill(0)
        for r, cache in enumerate(caches):
            blocks = cache.block_array()[: self.width]
            table[r, : blocks.shape[0]] = blocks
            cached[r] = cache.length
        positions = self.views["positions"]
        positions[:] = (cached[:, None] + self._steps).reshape(-1)
        positions[n * q :] = 0  # padding requests: token 0 at position 0
        self.views["slots"][:] = table[self._rows, positions // bs] * bs + positions % bs
        self.buffer.copy_(self.host, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        sizes = [t.shape[0] for t in tokens]
        packed = torch.cat(list(tokens))
        if sizes == [q] * len(sizes):
            self.tokens[: packed.shape[0]].copy_(packed, non_blocking=True)
            self.tokens[packed.shape[0] :].zero_()
            return None
        real = torch.cat([torch.arange(r * q, r * q + m) for r, m in enumerate(sizes)])
        real = real.to(self.tokens.device, non_blocking=True)
        self.tokens.zero_()
        self.tokens.index_copy_(0, real, packed.to(self.tokens.device))
        return real


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None off CUDA: the body runs on the static buffers
    batch: StaticBatch
    logits: torch.Tensor | None


class GraphRunner:
    """Captures and replays a model's decode-shaped passes. `body(tokens, batch)` is the
    model's pass over packed token ids and a PagedOps, returning the logits of every row."""

    def __init__(self, body: Callable[[torch.Tensor, PagedOps], torch.Tensor], pool: KVPool,
                 backend: str, max_context: int,
                 inputs: Callable[[], tuple] = tuple, row_multiple: int = 16) -> None:
        self.body, self.pool, self.backend = body, pool, backend
        self.row_multiple = row_multiple
        self.max_context = max_context
        self.inputs = inputs  # identities of the other tensors the graphs read (rotary tables)
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.memory = torch.cuda.graph_pool_handle() if pool.device.type == "cuda" else None
        self.state = (pool.generation, inputs())

    def accepts(self, q: Sequence[int], caches: Sequence) -> bool:
        return (max(q) <= MAX_GRAPH_QUERY and len(q) <= BATCH_BUCKETS[-1]
                and all(isinstance(c, PagedSeq) and c.pool is self.pool for c in caches)
                and max(c.length for c in caches) + max(q) <= self.max_context)

    def width_blocks(self, longest: int) -> int:
        """Table width of a graph: the triton kernel splits each request's keys at run time,
        so one width serves every context; the torch backend gathers the whole width, so its
        graphs come per power-of-two width."""
        bs = self.pool.block_size
        if self.backend == "triton":
            return -(-self.max_context // bs)
        blocks = max(16, 1 << (-(-longest // bs) - 1).bit_length())
        return min(blocks, -(-self.max_context // bs))

    def run(self, tokens: Sequence[torch.Tensor], caches: Sequence[PagedSeq],
            last: bool = False) -> list[torch.Tensor]:
        """Per request the logits of its new tokens (`last`: of its last one only)."""
        state = (self.pool.generation, self.inputs())
        if state != self.state:  # a tensor the graphs read was reallocated: capture again
            self.graphs.clear()
            self.state = state
        sizes = [t.shape[0] for t in tokens]
        q = max(sizes)
        for cache in caches:
            cache.reserve(cache.length + q)
        batch = BATCH_BUCKETS[bisect.bisect_left(BATCH_BUCKETS, bucket_floor(len(caches), q,
                                                                     self.row_multiple))]
        width = self.width_blocks(max(c.length for c in caches) + q)
        key = (batch, q, width)
        if key not in self.graphs:
            self.graphs[key] = self._capture(batch, q, width)
        g = self.graphs[key]
        real = g.batch.fill(tokens, caches)
        if g.graph is None:
            logits = self.body(g.batch.tokens, g.batch)
        else:
            g.graph.replay()
            logits = g.logits
        for cache, n in zip(caches, sizes):
            cache.length += n
        if last:
            ends = torch.tensor([r * q + n - 1 for r, n in enumerate(sizes)])
            return list(logits.index_select(0, ends.to(logits.device)).split(1))
        if real is None:
            return list(logits[: len(caches) * q].clone().split(q))
        return list(logits.index_select(0, real).split(sizes))

    def _capture(self, batch: int, q: int, width: int) -> _Graph:
        static = StaticBatch(self.pool, batch, q, width, self.backend)
        if self.pool.device.type != "cuda":  # the same buffers and padding, run eagerly (tests)
            return _Graph(None, static, None)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up: allocator, kernels' first launch, autotune
            for _ in range(2):
                self.body(static.tokens, static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory):
            logits = self.body(static.tokens, static)
        return _Graph(graph, static, logits)

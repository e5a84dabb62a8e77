"""CUDA graphs for the passes of a few tokens per request (decode, verify, draft), as vLLM
captures them, replayed with the pass's indices copied into static buffers. A decode pass of
an 8B model launches ~1,000 small kernels; replaying them as one graph removes the launch
gaps, which at small batches are most of a pass.

Two layouts. A uniform batch (every request brings q tokens: decode, a fixed k's verify) runs
in the graph of (the next batch bucket, q), its B*q rows in place. A ragged batch (per-request
k) runs flattened, as vLLM pads a batch to a total token count: its T tokens packed, padded to
the next token bucket, so the matmuls cost T-bucket rows (not B * max q); attention alone
places them in a [batch, max q] layout (paged_kv.pad_queries). Padding requests feed token 0
at position 0 of the null block (paged_kv.py); padding tokens write there too and their rows
are dropped. Prefills (many tokens per request), draft trees and passes that return hidden
states stay eager.
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
#: Padded token counts of ragged batches: geometric (at most half the rows padding), so a
#: serving run meets few distinct graphs.
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
                 2048)


def bucket_floor(batch: int, q: int, multiple: int = 16) -> int:
    """The least padded batch for `batch` requests of `q` rows each: enough that the rows are
    a multiple of `multiple`, except a single row. On an H200, Llama-3.1-8B passes of 3 and 5
    rows took 13 ms against 7.4 for 1 row, 9.7 for 4 and 8.9 for 16 (cuBLAS picks slower
    kernels for small odd row counts; benchmarks/results/gpu-engine-h200-run1, latency.csv).
    Padding rows cost matmul rows, which a pass this small has to spare."""
    if batch * q == 1 or multiple <= 1:
        return batch
    return max(batch, multiple // math.gcd(q, multiple))


def token_bucket(tokens: int, multiple: int = 16) -> int:
    """The padded token count of a ragged batch: the next bucket that is a multiple of
    `multiple` (see bucket_floor), except a single token."""
    if tokens == 1:
        return 1
    return next(b for b in TOKEN_BUCKETS if b >= tokens and b % max(multiple, 1) == 0)


class StaticBatch(PagedOps):
    """PagedOps over static index buffers of a padded batch: what a graph captures. Every
    index lives in one int64 device buffer, so a pass copies its indices in with one copy."""

    def __init__(self, pool: KVPool, batch: int, q: int, width_blocks: int, backend: str,
                 tokens: int | None = None, feature_width: int | None = None) -> None:
        """`tokens` set: the flattened layout of a ragged batch, that many token rows;
        `feature_width` set: a [tokens, width] buffer of per-token features (an EAGLE head's
        input beside its tokens)."""
        self.pool, self.qmax, self.backend = pool, q, backend
        self.max_length = width_blocks * pool.block_size
        self.batch, self.width = batch, width_blocks
        self.ragged = tokens is not None
        device = pool.device
        tokens = batch * q if tokens is None else tokens
        sizes = {"table": batch * width_blocks, "cached": batch, "positions": tokens,
                 "slots": tokens}
        if self.ragged:
            sizes |= {"padded_rows": tokens, "read_rows": tokens}
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
        self.tokens = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.features = None if feature_width is None else torch.zeros(
            tokens, feature_width, dtype=pool.kv.dtype, device=device)
        self._rows = np.repeat(np.arange(batch), q)
        self._steps = np.arange(q)
        # the copy out of the pinned host buffer is asynchronous: the next fill waits for it
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def fill(self, tokens: Sequence[torch.Tensor], caches: Sequence[PagedSeq],
             features: Sequence[torch.Tensor] | None = None) -> None:
        """Copy one pass's tokens (and features) and indices in (built in numpy, one copy of
        the indices). Real tokens are the first rows in either layout."""
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
        positions, slots = self.views["positions"], self.views["slots"]
        if self.ragged:
            sizes = np.fromiter((t.shape[0] for t in tokens), dtype=np.int64, count=n)
            total = int(sizes.sum())
            request = np.repeat(np.arange(n), sizes)
            step = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            positions.fill(0)  # padding tokens: position 0 of the null block
            positions[:total] = cached[request] + step
            slots.fill(0)
            slots[:total] = (table[request, positions[:total] // bs] * bs
                             + positions[:total] % bs)
            padded, read = self.views["padded_rows"], self.views["read_rows"]
            padded.fill(self.batch * q)  # padding tokens: the scratch row (pad_queries)
            padded[:total] = request * q + step
            read.fill(0)
            read[:total] = padded[:total]
        else:
            positions[:] = (cached[:, None] + self._steps).reshape(-1)
            positions[n * q :] = 0  # padding requests: token 0 at position 0
            slots[:] = table[self._rows, positions // bs] * bs + positions % bs
        self.buffer.copy_(self.host, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        packed = torch.cat(list(tokens))
        self.tokens[: packed.shape[0]].copy_(packed, non_blocking=True)
        self.tokens[packed.shape[0] :].zero_()
        if self.features is not None:
            self.features[: packed.shape[0]].copy_(torch.cat(list(features)), non_blocking=True)
            self.features[packed.shape[0] :].zero_()


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None  # None off CUDA: the body runs on the static buffers
    batch: StaticBatch
    outputs: tuple[torch.Tensor, ...] | None


class GraphRunner:
    """Captures and replays a model's decode-shaped passes. `body(tokens, batch)` is the
    model's pass over packed token ids and a StaticBatch (its `features` too, given a
    `feature_width`), returning a tensor, or a tuple of them, with a row per token."""

    def __init__(self, body: Callable[[torch.Tensor, PagedOps], torch.Tensor], pool: KVPool,
                 backend: str, max_context: int,
                 inputs: Callable[[], tuple] = tuple, row_multiple: int = 16,
                 feature_width: int | None = None) -> None:
        self.body, self.pool, self.backend = body, pool, backend
        self.feature_width = feature_width
        self.row_multiple = row_multiple
        self.max_context = max_context
        self.inputs = inputs  # identities of the other tensors the graphs read (rotary tables)
        #: (batch, q, width, None) for uniform batches, (..., token bucket) for ragged ones
        self.graphs: dict[tuple[int, int, int, int | None], _Graph] = {}
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
            last: bool = False, features: Sequence[torch.Tensor] | None = None
            ) -> list[torch.Tensor] | tuple[list[torch.Tensor], ...]:
        """Per request the body's rows of its new tokens (`last`: of its last one only); one
        such list per output when the body returns several."""
        state = (self.pool.generation, self.inputs())
        if state != self.state:  # a tensor the graphs read was reallocated: capture again
            self.graphs.clear()
            self.state = state
        sizes = [t.shape[0] for t in tokens]
        q = max(sizes)
        for cache in caches:
            cache.reserve(cache.length + q)
        width = self.width_blocks(max(c.length for c in caches) + q)
        if len(set(sizes)) == 1:  # uniform: B * q rows in place
            floor = bucket_floor(len(caches), q, self.row_multiple)
            key = (BATCH_BUCKETS[bisect.bisect_left(BATCH_BUCKETS, floor)], q, width, None)
        else:  # ragged: the tokens flattened, padded to a token bucket
            key = (BATCH_BUCKETS[bisect.bisect_left(BATCH_BUCKETS, len(caches))], q, width,
                   token_bucket(sum(sizes), self.row_multiple))
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        g = self.graphs[key]
        g.batch.fill(tokens, caches, features)
        if g.graph is None:
            outputs = self.body(g.batch.tokens, g.batch)
        else:
            g.graph.replay()
            outputs = g.outputs if len(g.outputs) > 1 else g.outputs[0]
        for cache, n in zip(caches, sizes):
            cache.length += n
        if key[3] is None:  # request r's rows start at r * q
            starts = [r * q for r in range(len(sizes))]
        else:  # packed
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).tolist()
        several = isinstance(outputs, tuple)
        rows = []
        for out in outputs if several else (outputs,):
            if last:
                ends = torch.tensor([start + n - 1 for start, n in zip(starts, sizes)])
                rows.append(list(out.index_select(0, ends.to(out.device)).split(1)))
            else:
                rows.append(list(out[: starts[-1] + sizes[-1]].clone().split(sizes)))
        return tuple(rows) if several else rows[0]

    def _capture(self, batch: int, q: int, width: int, tokens: int | None) -> _Graph:
        static = StaticBatch(self.pool, batch, q, width, self.backend, tokens,
                             self.feature_width)
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
            outputs = self.body(static.tokens, static)
        return _Graph(graph, static, outputs if isinstance(outputs, tuple) else (outputs,))

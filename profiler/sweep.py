"""Run a profile sweep: time every grid point and the ragged batches, in interleaved rounds.

On a shared machine the clock drifts for seconds at a time, so each round times every point once
and a point's time is the median over rounds; the samples are saved after every round, so an
interrupted sweep resumes. A draft pass is timed right after an untimed target pass, where the
engine runs it: timed back to back, a small drafter runs from cache and looks faster than it is.
The draft is also timed at every longer query of the grid (`catchup`, a chain's first pass:
simulator/draft_feed.py). The drift and the cache effect in numbers, and the meta's
`draft_catch_up`: docs/profiling.md "The sweep".
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from models.kv_cache import KVCache
from models.llama import LlamaModel
from profiler.grid import Grid, Point, points
from simulator.latency import attention_pairs
from simulator.latency_table import COLUMNS, LatencyTable, table_paths
from traces import atomic_write

#: meta keys that must match for a rerun to resume an existing sweep
RESUME_KEYS = ("device", "dtype", "target", "draft", "grid", "repeats", "warmup", "torch_version",
               "draft_timing", "draft_catch_up")
#: how draft passes are timed (see the module doc); the meta says so, so that a sweep timed the
#: old way (back to back: draft passes from cache) is never resumed into this one
DRAFT_TIMING = "each draft pass right after an untimed target pass, as in the engine"


@dataclass
class Models:
    """The models a sweep times: the target, and the draft unless drafting is model-free."""

    target: LlamaModel
    draft: LlamaModel | None

    def get(self, role: str) -> LlamaModel:
        model = self.target if role == "target" else self.draft
        if model is None:
            raise ValueError(f"no {role} model to time")
        return model


class CachePool:
    """Per model, `size` KV caches filled with random K/V up to the longest context.

    A pass for contexts c_r just sets each cache's length to c_r: the rows past it hold random
    values, which is all a timing needs (values never change a pass's time, but uninitialised
    memory can hold denormals, which do on a CPU). One pool serves every point and batch.
    """

    def __init__(self, model: LlamaModel, size: int, longest: int, room: int,
                 generator: torch.Generator) -> None:
        self.caches: list[KVCache] = []
        model.reserve_pool(size, longest + room)  # paged (CUDA): just what the sweep caches
        for _ in range(size):
            cache = model.new_cache(longest + room)
            cache.fill_random_(longest + room, generator)
            self.caches.append(cache)

    def set_lengths(self, cached: list[int]) -> list[KVCache]:
        chosen = self.caches[: len(cached)]
        for cache, c in zip(chosen, cached):
            cache.length = c
        return chosen


@dataclass(frozen=True)
class Pass:
    """One forward pass to time: a role and per-request (query, cached) lengths."""

    role: str
    queries: tuple[int, ...]
    cached: tuple[int, ...]
    last_logits: bool = False


def _timed(model: LlamaModel, pool: CachePool, p: Pass, device: torch.device,
           generator: torch.Generator) -> float:
    """Seconds of one call of `p` (the caches are reset before it)."""
    vocab = model.config.shape.vocab
    tokens = [torch.randint(vocab, (q,), generator=generator, device=device) for q in p.queries]
    caches = pool.set_lengths(list(p.cached))
    mode = "last" if p.last_logits else "all"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(tokens, caches, logits=mode)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    model(tokens, caches, logits=mode)
    elapsed = time.perf_counter() - t0
    if not elapsed > 0:
        raise RuntimeError(f"a {p.role} pass took no measurable time: {p}")
    return elapsed


def grid_passes(grid: Grid, with_draft: bool) -> list[tuple[Point, Pass]]:
    return [(pt, Pass(pt.role, (pt.query,) * pt.num_seqs, (pt.cached,) * pt.num_seqs,
                      pt.phase == "prefill")) for pt in points(grid, with_draft)]


def random_ragged(grid: Grid, n: int, rng: np.random.Generator) -> list[Pass]:
    """`n` ragged target batches inside the grid's box: each request its own q and context."""
    q_hi, c_lo, c_hi = max(grid.query_tokens), min(grid.context_tokens), max(grid.context_tokens)
    b_lo, b_hi = max(min(grid.batch_sizes), 2), max(max(grid.batch_sizes), 2)
    out = []
    for _ in range(n):
        b = int(rng.integers(b_lo, b_hi + 1))
        out.append(Pass("target", tuple(rng.integers(1, q_hi + 1, b).tolist()),
                        tuple(rng.integers(c_lo, c_hi + 1, b).tolist())))
    return out


class Sweep:
    """A sweep taken one round at a time (`round`), so that other work can run between rounds:
    `spectune validate` interleaves its live runs with rounds, and sees the drift they share."""

    def __init__(self, models: Models, grid: Grid, device: torch.device, meta: dict, out: Path,
                 warmup: int, ragged: int = 0, seed: int = 0) -> None:
        if models.draft is not None:  # catch_up: what the draft feeds first (draft_feed.py)
            meta = {**meta, "draft_timing": DRAFT_TIMING,
                    "draft_catch_up": getattr(models.draft, "catch_up", "bonus")}
        self.models, self.device, self.meta, self.out, self.warmup = (
            models, device, meta, out, warmup)  # fmt: skip
        self.grid_items = grid_passes(grid, models.draft is not None)
        self.ragged_passes = random_ragged(grid, ragged, np.random.default_rng(seed))
        self.jobs = [p for _, p in self.grid_items] + self.ragged_passes
        self.samples = _resume(out, meta, len(self.jobs))
        self.generator = torch.Generator(device=device).manual_seed(seed)
        longest = max(grid.context_tokens)
        room = max(max(grid.query_tokens), max(grid.prompt_tokens)) + 1
        size = max(max(grid.batch_sizes), max(grid.prefill_batch_sizes))
        self.pools = {role: CachePool(models.get(role), size, longest, room, self.generator)
                      for role in ("target", "draft")
                      if role == "target" or models.draft is not None}
        # what runs before a timed draft pass: the cheapest target pass (one token, 1 request)
        self.before_draft = Pass("target", (1,), (min(grid.context_tokens),))

    @property
    def rounds_done(self) -> int:
        return min(len(s) for s in self.samples)

    def round(self) -> None:
        """Time every job not yet timed in the next round once; save samples and table."""
        r = self.rounds_done
        for i, job in enumerate(self.jobs):
            if len(self.samples[i]) > r:
                continue
            model, pool = self.models.get(job.role), self.pools[job.role]
            for _ in range(self.warmup):
                _timed(model, pool, job, self.device, self.generator)
            if job.role == "draft":
                _timed(self.models.target, self.pools["target"], self.before_draft, self.device,
                       self.generator)
            self.samples[i].append(_timed(model, pool, job, self.device, self.generator))
        _save(self.out, self.meta, self.samples)
        self.results()[0].save(self.out / "latency")

    def results(self, rounds: slice | None = None) -> tuple[LatencyTable, pd.DataFrame]:
        """The table (median per point over `rounds`, default all) and the ragged batches."""
        samples = self.samples if rounds is None else [s[rounds] for s in self.samples]
        return _results(self.grid_items, self.ragged_passes, samples, self.meta)


def run_sweep(models: Models, grid: Grid, device: torch.device, meta: dict, out: Path,
              warmup: int, repeats: int, ragged: int = 0, seed: int = 0,
              progress: Callable[[int, int], None] | None = None
              ) -> tuple[LatencyTable, pd.DataFrame]:
    """Time the grid and `ragged` random ragged batches in `repeats` interleaved rounds."""
    sweep = Sweep(models, grid, device, meta, out, warmup, ragged, seed)
    while sweep.rounds_done < repeats:
        sweep.round()
        if progress is not None:
            progress(sweep.rounds_done, repeats)
    table, ragged_rows = sweep.results()
    table.save(out / "latency")
    return table, ragged_rows


def _results(grid_items, ragged_passes, samples, meta) -> tuple[LatencyTable, pd.DataFrame]:
    rows = []
    for (pt, _), s in zip(grid_items, samples):
        rows.append({"role": pt.role, "phase": pt.phase, "num_seqs": pt.num_seqs,
                     "query_tokens_per_seq": pt.query, "cached_tokens_per_seq": pt.cached,
                     **_stats(s)})
    table = LatencyTable(pd.DataFrame(rows, columns=list(COLUMNS)), meta)
    ragged = []
    for p, s in zip(ragged_passes, samples[len(grid_items):]):
        q, c = np.asarray(p.queries), np.asarray(p.cached)
        ragged.append({"role": p.role, "num_seqs": len(q), "query_tokens": int(q.sum()),
                       "cached_tokens": int(c.sum()),
                       "attn_pairs": int(attention_pairs(q, c).sum()),
                       "queries": " ".join(map(str, p.queries)),
                       "cached": " ".join(map(str, p.cached)), **_stats(s)})
    return table, pd.DataFrame(ragged)


def _stats(s: list[float]) -> dict:
    ordered = sorted(s)

    def quantile(x: float) -> float:
        pos = x * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {"median_s": statistics.median(s), "p10_s": quantile(0.1), "p90_s": quantile(0.9),
            "repeats": len(s)}


def _resume(out: Path, meta: dict, n: int) -> list[list[float]]:
    """Samples already taken with the same settings; an error if the settings differ."""
    path = out / "samples.json"
    if not path.exists():
        return [[] for _ in range(n)]
    saved = json.loads(path.read_text())
    changed = [k for k in RESUME_KEYS if saved["meta"].get(k) != meta.get(k)]
    if changed or len(saved["samples"]) != n:
        csv_path, _ = table_paths(out / "latency")
        raise ValueError(f"{csv_path.parent} was profiled with other settings "
                         f"({', '.join(changed) or 'the ragged batches'}); use another --out "
                         "folder, or delete it to start over")
    return [list(s) for s in saved["samples"]]


def _save(out: Path, meta: dict, samples: list[list[float]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "samples.json") as handle:
        handle.write(json.dumps({"meta": meta, "samples": samples}).encode("utf-8"))

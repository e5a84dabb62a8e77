"""Run a profile sweep: time every grid point, keep each row as soon as it is measured.

The table is rewritten (atomically) after every point, so an interrupted sweep loses at most the
point in flight; a rerun into the same folder with the same settings skips what is already there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from profiler.grid import Grid, Point, points
from profiler.kv_cache import KVCache
from profiler.model import LlamaModel
from profiler.timing import Timing, time_call
from simulator.latency_table import COLUMNS, LatencyTable, table_paths

#: meta keys that must match for a rerun to resume an existing table
RESUME_KEYS = ("device", "dtype", "target", "draft", "repeats", "warmup", "torch_version")


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


def filled_caches(model: LlamaModel, batch: int, cached: int, room: int,
                  generator: torch.Generator) -> list[KVCache]:
    """Caches already holding `cached` tokens of random K/V (values never change the time, but
    uninitialised memory can hold denormals, which do on a CPU)."""
    caches = []
    for _ in range(batch):
        cache = model.new_cache(cached + room)
        cache.fill_random_(cached, generator)
        caches.append(cache)
    return caches


def time_pass(model: LlamaModel, num_seqs: int, queries: list[int], cached: list[int],
              device: torch.device, warmup: int, repeats: int, seed: int,
              last_logits: bool = False) -> Timing:
    """Time one forward pass of a (possibly ragged) batch, restoring the caches between calls."""
    generator = torch.Generator(device=device).manual_seed(seed)
    caches = [filled_caches(model, 1, c, q + 1, generator)[0] for q, c in zip(queries, cached)]
    vocab = model.config.shape.vocab
    tokens = [torch.randint(vocab, (q,), generator=generator, device=device) for q in queries]

    def rollback() -> None:
        for cache, c in zip(caches, cached):
            cache.truncate(c)

    mode = "last" if last_logits else "all"
    return time_call(lambda: model(tokens, caches, logits=mode), device, warmup, repeats,
                     setup=rollback)


def measure(models: Models, point: Point, device: torch.device, warmup: int, repeats: int,
            seed: int) -> Timing:
    model = models.get(point.role)
    return time_pass(model, point.num_seqs, [point.query] * point.num_seqs,
                     [point.cached] * point.num_seqs, device, warmup, repeats, seed,
                     last_logits=point.phase == "prefill")


def run_sweep(models: Models, grid: Grid, device: torch.device, meta: dict, out_prefix: Path,
              warmup: int, repeats: int, seed: int = 0,
              progress: Callable[[int, int, Point, Timing], None] | None = None) -> LatencyTable:
    """Time every grid point not yet in `out_prefix`'s table; save after each one."""
    todo = points(grid, models.draft is not None)
    rows = _resume(out_prefix, meta)
    done = {tuple(r) for r in rows[["role", "phase", "num_seqs", "query_tokens_per_seq",
                                    "cached_tokens_per_seq"]].itertuples(index=False)}
    records = rows.to_dict("records")
    for i, point in enumerate(todo):
        if point.key in done:
            continue
        timing = measure(models, point, device, warmup, repeats, seed + i)
        records.append({"role": point.role, "phase": point.phase, "num_seqs": point.num_seqs,
                        "query_tokens_per_seq": point.query,
                        "cached_tokens_per_seq": point.cached, "median_s": timing.median_s,
                        "p10_s": timing.p10_s, "p90_s": timing.p90_s,
                        "repeats": timing.repeats})
        LatencyTable(pd.DataFrame(records, columns=list(COLUMNS)), meta).save(out_prefix)
        if progress is not None:
            progress(i + 1, len(todo), point, timing)
    return LatencyTable.load(out_prefix)


def _resume(out_prefix: Path, meta: dict) -> pd.DataFrame:
    """Rows already measured with the same settings; an error if the settings differ."""
    csv_path, meta_path = table_paths(out_prefix)
    if not (csv_path.exists() and meta_path.exists()):
        return pd.DataFrame(columns=list(COLUMNS))
    old = LatencyTable.load(out_prefix)
    changed = [k for k in RESUME_KEYS if old.meta.get(k) != meta.get(k)]
    if changed:
        raise ValueError(f"{csv_path} was measured with other settings ({', '.join(changed)}); "
                         "use another --out folder, or delete it to start over")
    return old.rows


def random_ragged(grid: Grid, n: int,
                  rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
    """`n` ragged batches inside the grid's box: per request its own query and cached lengths."""
    batches = []
    q_hi, c_lo, c_hi = max(grid.query_tokens), min(grid.context_tokens), max(grid.context_tokens)
    b_lo, b_hi = min(grid.batch_sizes), max(grid.batch_sizes)
    for _ in range(n):
        b = int(rng.integers(max(b_lo, 2), max(b_hi, 2) + 1))
        queries = rng.integers(1, q_hi + 1, b).tolist()
        cached = rng.integers(c_lo, c_hi + 1, b).tolist()
        batches.append((queries, cached))
    return batches

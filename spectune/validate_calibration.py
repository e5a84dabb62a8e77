"""What `validate` measures besides the live runs: the device's pass times, in rounds spread
between the runs, and the engine's host time per iteration.

Rounds between runs: a shared CPU's speed drifts over minutes, so the grid (`validation_grid`) is
timed once before every live run and once after the last; the profile is the median of all
rounds, and each run's prediction is scaled by the speed in the two rounds around it
(`DriftProbe.scale`). A host model: the profile times passes only, so host time = duration -
passes (`LiveResult.pass_s`) is fitted per policy on a calibration run of its own, as
a + b * requests + c * drafted tokens; the compared runs never feed the fit. The drift measured,
when the scale means something, and the calibration workload: docs/validate.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # profiler needs torch; the CLI builds its flags without it (or pandas, scipy)
    from profiler.grid import Grid
    from simulator.draft_tree import TreeShape
    from simulator.latency_table import LatencyTable
    from simulator.profiled import ProfiledLatency

QUERY_AXIS = (1, 2, 3, 5, 9)


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from the one at or below `lo` to the one at or above `hi`."""
    first = 1 << max(0, math.floor(math.log2(max(lo, 1))))
    out = [first]
    while out[-1] < hi:
        out.append(out[-1] * 2)
    return tuple(out)


def validation_grid(max_num_seqs: int, k_max: int, prompt_tokens: np.ndarray,
                    output_tokens: np.ndarray, drafting: bool = True,
                    draft_tree: TreeShape | None = None) -> Grid:
    """The passes a workload can run, and no more: batches up to max_num_seqs, queries up to
    k_max + 1 (1 only without drafting; a draft tree's nodes to depth k_max + 1), contexts from
    the shortest prompt to the longest prompt + output + k_max, prefills of the workload's
    prompt lengths."""
    from profiler.grid import Grid

    batches = tuple(b for b in _powers_of_two(1, max_num_seqs) if b < max_num_seqs)
    batches = (*batches, max_num_seqs)
    widest = k_max + 1 if draft_tree is None else draft_tree.draft_tokens(k_max) + 1
    queries = tuple(q for q in QUERY_AXIS if q <= widest) if drafting else (1,)
    if drafting and widest not in queries:
        queries = (*queries, widest)
    lo, hi = int(prompt_tokens.min()), int((prompt_tokens + output_tokens).max()) + k_max
    prompts = _powers_of_two(int(prompt_tokens.min()), int(prompt_tokens.max()))
    prefill_batches = tuple(b for b in batches if b <= 8)
    return Grid(batch_sizes=batches, query_tokens=queries,
                context_tokens=_powers_of_two(lo, hi), prompt_tokens=prompts,
                prefill_batch_sizes=prefill_batches)


class DriftProbe:
    """A profile timed in rounds between live runs (see the module doc).

    `fixed` is a profile given by the user: then the rounds only measure the drift against it.
    Without one the profile is the rounds' own median (`table()`).
    """

    def __init__(self, target, draft, grid: Grid, out: Path, fixed: LatencyTable | None = None,
                 notes: str = "spectune validate: timed in rounds between the live runs") -> None:
        from models.runtime import threads, torch_version
        from profiler import device as devices
        from profiler.sweep import Models, Sweep
        from simulator.latency_table import new_meta

        device = target.config.device
        name, driver = devices.describe(device)
        draft_shape = draft.config.shape if draft is not None else None
        dtype = str(target.config.dtype).removeprefix("torch.")
        meta = new_meta(name, driver, torch_version(), dtype, target.config.shape,
                        draft_shape, grid.as_dict(), 1, 0, notes=notes)
        meta["threads"] = threads()
        # CUDA: one untimed call per point first, so that no CUDA graph capture (the first
        # pass of each batch shape) is timed as a pass
        self.sweep = Sweep(Models(target, draft), grid, device, meta, out,
                           warmup=1 if device.type == "cuda" else 0)
        self.fixed = fixed
        self.round_times: list[float] = []
        self._cached: tuple[int, ProfiledLatency] | None = None  # (rounds, the profile's model)

    @property
    def rounds(self) -> int:
        return self.sweep.rounds_done

    def round(self) -> None:
        import time

        t0 = time.perf_counter()
        self.sweep.round()
        self.round_times.append(time.perf_counter() - t0)

    def table(self) -> LatencyTable:
        """The profile: the given one, or the median over every round so far."""
        from simulator.latency_table import LatencyTable

        if self.fixed is not None:
            return self.fixed
        table, _ = self.sweep.results()
        return LatencyTable(table.rows, {**table.meta, "repeats": self.rounds})

    def _reference(self) -> ProfiledLatency:
        """The profile's latency model, rebuilt only when a round was added since."""
        from simulator.profiled import ProfiledLatency

        if self._cached is None or self._cached[0] != self.rounds:
            self._cached = (self.rounds, ProfiledLatency(self.table()))
        return self._cached[1]

    def scale(self, before: int, after: int | None = None) -> float:
        """Device speed over rounds before..after (inclusive) relative to the profile: the
        median over grid points of (their mean time there) / (the profile's prediction)."""
        from simulator.fit import uniform_aggregates

        stop = (after if after is not None else before) + 1
        local, _ = self.sweep.results(slice(before, stop))
        rows = local.rows
        reference = self._reference()
        b, q, c, pairs = uniform_aggregates(rows["num_seqs"], rows["query_tokens_per_seq"],
                                            rows["cached_tokens_per_seq"])
        ratios = []
        for role in rows["role"].unique():
            m = (rows["role"] == role).to_numpy()
            predicted = reference.forward_s(role, b[m], q[m], c[m], pairs[m])
            means = np.asarray([np.mean(s[before:stop]) for s, keep in
                                zip(self.sweep.samples, m) if keep])
            ratios.append(means / np.asarray(predicted))
        return float(np.median(np.concatenate(ratios)))


@dataclass(frozen=True)
class HostFit:
    """Host seconds per iteration = step + per_seq * requests + per_draft * drafted tokens."""

    step_overhead_s: float
    per_seq_overhead_s: float
    per_draft_token_s: float
    iterations: int
    residual_ms: float  # median |measured - fitted| host time, ms

    def latency(self, table: LatencyTable, drafter, pass_scale: float = 1.0):
        return latency_for(table, drafter, self, pass_scale)


NO_HOST = HostFit(0.0, 0.0, 0.0, 0, float("nan"))


def fit_host(live) -> HostFit:
    """Non-negative least squares of each iteration's host time (duration - passes) on
    [1, requests in it, tokens drafted in it]."""
    from scipy.optimize import nnls

    steps = live.steps
    host = steps["duration_s"].to_numpy() - np.asarray(live.pass_s)
    ok = np.isfinite(host)
    if ok.sum() < 3:
        raise ValueError("host time needs the passes timed (CPU) and at least 3 iterations")
    seqs = (steps["decode_seqs"] + steps["prefill_seqs"]).to_numpy(dtype=np.float64)
    x = np.c_[np.ones(len(steps)), seqs, steps["drafted"].to_numpy(dtype=np.float64)][ok]
    coef, _ = nnls(x, host[ok])
    residual = float(np.median(np.abs(x @ coef - host[ok]))) * 1e3
    return HostFit(float(coef[0]), float(coef[1]), float(coef[2]), int(ok.sum()), residual)


def latency_for(table: LatencyTable, drafter, host: HostFit = NO_HOST,
                pass_scale: float = 1.0) -> ProfiledLatency:
    """ProfiledLatency of `table` (without its draft rows for a model-free drafter), with the
    host model and the drift scale."""
    from simulator.latency_table import LatencyTable
    from simulator.profiled import ProfiledLatency

    if drafter.model_free and table.meta.get("draft") is not None:
        rows = table.rows[table.rows["role"] == "target"].reset_index(drop=True)
        table = LatencyTable(rows, {**table.meta, "draft": None})
    latency = ProfiledLatency(table, host.step_overhead_s,
                              per_seq_overhead_s=host.per_seq_overhead_s,
                              per_draft_token_s=host.per_draft_token_s, pass_scale=pass_scale)
    latency.draft_tree = drafter.tree  # how its steps compose the passes
    return latency

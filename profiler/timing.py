"""Timing forward passes right: warm-up, repeats, median and spread, on the device's own clock.

CPU: `time.perf_counter` around the call. CUDA: CUDA events around the call, after a
synchronise, so kernel queues are not mistaken for speed; small passes can be captured once in a
CUDA graph and replayed, which is how serving engines run decode steps. A measurement that comes
out as zero (or negative) is an error, never a data point.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call over `repeats` timed calls."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int

    def __post_init__(self) -> None:
        if not (0 < self.p10_s <= self.median_s <= self.p90_s):
            raise RuntimeError(f"implausible timing {self}: a pass took no measurable time")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def time_call(fn: Callable[[], object], device: torch.device, warmup: int = 2,
              repeats: int = 5, setup: Callable[[], None] | None = None) -> Timing:
    """Time `fn()`; `setup()` runs untimed before every call (e.g. rolling a KV cache back)."""
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup}, {repeats}")
    cuda = device.type == "cuda"
    samples: list[float] = []
    for i in range(warmup + repeats):
        if setup is not None:
            setup()
        if cuda:
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - t0
        if i >= warmup:
            samples.append(elapsed)
    return Timing(statistics.median(samples), _quantile(samples, 0.1), _quantile(samples, 0.9),
                  len(samples))

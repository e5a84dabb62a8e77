"""A draft length by batch size schedule, and the error every export check raises.

The schedule is what `spectune tune` finds (the best fixed k per rate, placed at the mean batch
size it ran at); export.py writes it in each engine's format.
"""

from __future__ import annotations

import numbers
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from math import isfinite
from typing import Any


class ExportError(ValueError):
    """A schedule or engine config that an engine would reject or misread. The message says
    what is wrong, where, and what to do."""


def is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class BatchSchedule:
    """Draft length by batch size: steps[i] = (largest batch size covered, k); sorted by batch
    size; batch sizes above the last step use the last k."""

    steps: tuple[tuple[int, int], ...]
    k_max: int  # the engine's maximum draft length (num_speculative_tokens)
    source: str = ""  # where it came from, e.g. "spectune tune: best fixed k per rate ..."

    def __post_init__(self) -> None:
        if not (is_int(self.k_max) and self.k_max >= 0 and len(self.steps) > 0 and all(
                isinstance(s, Sequence) and len(s) == 2 and all(map(is_int, s))
                for s in self.steps)):
            raise ExportError(f"BatchSchedule(steps={self.steps!r}, k_max={self.k_max!r}): need "
                              "(batch size, k) integer pairs, at least one, and k_max >= 0")
        steps = tuple((int(bs), int(k)) for bs, k in self.steps)
        for i, (bs, k) in enumerate(steps):
            if bs < 1 or (i and bs <= steps[i - 1][0]):
                raise ExportError(f"steps[{i}] batch size {bs}: batch sizes must be >= 1 and "
                                  "strictly increasing")
            if not 0 <= k <= self.k_max:
                raise ExportError(f"steps[{i}] k = {k}: must be in 0..k_max={self.k_max}")
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "k_max", int(self.k_max))

    def ranges(self) -> list[list[int]]:
        """Inclusive [lo, hi, k] ranges, contiguous from batch size 1 (vLLM's
        num_speculative_tokens_per_batch_size, batch_adaptive's schedule)."""
        los = [1] + [bs + 1 for bs, _ in self.steps[:-1]]
        return [[lo, bs, k] for lo, (bs, k) in zip(los, self.steps)]


def ranges_text(ranges: Sequence[Sequence[int]]) -> str:
    """Inclusive [lo, hi, k] ranges as words: "1-9: k=16, 10-29: k=10, 30: k=5"."""
    return ", ".join(f"{lo}-{hi}: k={k}" if lo != hi else f"{lo}: k={k}" for lo, hi, k in ranges)


def schedule_from_points(points: Sequence[tuple[float, int]], k_max: int, max_batch: int,
                         source: str = "") -> BatchSchedule:
    """From measured (mean batch size, best k) pairs (one per request rate, any order, batch sizes
    may be fractional and may repeat): piecewise-constant k over integer batch sizes 1..max_batch,
    each batch size taking the k of the nearest point (ties -> the larger batch point), adjacent
    equal k merged; the last step covers max_batch. Points at the same batch size that disagree
    give the smaller k, because speculating less is the safe choice."""
    if not (is_int(max_batch) and max_batch >= 1 and is_int(k_max) and k_max >= 0):
        raise ExportError(f"need integers max_batch >= 1 and k_max >= 0, got {max_batch!r}, "
                          f"{k_max!r}")
    best: dict[Fraction, int] = {}
    for i, (x, k) in enumerate(points):
        if (not isinstance(x, numbers.Real) or isinstance(x, bool) or not isfinite(x)
                or x <= 0):
            raise ExportError(f"points[{i}]: mean batch size {x!r} must be a finite number > 0")
        if not is_int(k) or not 0 <= k <= k_max:
            raise ExportError(f"points[{i}]: k = {k!r} must be an integer in 0..k_max={k_max}")
        key = Fraction(float(x))  # exact, so ties are exact
        best[key] = min(best.get(key, int(k)), int(k))
    if not best:
        raise ExportError("no points: give at least one (mean batch size, k) pair")
    xs = sorted(best)
    mids = [(a + b) / 2 for a, b in pairwise(xs)]
    steps: list[tuple[int, int]] = []
    for b in range(1, max_batch + 1):
        k = best[xs[bisect_right(mids, b)]]  # on a midpoint: the larger batch point
        if steps and steps[-1][1] == k:
            steps[-1] = (b, k)
        else:
            steps.append((b, k))
    return BatchSchedule(tuple(steps), k_max, source)

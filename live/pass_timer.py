"""Wall time spent inside model forward passes, so an iteration's host time can be told apart.

The profile times forward passes only; an engine iteration also spends host time around them
(the policy, drafting by lookup, acceptance, signals, bookkeeping). `PassTimer` hangs forward
hooks on the models and adds up the time between each pass's pre-hook and post-hook; the live
engine takes the sum at the end of every iteration, so `duration - passes` is that iteration's
host time. On CUDA the hooks only see kernel launches, so there each pass is bracketed by CUDA
events instead, and `take` (called after the iteration's synchronise) adds up the GPU time
between them: what is left of the iteration is host time the GPU was not busy with passes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch


class PassTimer:
    """Seconds inside forward passes of `models` since the last `take` (wall time on CPU, GPU
    time between CUDA events on CUDA)."""

    def __init__(self, models: Iterable[torch.nn.Module], cuda: bool = False) -> None:
        self._handles = []
        self._total = 0.0
        self._started: float | None = None
        self._depth = 0
        self._cuda = cuda
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        for model in {id(m): m for m in models}.values():
            self._handles.append(model.register_forward_pre_hook(self._enter))
            self._handles.append(model.register_forward_hook(self._exit))

    def _enter(self, *_) -> None:
        if self._depth == 0:
            if self._cuda:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                self._events.append((start, torch.cuda.Event(enable_timing=True)))
            else:
                self._started = time.perf_counter()
        self._depth += 1

    def _exit(self, *_) -> None:
        self._depth -= 1
        if self._depth != 0:
            return
        if self._cuda:
            self._events[-1][1].record()
        elif self._started is not None:
            self._total += time.perf_counter() - self._started
            self._started = None

    def take(self) -> float:
        """The pass time accumulated since the last call; resets it. On CUDA, call it after
        the device has been synchronised (it waits for the last pass's end otherwise)."""
        if self._cuda:
            for start, end in self._events:
                end.synchronize()
                self._total += start.elapsed_time(end) / 1e3
            self._events.clear()
        total, self._total = self._total, 0.0
        return total

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

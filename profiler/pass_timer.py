"""Wall time spent inside model forward passes, so an iteration's host time can be told apart.

The profile times forward passes only; an engine iteration also spends host time around them
(the policy, drafting by lookup, acceptance, signals, bookkeeping). `PassTimer` hangs forward
hooks on the models and adds up the time between each pass's pre-hook and post-hook; the live
engine takes the sum at the end of every iteration, so `duration - passes` is that iteration's
host time. On CUDA the hooks would only see kernel launches, so the timer is off there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch


class PassTimer:
    """Seconds inside forward passes of `models` since the last `take` (CPU only)."""

    def __init__(self, models: Iterable[torch.nn.Module]) -> None:
        self._handles = []
        self._total = 0.0
        self._started: float | None = None
        self._depth = 0
        for model in {id(m): m for m in models}.values():
            self._handles.append(model.register_forward_pre_hook(self._enter))
            self._handles.append(model.register_forward_hook(self._exit))

    def _enter(self, *_) -> None:
        if self._depth == 0:
            self._started = time.perf_counter()
        self._depth += 1

    def _exit(self, *_) -> None:
        self._depth -= 1
        if self._depth == 0 and self._started is not None:
            self._total += time.perf_counter() - self._started
            self._started = None

    def take(self) -> float:
        """The pass time accumulated since the last call; resets it."""
        total, self._total = self._total, 0.0
        return total

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

"""The live engine's per-request state and its clocks (measured, or the simulator's).

`LiveRequest` is what policies see as a `policies.RequestView` (the same fields as the
simulator's `RequestState`), plus the tokens and the target KV cache the engine needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from models.kv_cache import KVCache


class LiveRequest:
    """A request inside the live engine; policies read it as a `RequestView`."""

    __slots__ = (
        "accepted",
        "arrival_s",
        "cache",
        "draft_feed",
        "drafted",
        "generated",
        "index",
        "log",
        "output_tokens",
        "prefilled",
        "prompt_hidden",
        "prompt_tokens",
        "request_id",
        "reserve",
        "steps",
        "tokens",
    )

    def __init__(
        self, index: int, request_id: int, arrival_s: float, prompt: list[int], output_tokens: int
    ) -> None:
        self.index = index
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = len(prompt)
        self.output_tokens = output_tokens
        self.tokens = list(prompt)  # prompt + generated: the history drafters read
        self.generated = 0
        self.steps = 0
        self.drafted = 0
        self.draft_feed = 0  # tokens the next chain's first draft pass feeds (draft_feed.py)
        self.accepted = 0
        self.reserve = 0
        self.cache: KVCache | None = None
        self.prefilled = 0  # prompt tokens in the cache (chunked prefill)
        self.prompt_hidden: list = []  # their features so far, for an EAGLE drafter
        #: one (position, k chosen, drafted, accepted, emitted) per decode step: replay checks
        self.log: list[tuple[int, int, int, int, int]] = []

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def output(self) -> list[int]:
        """The generated token ids so far."""
        return self.tokens[self.prompt_tokens :]


class EngineClock:
    """Seconds since the run started, as the engine sees them.

    Real time (`realtime=True`): perf_counter since the start; waiting for an arrival sleeps.
    Replay (`realtime=False`): the same measured time, but waiting for an arrival jumps the clock
    forward instead of sleeping. Iterations still take their measured time, so arrivals during
    busy periods queue exactly as they would live; only idle gaps are skipped.
    """

    def __init__(self, realtime: bool) -> None:
        self.realtime = realtime
        self._start = time.perf_counter()
        self._skipped = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._start + self._skipped

    def end_iteration(self, start: float, cost_s: Callable[[], float]) -> float:
        """When the iteration that began at `start` ended: now (its cost is not needed)."""
        return self.now()

    def wait_until(self, t: float) -> None:
        """Let the clock reach `t` (no-op if it has)."""
        gap = t - self.now()
        if gap <= 0:
            return
        if self.realtime:
            time.sleep(gap)
        else:
            self._skipped += gap


class VirtualClock(EngineClock):
    """The simulator's clock: an iteration lasts what the cost model says, not what it took.

    The passes still run and produce the tokens; only the times are the model's. With the
    simulator's cost model the scheduler's decisions become comparable one for one with
    `simulator.simulate` (the same admissions at the same moments): the mirror check.
    """

    def __init__(self) -> None:
        super().__init__(realtime=False)
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def wait_until(self, t: float) -> None:
        self._now = max(self._now, t)

    def end_iteration(self, start: float, cost_s: Callable[[], float]) -> float:
        self._now = start + float(cost_s())
        return self._now

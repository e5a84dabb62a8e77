"""A request workload: when each request arrives and how long its prompt and output are.

Stored as columns (numpy arrays) rather than a list of objects so that 100k-request traces load,
slice and feed the simulator quickly; `Request` is the row view for iteration and readability.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from traces._checks import count, positive_finite
from traces.errors import TraceError


@dataclass(frozen=True)
class Request:
    """One request of a workload (a row view; the workload itself is columnar)."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prompt: str | None = None
    category: str | None = None

    def __post_init__(self) -> None:
        where = f"request {self.request_id}"
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise TraceError(f"{where}: arrival_s must be finite and >= 0 (got {self.arrival_s})")
        for name in ("prompt_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise TraceError(f"{where}: {name} must be >= 1 (got {getattr(self, name)})")


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests sorted by arrival time, as read-only columns.

    Arrays are copied and made read-only on construction, so a workload can be cached and shared
    (the built-in traces are) without anyone mutating it underneath another user.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    request_ids: np.ndarray
    source: str
    prompts: tuple[str, ...] | None = None
    categories: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        arrival = _column("arrival_s", self.arrival_s, np.float64, "fiu")
        prompt = _column("prompt_tokens", self.prompt_tokens, np.int64, "iu")
        output = _column("output_tokens", self.output_tokens, np.int64, "iu")
        ids = _column("request_ids", self.request_ids, np.int64, "iu")
        sizes = {"arrival_s": arrival.size, "prompt_tokens": prompt.size,
                 "output_tokens": output.size, "request_ids": ids.size}
        if len(set(sizes.values())) != 1:
            have = ", ".join(f"{k} {v}" for k, v in sizes.items())
            raise TraceError(
                f"Workload: column lengths differ ({have}); give one value per request"
            )
        if arrival.size == 0:
            raise TraceError("Workload: no requests; a workload needs at least one request")
        _check_arrivals(arrival)
        _check_tokens("prompt_tokens", prompt)
        _check_tokens("output_tokens", output)
        _check_unique_ids(ids)
        if not isinstance(self.source, str):
            kind = type(self.source).__name__
            raise TraceError(f"Workload: source must be a string (got {kind})")
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "prompt_tokens", prompt)
        object.__setattr__(self, "output_tokens", output)
        object.__setattr__(self, "request_ids", ids)
        n = arrival.size
        object.__setattr__(self, "prompts", _strings("prompts", self.prompts, n))
        object.__setattr__(self, "categories", _strings("categories", self.categories, n))

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    def __getitem__(self, index: int) -> Request:
        n = len(self)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"Workload indices must be integers, not {type(index).__name__}")
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"request index {index} out of range for a workload of {n}")
        return Request(
            request_id=int(self.request_ids[i]),
            arrival_s=float(self.arrival_s[i]),
            prompt_tokens=int(self.prompt_tokens[i]),
            output_tokens=int(self.output_tokens[i]),
            prompt=None if self.prompts is None else self.prompts[i],
            category=None if self.categories is None else self.categories[i],
        )

    def __iter__(self) -> Iterator[Request]:
        n = len(self)
        prompts = self.prompts if self.prompts is not None else (None,) * n
        categories = self.categories if self.categories is not None else (None,) * n
        columns = zip(
            self.request_ids.tolist(), self.arrival_s.tolist(), self.prompt_tokens.tolist(),
            self.output_tokens.tolist(), prompts, categories, strict=True,
        )
        for rid, arrival, prompt_tokens, output_tokens, prompt, category in columns:
            yield Request(rid, arrival, prompt_tokens, output_tokens, prompt, category)

    @property
    def duration_s(self) -> float:
        """Seconds from the first arrival to the last (0 for a single request)."""
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def mean_rate_per_s(self) -> float:
        """(n - 1) / duration: arrivals per second between the first and last request.

        0.0 for a single request (no gap to measure); inf when n > 1 requests share one instant.
        """
        gaps = len(self) - 1
        if gaps == 0:
            return 0.0
        duration = self.duration_s
        return math.inf if duration == 0 else gaps / duration

    def head(self, n: int) -> Workload:
        """The first `n` requests (all of them if there are fewer)."""
        n = count("head(n)", n)
        if n >= len(self):
            return self
        return self._take(slice(0, n), f"{self.source}, first {n} requests")

    def window(self, start: int, n: int) -> Workload:
        """`n` consecutive requests from index `start` (wrapping around to the beginning when the
        trace ends first: the wrapped part's arrivals continue after the last one's gap)."""
        start, n = count("window(start)", start, minimum=0), count("window(n)", n)
        if n >= len(self):
            return self
        start %= len(self)
        rows = (np.arange(start, start + n) % len(self)).astype(np.int64)
        arrival = self.arrival_s[rows].copy()
        wrapped = rows < start
        if wrapped.any():  # continue the clock past the trace's end, one mean gap later
            gap = self.duration_s / max(len(self) - 1, 1)
            arrival[wrapped] += self.arrival_s[-1] - self.arrival_s[0] + gap
        source = (f"{self.source}, requests {start}..{start + n - 1}"
                  + (f" (wrapped past {len(self)})" if wrapped.any() else ""))
        return self._take(rows, source, arrival)

    def within(self, duration_s: float) -> Workload:
        """Requests arriving less than `duration_s` seconds after the first one."""
        duration = positive_finite("within(duration_s)", duration_s)
        keep = int(np.searchsorted(self.arrival_s - self.arrival_s[0], duration, side="left"))
        if keep >= len(self):
            return self
        return self._take(slice(0, keep), f"{self.source}, arrivals in the first {duration:g} s")

    def shifted_to_zero(self) -> Workload:
        """The same workload with the first arrival moved to t = 0 (gaps unchanged)."""
        if self.arrival_s[0] == 0:
            return self
        return Workload(
            arrival_s=self.arrival_s - self.arrival_s[0],
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            request_ids=self.request_ids,
            source=self.source,
            prompts=self.prompts,
            categories=self.categories,
        )

    def _take(self, rows: slice | np.ndarray, source: str,
              arrival_s: np.ndarray | None = None) -> Workload:
        def strings(values: tuple[str, ...] | None) -> tuple[str, ...] | None:
            if values is None or isinstance(rows, slice):
                return None if values is None else values[rows]
            return tuple(values[i] for i in rows)

        return Workload(
            arrival_s=self.arrival_s[rows] if arrival_s is None else arrival_s,
            prompt_tokens=self.prompt_tokens[rows],
            output_tokens=self.output_tokens[rows],
            request_ids=self.request_ids[rows],
            source=source,
            prompts=strings(self.prompts),
            categories=strings(self.categories),
        )


def _column(name: str, values: object, dtype: type, kinds: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise TraceError(f"Workload: {name} must be one-dimensional (got shape {array.shape})")
    if array.size and array.dtype.kind not in kinds:
        wanted = "numbers" if "f" in kinds else "integers"
        raise TraceError(
            f"Workload: {name} must hold {wanted} (got dtype {array.dtype}); convert it first"
        )
    out = np.array(array, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


def _check_arrivals(arrival: np.ndarray) -> None:
    bad = ~np.isfinite(arrival)
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"Workload: arrival_s of request index {i} is {arrival[i]}; arrival times must be "
            "finite seconds"
        )
    if arrival[0] < 0:
        raise TraceError(
            f"Workload: arrival_s of request index 0 is {arrival[0]}; arrival times must be >= 0 "
            "(subtract the first arrival time)"
        )
    backwards = np.diff(arrival) < 0
    if backwards.any():
        i = int(np.argmax(backwards)) + 1
        raise TraceError(
            f"Workload: arrival_s of request index {i} ({arrival[i]}) is earlier than request "
            f"index {i - 1} ({arrival[i - 1]}); sort requests by arrival (the loaders do)"
        )


def _check_tokens(name: str, tokens: np.ndarray) -> None:
    bad = tokens < 1
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"Workload: {name} of request index {i} is {tokens[i]}; token counts must be >= 1"
        )


def _check_unique_ids(ids: np.ndarray) -> None:
    order = np.argsort(ids, kind="stable")
    repeated = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if repeated.size:
        first, second = sorted((int(order[repeated[0]]), int(order[repeated[0] + 1])))
        raise TraceError(
            f"Workload: request id {ids[first]} is used by request indices {first} and {second}; "
            "request ids must be unique"
        )


def _strings(name: str, values: Sequence[str] | None, n: int) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise TraceError(f"Workload: {name} must be a sequence of strings, one per request")
    out = tuple(values)
    if len(out) != n:
        raise TraceError(f"Workload: {name} has {len(out)} entries for {n} requests; give one each")
    for i, value in enumerate(out):
        if not isinstance(value, str):
            raise TraceError(
                f"Workload: {name} entry for request index {i} is {type(value).__name__}, "
                "not a string"
            )
    return out

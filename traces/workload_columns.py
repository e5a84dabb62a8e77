"""Turn parsed columns of a workload file into a Workload, with line-numbered errors.

Shared by every format parser (spectune CSV, JSON lines, Azure): number and whole-number checks,
arrival sorting and request-id uniqueness. numpy only (no pandas), to keep `import traces` light.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from traces.errors import TraceError, UserNote
from traces.workload import Workload

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL = ("request_id", "prompt", "category")


class _Rows(Protocol):
    """What we use of a csv.reader: rows plus the physical line number for messages."""

    line_num: int

    def __iter__(self) -> Iterator[list[str]]: ...

    def __next__(self) -> list[str]: ...


def _numbers(cells: list[str], column: str, name: str, lines: np.ndarray) -> np.ndarray:
    """Parse a column of decimal strings; report the first bad line if any."""
    try:
        values = np.array(cells, dtype=str).astype(np.float64)
    except ValueError:
        parsed = []
        for i, cell in enumerate(cells):
            try:
                parsed.append(float(cell))
            except ValueError:
                raise TraceError(
                    f"{name}: line {lines[i]}: column {column!r} has non-numeric value {cell!r}; "
                    "use a plain decimal number"
                ) from None
        values = np.asarray(parsed, dtype=np.float64)
    _require_finite(values, column, name, lines)
    return values


def _integers(cells: list[str], column: str, name: str, lines: np.ndarray,
              minimum: int = 1) -> np.ndarray:
    values = _numbers(cells, column, name, lines)
    return _whole(values, column, name, lines, minimum)


def _require_finite(values: np.ndarray, column: str, name: str, lines: np.ndarray) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"{name}: line {lines[i]}: column {column!r} is {values[i]}; it must be a finite number"
        )


def _whole(values: np.ndarray, column: str, name: str, lines: np.ndarray,
           minimum: int) -> np.ndarray:
    bad = (values != np.floor(values)) | (values >= 2.0**53)
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"{name}: line {lines[i]}: column {column!r} is {float(values[i]):g}; "
            "it must be a whole number"
        )
    small = values < minimum
    if small.any():
        i = int(np.argmax(small))
        what = "a token count must be >= 1" if minimum == 1 else f"it must be >= {minimum}"
        raise TraceError(
            f"{name}: line {lines[i]}: column {column!r} is {int(values[i])}; {what}"
        )
    return values.astype(np.int64)


def _build(*, name: str, source: str, arrival: np.ndarray, prompt: np.ndarray,
           output: np.ndarray, ids: np.ndarray | None, prompts: list[str] | None,
           categories: list[str] | None, lines: np.ndarray) -> Workload:
    """Sort rows by arrival (stable) and construct the workload, with line-numbered errors."""
    if arrival.min() < 0:
        i = int(np.argmax(arrival < 0))
        raise TraceError(f"{name}: line {lines[i]}: arrival_s is {arrival[i]}; arrival times must "
                         "be >= 0 seconds")
    if ids is None:
        ids = np.arange(arrival.size, dtype=np.int64)
    else:
        _check_unique(ids, name, lines)
    order = np.argsort(arrival, kind="stable")
    if np.all(order[1:] > order[:-1]):
        order = slice(None)
    else:
        first = int(np.argmax(np.diff(arrival) < 0)) + 1
        warnings.warn(f"{name}: line {lines[first]}: arrivals are not in time order "
                      f"({arrival[first]:g} s after {arrival[first - 1]:g} s); the requests were "
                      "sorted by arrival_s", UserNote, stacklevel=2)
    return Workload(
        arrival_s=arrival[order],
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        request_ids=ids[order],
        source=source,
        prompts=None if prompts is None else tuple(np.asarray(prompts, dtype=object)[order]),
        categories=(None if categories is None
                    else tuple(np.asarray(categories, dtype=object)[order])),
    )


def _check_unique(ids: np.ndarray, name: str, lines: np.ndarray) -> None:
    order = np.argsort(ids, kind="stable")
    same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if same.size:
        first, second = order[same[0]], order[same[0] + 1]
        raise TraceError(
            f"{name}: line {lines[second]}: request_id {ids[second]} already used on line "
            f"{lines[first]}; request ids must be unique"
        )

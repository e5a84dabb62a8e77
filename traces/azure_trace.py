"""Read the Azure LLM inference trace format (TIMESTAMP,ContextTokens,GeneratedTokens).

A separate module because its rules differ from spectune's own CSV: arrivals come from
timestamps and rows with zero tokens are dropped. numpy only (no pandas), for a light import.
"""

from __future__ import annotations

import re

import numpy as np

from traces.errors import TraceError
from traces.workload import Workload
from traces.workload_columns import _build, _integers, _Rows

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?")


def _parse_azure(rows: _Rows, name: str, source: str) -> Workload:
    """Azure format: arrivals are seconds after the earliest kept request.

    Rows with 0 ContextTokens or 0 GeneratedTokens cannot be simulated (every request has a prompt
    and produces at least one token); they are dropped and the count is appended to `source`.
    The 2023 conv and code traces have no such rows.
    """
    stamps: list[str] = []
    context: list[str] = []
    generated: list[str] = []
    lines: list[int] = []
    for row in rows:
        if not row:
            continue
        if len(row) != 3:
            raise TraceError(
                f"{name}: line {rows.line_num} has {len(row)} fields; the Azure trace format has "
                "3 (TIMESTAMP,ContextTokens,GeneratedTokens)"
            )
        stamp = row[0].strip()
        if not _AZURE_TIME.fullmatch(stamp):
            raise TraceError(
                f"{name}: line {rows.line_num}: TIMESTAMP {row[0]!r} is not "
                "'YYYY-MM-DD HH:MM:SS.fffffff'"
            )
        stamps.append(stamp)
        context.append(row[1])
        generated.append(row[2])
        lines.append(rows.line_num)
    if not lines:
        raise TraceError(f"{name}: no requests (only a header); add at least one row")
    line_numbers = np.asarray(lines)
    nanos = _azure_nanoseconds(stamps, name, line_numbers)
    prompt = _integers(context, "ContextTokens", name, line_numbers, minimum=0)
    output = _integers(generated, "GeneratedTokens", name, line_numbers, minimum=0)
    keep = (prompt > 0) & (output > 0)
    dropped = int(keep.size - np.count_nonzero(keep))
    if dropped == keep.size:
        raise TraceError(f"{name}: every request has 0 ContextTokens or 0 GeneratedTokens; "
                         "nothing to simulate")
    if dropped:
        source = f"{source} (dropped {dropped} rows with 0 ContextTokens or 0 GeneratedTokens)"
    nanos = nanos[keep]
    arrival = (nanos - nanos.min()).astype(np.float64) / 1e9
    return _build(
        name=name,
        source=source,
        arrival=arrival,
        prompt=prompt[keep],
        output=output[keep],
        ids=np.flatnonzero(keep).astype(np.int64),
        prompts=None,
        categories=None,
        lines=line_numbers[keep],
    )


def _azure_nanoseconds(stamps: list[str], name: str, lines: np.ndarray) -> np.ndarray:
    try:
        times = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        for i, stamp in enumerate(stamps):
            try:
                np.datetime64(stamp, "ns")
            except ValueError:
                raise TraceError(
                    f"{name}: line {lines[i]}: TIMESTAMP {stamp!r} is not a valid date and time"
                ) from None
        times = np.array([np.datetime64(stamp, "ns") for stamp in stamps])
    return times.view(np.int64)

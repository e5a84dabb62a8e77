"""Read and write spectune's workload CSV (arrival_s, prompt_tokens, output_tokens, ...).

Uses the standard csv module plus numpy (no pandas), which keeps `import traces` light and lets
every bad value be reported with its line number.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from traces.errors import TraceError
from traces.workload import Workload
from traces.workload_columns import OPTIONAL, REQUIRED, _build, _integers, _numbers, _Rows


def _parse_csv(header: tuple[str, ...], rows: _Rows, name: str, source: str) -> Workload:
    missing = [col for col in REQUIRED if col not in header]
    if missing:
        have = ", ".join(header)
        raise TraceError(
            f"{name}: missing column {missing[0]!r} (have: {have}); a workload CSV needs "
            f"{', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})"
        )
    duplicated = sorted({col for col in header if header.count(col) > 1})
    if duplicated:
        raise TraceError(f"{name}: column {duplicated[0]!r} appears twice in the header; keep one")
    wanted = [col for col in (*REQUIRED, *OPTIONAL) if col in header]
    positions = [header.index(col) for col in wanted]
    columns: dict[str, list[str]] = {col: [] for col in wanted}
    lines: list[int] = []
    for row in rows:
        line = rows.line_num
        if not row:
            continue
        if len(row) != len(header):
            raise TraceError(
                f"{name}: line {line} has {len(row)} fields but the header has {len(header)}; "
                "quote values that contain commas"
            )
        for col, pos in zip(wanted, positions, strict=True):
            columns[col].append(row[pos])
        lines.append(line)
    if not lines:
        raise TraceError(f"{name}: no requests (only a header); add at least one row")
    line_numbers = np.asarray(lines)
    ids = (_integers(columns["request_id"], "request_id", name, line_numbers, minimum=0)
           if "request_id" in columns else None)
    return _build(
        name=name,
        source=source,
        arrival=_numbers(columns["arrival_s"], "arrival_s", name, line_numbers),
        prompt=_integers(columns["prompt_tokens"], "prompt_tokens", name, line_numbers),
        output=_integers(columns["output_tokens"], "output_tokens", name, line_numbers),
        ids=ids,
        prompts=columns.get("prompt"),
        categories=columns.get("category"),
        lines=line_numbers,
    )


def _csv_text(workload: Workload) -> str:
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\n")
    header = ["request_id", *REQUIRED]
    extra = [("prompt", workload.prompts), ("category", workload.categories)]
    header += [col for col, values in extra if values is not None]
    writer.writerow(header)
    for request in workload:
        row: list[object] = [request.request_id, repr(request.arrival_s), request.prompt_tokens,
                             request.output_tokens]
        row += [getattr(request, col) for col, values in extra if values is not None]
        writer.writerow(row)
    return out.getvalue()

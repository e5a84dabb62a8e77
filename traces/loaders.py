"""Read and write workload files: spectune CSV/JSONL and the Azure LLM inference trace format.

Parsing uses the standard csv/json modules plus numpy (no pandas), which keeps `import traces`
light and lets every bad value be reported with its line number.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from traces._atomic import atomic_write
from traces.errors import TraceError, UserNote
from traces.workload import Workload

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL = ("request_id", "prompt", "category")
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?")
_GZIP_MAGIC = b"\x1f\x8b"


class _Rows(Protocol):
    """What we use of a csv.reader: rows plus the physical line number for messages."""

    line_num: int

    def __iter__(self) -> Iterator[list[str]]: ...

    def __next__(self) -> list[str]: ...


def load_workload(path: str | os.PathLike[str]) -> Workload:
    """Load a workload file, choosing the parser from its name and first line.

    `.jsonl` → one JSON object per line; `.csv` → spectune columns (arrival_s, prompt_tokens,
    output_tokens; optional request_id, prompt, category) or, if the header is
    `TIMESTAMP,ContextTokens,GeneratedTokens`, the Azure LLM inference trace format. Either may be
    gzip-compressed (`.gz`). Rows are sorted by arrival (stable); request ids default to the
    0-based row order in the file.
    """
    file = Path(path)
    if not file.exists():
        raise TraceError(
            f"{file}: file not found; check the path (or use a built-in workload name)"
        )
    if not file.is_file():
        raise TraceError(f"{file}: not a regular file; give the path of a workload file")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise TraceError(f"{file}: cannot read ({exc.strerror}); check permissions") from exc
    return parse_workload_bytes(data, str(file), source=str(file))


def parse_workload_bytes(data: bytes, name: str, source: str) -> Workload:
    """Parse the bytes of a workload file; `name` (a file name) is used for messages and format."""
    text = _decode(data, name)
    stem = name[:-3] if name.endswith(".gz") else name
    first = next((line for line in text.splitlines() if line.strip()), None)
    if first is None:
        raise TraceError(f"{name}: empty file; a workload file needs at least one request")
    if stem.endswith(".jsonl") or (not stem.endswith(".csv") and first.lstrip().startswith("{")):
        return _parse_jsonl(text, name, source)
    rows: _Rows = csv.reader(io.StringIO(text, newline=""))
    header = tuple(cell.strip() for cell in next(row for row in rows if row))
    if header == AZURE_HEADER:
        return _parse_azure(rows, name, source)
    return _parse_csv(header, rows, name, source)


def save_workload(workload: Workload, path: str | os.PathLike[str]) -> None:
    """Write `workload` as .csv or .jsonl (optionally .gz), atomically (temp file + rename).

    Arrival times are written with repr() so they read back bit-identical.
    """
    file = Path(path)
    name = file.name[:-3] if file.name.endswith(".gz") else file.name
    if name.endswith(".csv"):
        text = _csv_text(workload)
    elif name.endswith(".jsonl"):
        text = _jsonl_text(workload)
    else:
        raise TraceError(
            f"{file}: unknown workload file type; use a name ending in .csv, .jsonl, .csv.gz "
            "or .jsonl.gz"
        )
    data = text.encode("utf-8")
    if file.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    with atomic_write(file) as handle:
        handle.write(data)


def _decode(data: bytes, name: str) -> str:
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(
                f"{name}: corrupt gzip data ({exc}); re-download or re-compress it"
            ) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{name}: not UTF-8 text (byte {exc.start}); a workload file must be UTF-8 CSV or JSONL"
        ) from exc


# --- spectune CSV -----------------------------------------------------------------------------


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


# --- JSON lines -------------------------------------------------------------------------------


def _parse_jsonl(text: str, name: str, source: str) -> Workload:
    arrival: list[float] = []
    prompt: list[float] = []
    output: list[float] = []
    ids: list[float] = []
    prompts: list[str] = []
    categories: list[str] = []
    lines: list[int] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceError(
                f"{name}: line {line}: invalid JSON ({exc.msg}); write one JSON object per line"
            ) from None
        if not isinstance(obj, dict):
            raise TraceError(f"{name}: line {line}: expected a JSON object, got "
                             f"{type(obj).__name__}; write one object per line")
        for key in REQUIRED:
            if key not in obj:
                raise TraceError(
                    f"{name}: line {line}: missing key {key!r} (have: {', '.join(obj)}); each line "
                    f"needs {', '.join(REQUIRED)}"
                )
        arrival.append(_json_number(obj["arrival_s"], "arrival_s", name, line))
        prompt.append(_json_number(obj["prompt_tokens"], "prompt_tokens", name, line))
        output.append(_json_number(obj["output_tokens"], "output_tokens", name, line))
        _optional(obj, "request_id", ids, lines, name, line, _json_number)
        _optional(obj, "prompt", prompts, lines, name, line, _json_string)
        _optional(obj, "category", categories, lines, name, line, _json_string)
        lines.append(line)
    if not lines:
        raise TraceError(f"{name}: empty file; a workload file needs at least one request")
    line_numbers = np.asarray(lines)
    arrival_array = np.asarray(arrival, dtype=np.float64)
    _require_finite(arrival_array, "arrival_s", name, line_numbers)
    return _build(
        name=name,
        source=source,
        arrival=arrival_array,
        prompt=_whole(np.asarray(prompt, dtype=np.float64), "prompt_tokens", name, line_numbers, 1),
        output=_whole(np.asarray(output, dtype=np.float64), "output_tokens", name, line_numbers, 1),
        ids=(_whole(np.asarray(ids, dtype=np.float64), "request_id", name, line_numbers, 0)
             if ids else None),
        prompts=prompts or None,
        categories=categories or None,
        lines=line_numbers,
    )


def _optional(obj: dict, key: str, into: list, seen: list[int], name: str, line: int,
              convert) -> None:
    """Collect an optional key, insisting it is on every line or on none (no silent gaps)."""
    present = key in obj and obj[key] is not None
    if present and len(into) != len(seen):
        raise TraceError(f"{name}: line {line} has {key!r} but earlier lines do not; give every "
                         f"line a {key!r} or none")
    if not present and into:
        raise TraceError(f"{name}: line {line} lacks {key!r} but earlier lines have it; give "
                         f"every line a {key!r} or none")
    if present:
        into.append(convert(obj[key], key, name, line))


def _json_number(value: object, key: str, name: str, line: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(
            f"{name}: line {line}: {key!r} has non-numeric value {value!r}; write a JSON number"
        )
    if isinstance(value, int) and abs(value) >= 2**53:
        raise TraceError(f"{name}: line {line}: {key!r} = {value} is too large")
    return float(value)


def _json_string(value: object, key: str, name: str, line: int) -> str:
    if not isinstance(value, str):
        raise TraceError(f"{name}: line {line}: {key!r} must be a string (got {value!r})")
    return value


# --- Azure LLM inference trace ----------------------------------------------------------------


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


# --- shared -----------------------------------------------------------------------------------


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


def _jsonl_text(workload: Workload) -> str:
    lines = []
    for request in workload:
        obj: dict[str, object] = {
            "request_id": request.request_id,
            "arrival_s": request.arrival_s,
            "prompt_tokens": request.prompt_tokens,
            "output_tokens": request.output_tokens,
        }
        if request.prompt is not None:
            obj["prompt"] = request.prompt
        if request.category is not None:
            obj["category"] = request.category
        lines.append(json.dumps(obj, ensure_ascii=False))
    return "\n".join(lines) + "\n"


"""Read and write workload files: spectune CSV/JSONL and the Azure LLM inference trace format.

Parsing uses the standard csv/json modules plus numpy (no pandas), which keeps `import traces`
light and lets every bad value be reported with its line number.

The formats live in workload_csv, workload_jsonl and azure_trace (shared column checks in
workload_columns); this module picks one from the file's name and first line.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import zlib
from pathlib import Path

from traces._atomic import atomic_write
from traces.azure_trace import AZURE_HEADER, _parse_azure
from traces.errors import TraceError
from traces.workload import Workload
from traces.workload_columns import OPTIONAL, REQUIRED, _Rows
from traces.workload_csv import _csv_text, _parse_csv
from traces.workload_jsonl import _jsonl_text, _parse_jsonl

__all__ = [
    "AZURE_HEADER",
    "OPTIONAL",
    "REQUIRED",
    "load_workload",
    "parse_workload_bytes",
    "save_workload",
]

_GZIP_MAGIC = b"\x1f\x8b"


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

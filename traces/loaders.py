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
import itertools
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


def load_workload(path: str | os.PathLike[str], limit: int | None = None) -> Workload:
    """Load a workload file, choosing the parser from its name and first line.

    `.jsonl` → one JSON object per line; `.csv` → spectune columns (arrival_s, prompt_tokens,
    output_tokens; optional request_id, prompt, category) or, if the header is
    `TIMESTAMP,ContextTokens,GeneratedTokens`, the Azure LLM inference trace format. Either may be
    gzip-compressed (`.gz`). Rows are sorted by arrival (stable); request ids default to the
    0-based row order in the file. `limit`: read only the file's first `limit` requests (rows
    in file order, then sorted), streaming it: a 10M-row file costs what its head costs.
    """
    file = Path(path)
    if not file.exists():
        raise TraceError(
            f"{file}: file not found; check the path (or use a built-in workload name)"
        )
    if not file.is_file():
        raise TraceError(f"{file}: not a regular file; give the path of a workload file")
    try:
        if limit is not None:
            return _parse_head(file, limit)
        data = file.read_bytes()
    except OSError as exc:
        raise TraceError(f"{file}: cannot read ({exc.strerror}); check permissions") from exc
    return parse_workload_bytes(data, str(file), source=str(file))


def _parse_head(file: Path, limit: int) -> Workload:
    """The first `limit` requests of a workload file, read as a stream (the format picked as
    parse_workload_bytes picks it)."""
    name = str(file)
    with file.open("rb") as raw:
        packed = raw.read(2) == _GZIP_MAGIC
    try:
        with _text(file, packed) as stream:
            head: list[str] = []
            for line in stream:  # up to the first non-empty line, to pick the format
                head.append(line)
                if line.strip():
                    break
            if not head or not head[-1].strip():
                raise TraceError(f"{name}: empty file; a workload file needs at least one "
                                 f"request")
            lines = itertools.chain(head, stream)
            stem = name[:-3] if name.endswith(".gz") else name
            if stem.endswith(".jsonl") or (not stem.endswith(".csv")
                                           and head[-1].lstrip().startswith("{")):
                kept, seen = [], 0
                for line in lines:
                    if seen == limit:
                        break
                    kept.append(line)
                    seen += bool(line.strip())
                return _parse_jsonl("".join(kept), name, name)
            rows = csv.reader(lines)
            header = tuple(cell.strip() for cell in next(row for row in rows if row))
            limited = _LimitedRows(rows, limit)
            if header == AZURE_HEADER:
                return _parse_azure(limited, name, name)
            return _parse_csv(header, limited, name, name)
    except UnicodeDecodeError as exc:
        raise TraceError(f"{name}: not UTF-8 text (byte {exc.start}); a workload file must be "
                         f"UTF-8 CSV or JSONL") from exc
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{name}: corrupt gzip data ({exc}); re-download or re-compress it"
                         ) from exc


def _text(file: Path, packed: bool):
    """The file as UTF-8 text (a BOM dropped), gunzipped where `packed`."""
    if packed:
        return gzip.open(file, "rt", encoding="utf-8-sig", newline="")
    return file.open(encoding="utf-8-sig", newline="")


class _LimitedRows:
    """A csv.reader that ends after `limit` non-empty rows (keeping its line numbers)."""

    def __init__(self, rows, limit: int) -> None:
        self._rows, self._left = rows, limit

    @property
    def line_num(self) -> int:
        return self._rows.line_num

    def __iter__(self) -> _LimitedRows:
        return self

    def __next__(self) -> list[str]:
        if self._left <= 0:
            raise StopIteration
        row = next(self._rows)
        self._left -= bool(row)
        return row


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

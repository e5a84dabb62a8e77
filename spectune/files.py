"""Atomic output files: a run that is interrupted never leaves a half-written result behind."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from traces import atomic_write


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        handle.write(text.encode("utf-8"))


def write_json(path: Path, data: Any) -> None:
    _replace(Path(path), to_json(data))


def to_json(data: Any) -> str:
    """Strict JSON: NaN and infinities (e.g. TPOT of one-token requests) become null."""
    return json.dumps(_finite(data), indent=2, default=_plain, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "item") and not hasattr(value, "__len__"):
        return _finite(value.item())
    return value


CSV_FLOATS = "%.9g"


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    _replace(Path(path), frame.to_csv(index=False, float_format=CSV_FLOATS))


class CsvStream:
    """A CSV written a frame at a time, to the same text as write_csv of the frames joined, in a
    temporary file renamed into place by `close` (an interrupted run leaves no partial file)."""

    def __init__(self, path: Path, columns: tuple[str, ...]) -> None:
        self.path = Path(path)
        self.columns = columns
        self._part = self.path.with_name(f".{self.path.name}.part")
        self._file = self._part.open("w", encoding="utf-8", newline="")
        self._header = True

    def __call__(self, frame: pd.DataFrame) -> None:
        self._file.write(frame.to_csv(index=False, float_format=CSV_FLOATS,
                                      header=self._header))
        self._header = False

    def close(self) -> None:
        if self._header:  # no rows: the header alone, as write_csv writes an empty frame
            self(pd.DataFrame(columns=list(self.columns)))
        self._file.close()
        self._part.replace(self.path)

    def abort(self) -> None:
        self._file.close()
        self._part.unlink(missing_ok=True)


def _plain(value: Any) -> Any:
    """numpy scalars and other simple objects into JSON."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def prepare_out(folder: Path) -> None:
    """Create the output folder before a long run, so a bad path fails in a second, not later."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".spectune-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {folder}: cannot write there ({exc.strerror})") from None


def without_keys(value, keys: set[str]):
    """`value` (JSON-like) without the dict entries named in `keys`, at any depth: a run's
    output less what measures the machine or how the run was dispatched, to compare results."""
    if isinstance(value, dict):
        return {k: without_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [without_keys(v, keys) for v in value]
    return value

"""Atomic output files: a run that is interrupted never leaves a half-written result behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd


def _replace(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    _replace(Path(path), lambda h: json.dump(data, h, indent=2, sort_keys=False, default=_plain))


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    _replace(Path(path), lambda h: frame.to_csv(h, index=False, float_format="%.9g"))


def _plain(value: Any) -> Any:
    """numpy scalars and other simple objects into JSON."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)

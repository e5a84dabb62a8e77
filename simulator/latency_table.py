"""The profiled latency table: timed forward passes over a grid, plus where they were timed.

A table is two files side by side, `NAME.csv` (one row per grid point: role, phase, num_seqs,
query and cached tokens per request, median/p10/p90 seconds, repeats) and `NAME.meta.json`
(device, versions, models, grid, date). The profiler writes it; the profiled latency model reads
it. A latency number without its device and versions can't be trusted, so loading checks both
files and names the file and the problem in one line. Every column and its valid values:
docs/profiling.md "The latency table".
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from simulator.catalog import ModelShape
from simulator.draft_feed import check_catch_up
from simulator.errors import ConfigError
from traces import atomic_write

SCHEMA_VERSION = 1
ROLE_PHASES: dict[str, tuple[str, ...]] = {
    "target": ("prefill", "decode", "verify"),
    "draft": ("prefill", "draft", "catchup"),
}
PHASES = ("prefill", "decode", "verify", "draft", "catchup")
KEY_COLUMNS = ("role", "phase", "num_seqs", "query_tokens_per_seq", "cached_tokens_per_seq")
TIME_COLUMNS = ("median_s", "p10_s", "p90_s")
COLUMNS = (*KEY_COLUMNS, *TIME_COLUMNS, "repeats")
_INT_MINIMUM = {"num_seqs": 1, "query_tokens_per_seq": 1, "cached_tokens_per_seq": 0, "repeats": 1}
#: Required meta keys and their JSON types; extra keys (host, CUDA version, ...) are kept as is.
META_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "device": (str,),  # "NVIDIA H100 80GB HBM3" or "cpu: <model name>"
    "driver": (str,),
    "torch_version": (str,),
    "dtype": (str,),
    "target": (dict,),  # a ModelShape as a dict
    "draft": (dict, type(None)),  # None: the table times no draft model
    "grid": (dict,),  # the axes swept, e.g. {"num_seqs": [...], ...}
    "created": (str,),  # ISO date or date-time
    "repeats": (int,),
    "warmup": (int,),
    "notes": (str,),
}
#: Optional: what the timed draft model feeds in a chain's first pass (simulator/draft_feed.py);
#: "bonus" when absent (a draft model that keeps its drafts cached).
DRAFT_CATCH_UP_KEY = "draft_catch_up"


def new_meta(
    device: str,
    driver: str,
    torch_version: str,
    dtype: str,
    target: ModelShape,
    draft: ModelShape | None,
    grid: dict,
    repeats: int,
    warmup: int,
    notes: str = "",
) -> dict:
    """A meta block stamped with this schema version and the current UTC time."""
    return {
        "schema_version": SCHEMA_VERSION,
        "device": device,
        "driver": driver,
        "torch_version": torch_version,
        "dtype": dtype,
        "target": asdict(target),
        "draft": asdict(draft) if draft else None,
        "grid": grid,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "repeats": repeats,
        "warmup": warmup,
        "notes": notes,
    }


@dataclass(frozen=True, eq=False)
class LatencyTable:
    """Validated rows (columns in `COLUMNS` order) and their meta block.

    Compared by identity: DataFrames have no single truth value for `==`.
    """

    rows: pd.DataFrame
    meta: dict

    def __post_init__(self) -> None:
        _check_meta(self.meta, "latency table meta")
        rows = _check_rows(self.rows, "latency table rows")
        if self.meta["draft"] is None and (rows["role"] == "draft").any():
            raise ConfigError("latency table rows: draft rows but meta 'draft' is null")
        object.__setattr__(self, "rows", rows)

    @property
    def target(self) -> ModelShape:
        return ModelShape(**self.meta["target"])

    @property
    def draft(self) -> ModelShape | None:
        return ModelShape(**self.meta["draft"]) if self.meta["draft"] else None

    def save(self, path_prefix: str | Path) -> tuple[Path, Path]:
        """Write NAME.csv and NAME.meta.json, each atomically; returns both paths."""
        csv_path, meta_path = table_paths(path_prefix)
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(csv_path, self.rows.to_csv(index=False, lineterminator="\n"))
        _write_atomic(meta_path, json.dumps(self.meta, indent=2, sort_keys=True) + "\n")
        return csv_path, meta_path

    @classmethod
    def load(cls, path: str | Path) -> LatencyTable:
        """Read a table from its prefix, either of its files, or a folder holding one table."""
        csv_path, meta_path = table_paths(path)
        for p in (csv_path, meta_path):
            if not p.is_file():
                raise ConfigError(f"{p}: no such file (a table is NAME.csv + NAME.meta.json)")
        try:
            meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{meta_path}: not valid JSON ({e})") from None
        _check_meta(meta, str(meta_path))
        try:
            raw = pd.read_csv(csv_path, keep_default_na=False, na_values=[""])
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise ConfigError(f"{csv_path}: not a readable CSV ({e})") from None
        rows = _check_rows(raw, str(csv_path))
        if meta["draft"] is None and (rows["role"] == "draft").any():
            raise ConfigError(f"{csv_path}: draft rows but {meta_path.name} has no draft model")
        return cls(rows, meta)


def table_paths(path: str | Path) -> tuple[Path, Path]:
    """(NAME.csv, NAME.meta.json) for a prefix, either file, or a folder holding one table."""
    p = Path(path)
    if p.is_dir():
        metas = sorted(p.glob("*.meta.json"))
        if len(metas) != 1:
            raise ConfigError(f"{p}: expected one *.meta.json in the folder, found {len(metas)}")
        p = metas[0]
    name = p.name
    for suffix in (".meta.json", ".csv"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return p.with_name(name + ".csv"), p.with_name(name + ".meta.json")


def _write_atomic(path: Path, text: str) -> None:
    """Readers never see half a file (temporary file beside `path`, then rename)."""
    with atomic_write(path) as handle:
        handle.write(text.encode("utf-8"))


def _check_meta(meta: object, where: str) -> None:
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: the meta block must be a JSON object")
    for key, types in META_TYPES.items():
        if key not in meta:
            raise ConfigError(f"{where}: missing key {key!r}")
        value = meta[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ConfigError(f"{where}: {key!r} must be {names}, got {value!r}")
    if meta["schema_version"] != SCHEMA_VERSION:
        raise ConfigError(
            f"{where}: schema_version {meta['schema_version']}, this spectune reads "
            f"{SCHEMA_VERSION}"
        )
    if not meta["device"]:
        raise ConfigError(f"{where}: 'device' is empty")
    try:
        datetime.fromisoformat(meta["created"])  # a date alone ("2026-11-21") parses too
    except ValueError:
        raise ConfigError(f"{where}: 'created' is not an ISO date: {meta['created']!r}") from None
    if meta["repeats"] < 1 or meta["warmup"] < 0:
        raise ConfigError(f"{where}: need repeats >= 1 and warmup >= 0")
    if DRAFT_CATCH_UP_KEY in meta:
        try:
            check_catch_up(meta[DRAFT_CATCH_UP_KEY], where)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    for role in ("target", "draft"):
        if meta[role] is not None:
            try:
                ModelShape(**meta[role])
            except TypeError as e:
                raise ConfigError(f"{where}: {role!r} is not a model shape ({e})") from None
            except ConfigError as e:
                raise ConfigError(f"{where}: {role!r}: {e}") from None


def _check_rows(rows: object, where: str) -> pd.DataFrame:
    """The rows in canonical column order and dtypes, or a ConfigError naming the problem."""
    if not isinstance(rows, pd.DataFrame):
        raise ConfigError(f"{where}: rows must be a pandas DataFrame")
    missing = [c for c in COLUMNS if c not in rows.columns]
    extra = [str(c) for c in rows.columns if c not in COLUMNS]
    if missing or extra:
        raise ConfigError(f"{where}: missing columns {missing}, unknown columns {extra}")
    if rows.empty:
        raise ConfigError(f"{where}: no rows")
    df = rows.loc[:, list(COLUMNS)].reset_index(drop=True).infer_objects()
    for col in COLUMNS:
        bad = df.index[df[col].isna()]
        if len(bad):
            raise ConfigError(f"{where}: column {col!r} is empty in row {bad[0] + 1}")
    for col, allowed in (("role", tuple(ROLE_PHASES)), ("phase", PHASES)):
        bad = df.index[~df[col].isin(allowed)]
        if len(bad):
            value = df.at[bad[0], col]
            raise ConfigError(f"{where}: row {bad[0] + 1}: {col} {value!r} is not one of {allowed}")
    pair_ok = [ph in ROLE_PHASES[r] for r, ph in zip(df["role"], df["phase"], strict=True)]
    if not all(pair_ok):
        i = pair_ok.index(False)
        role, phase = df.at[i, "role"], df.at[i, "phase"]
        raise ConfigError(f"{where}: row {i + 1}: a {role} pass can't be phase {phase!r}")
    for col, minimum in _INT_MINIMUM.items():
        if not pd.api.types.is_integer_dtype(df[col]):
            raise ConfigError(f"{where}: column {col!r} must hold integers")
        bad = df.index[df[col] < minimum]
        if len(bad):
            raise ConfigError(f"{where}: row {bad[0] + 1}: {col} must be >= {minimum}")
        df[col] = df[col].astype("int64")
    for col in TIME_COLUMNS:
        if not pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
            raise ConfigError(f"{where}: column {col!r} must hold numbers of seconds")
        df[col] = df[col].astype("float64")
        bad = df.index[~((df[col] > 0) & df[col].map(math.isfinite))]
        if len(bad):
            raise ConfigError(f"{where}: row {bad[0] + 1}: {col} must be a finite time > 0")
    bad = df.index[(df["p10_s"] > df["median_s"]) | (df["median_s"] > df["p90_s"])]
    if len(bad):
        raise ConfigError(f"{where}: row {bad[0] + 1}: need p10_s <= median_s <= p90_s")
    dup = df.index[df.duplicated(list(KEY_COLUMNS))]
    if len(dup):
        raise ConfigError(f"{where}: row {dup[0] + 1} repeats an earlier grid point")
    df["role"] = df["role"].astype(str)
    df["phase"] = df["phase"].astype(str)
    return df

"""Latency-table schema: save/load round trip, and one clear error per kind of bad file."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simulator.catalog import get_model
from simulator.errors import ConfigError
from simulator.latency_table import COLUMNS, LatencyTable, new_meta, table_paths


def make_rows() -> pd.DataFrame:
    return pd.DataFrame(
        [
            ("target", "prefill", 1, 512, 0, 0.0210, 0.0205, 0.0221, 20),
            ("target", "decode", 8, 1, 1024, 0.00612, 0.00601, 0.00633, 50),
            ("target", "verify", 8, 5, 1024, 0.00641, 0.00630, 0.00660, 50),
            ("draft", "prefill", 1, 512, 0, 0.00031, 0.00030, 0.00035, 50),
            ("draft", "draft", 8, 1, 1024, 1.0 / 7000, 1.0 / 7500, 1.0 / 6500, 50),
        ],
        columns=list(COLUMNS),
    )


def make_meta(draft=True) -> dict:
    return new_meta(
        device="NVIDIA H100 80GB HBM3",
        driver="580.159.04",
        torch_version="2.13.0",
        dtype="bfloat16",
        target=get_model("llama-3.1-8b"),
        draft=get_model("llama-68m") if draft else None,
        grid={"num_seqs": [1, 8], "query_tokens_per_seq": [1, 5, 512], "cached": [0, 1024]},
        repeats=50,
        warmup=5,
        notes="test fixture",
    )


@pytest.fixture
def table() -> LatencyTable:
    return LatencyTable(make_rows(), make_meta())


def test_round_trip_is_exact(tmp_path, table):
    csv_path, meta_path = table.save(tmp_path / "h100_8b")
    assert (csv_path.name, meta_path.name) == ("h100_8b.csv", "h100_8b.meta.json")
    loaded = LatencyTable.load(tmp_path / "h100_8b")
    pd.testing.assert_frame_equal(loaded.rows, table.rows)
    assert loaded.meta == table.meta
    assert loaded.target == get_model("llama-3.1-8b")
    assert loaded.draft == get_model("llama-68m")
    # Either file, or the folder holding the one table, names it too.
    for path in (csv_path, meta_path, tmp_path):
        pd.testing.assert_frame_equal(LatencyTable.load(path).rows, table.rows)


def test_save_leaves_no_temporary_files_and_creates_folders(tmp_path, table):
    table.save(tmp_path / "deep" / "dir" / "t")
    assert sorted(p.name for p in (tmp_path / "deep" / "dir").iterdir()) == [
        "t.csv",
        "t.meta.json",
    ]


def test_rows_are_normalised_to_column_order_and_dtypes():
    shuffled = make_rows()[list(reversed(COLUMNS))].astype({"num_seqs": "int32"})
    t = LatencyTable(shuffled, make_meta())
    assert tuple(t.rows.columns) == COLUMNS
    assert t.rows["num_seqs"].dtype == "int64" and t.rows["median_s"].dtype == "float64"
    boxed = LatencyTable(make_rows().astype(object), make_meta())  # e.g. built row by row
    pd.testing.assert_frame_equal(boxed.rows, t.rows)


def test_table_without_a_draft_model():
    rows = make_rows()
    target_only = rows[rows["role"] == "target"]
    t = LatencyTable(target_only, make_meta(draft=False))
    assert t.draft is None
    with pytest.raises(ConfigError, match="draft rows but meta 'draft' is null"):
        LatencyTable(rows, make_meta(draft=False))


def write(tmp_path, rows: pd.DataFrame | str, meta: dict | str):
    csv_text = rows if isinstance(rows, str) else rows.to_csv(index=False)
    meta_text = meta if isinstance(meta, str) else json.dumps(meta)
    (tmp_path / "t.csv").write_text(csv_text)
    (tmp_path / "t.meta.json").write_text(meta_text)
    return tmp_path / "t"


def edited_rows(row: int, column: str, value) -> pd.DataFrame:
    rows = make_rows().astype(object)
    rows.loc[row, column] = value
    return rows


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (make_rows().drop(columns="p90_s"), r"missing columns \['p90_s'\]"),
        (make_rows().assign(gpu="h100"), r"unknown columns \['gpu'\]"),
        (make_rows().iloc[:0], "no rows"),
        (edited_rows(1, "median_s", 0.0), r"row 2: median_s must be a finite time > 0"),
        (edited_rows(1, "median_s", -0.5), r"row 2: median_s must be a finite time > 0"),
        (edited_rows(2, "p10_s", 0.5), r"row 3: need p10_s <= median_s <= p90_s"),
        (edited_rows(0, "role", "oracle"), r"row 1: role 'oracle' is not one of"),
        (edited_rows(0, "phase", "decoding"), r"row 1: phase 'decoding' is not one of"),
        (edited_rows(4, "phase", "verify"), r"row 5: a draft pass can't be phase 'verify'"),
        (edited_rows(3, "num_seqs", 1.5), r"column 'num_seqs' must hold integers"),
        (edited_rows(3, "num_seqs", 0), r"row 4: num_seqs must be >= 1"),
        (edited_rows(3, "median_s", "fast"), r"column 'median_s' must hold numbers"),
        (edited_rows(2, "repeats", None), r"column 'repeats' is empty in row 3"),
        (pd.concat([make_rows(), make_rows().iloc[[1]]]), r"row 6 repeats an earlier grid point"),
    ],
)
def test_bad_rows_name_the_file_and_the_problem(tmp_path, rows, message):
    prefix = write(tmp_path, rows, make_meta())
    with pytest.raises(ConfigError, match=r"t\.csv: .*" + message) as e:
        LatencyTable.load(prefix)
    assert "\n" not in str(e.value)


def meta_without(key: str) -> dict:
    meta = make_meta()
    del meta[key]
    return meta


def meta_with(key: str, value) -> dict:
    return {**make_meta(), key: value}


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (meta_without("driver"), "missing key 'driver'"),
        (meta_without("target"), "missing key 'target'"),
        (meta_with("schema_version", 2), "schema_version 2, this spectune reads 1"),
        (meta_with("created", "yesterday"), "'created' is not an ISO date"),
        (meta_with("repeats", "many"), "'repeats' must be int"),
        (meta_with("repeats", True), "'repeats' must be int"),
        (meta_with("warmup", -1), "need repeats >= 1 and warmup >= 0"),
        (meta_with("device", ""), "'device' is empty"),
        (meta_with("target", {"name": "x"}), "'target' is not a model shape"),
        (meta_with("draft", "llama-68m"), "'draft' must be dict or null"),
        (meta_with("draft_catch_up", "all"), "draft_catch_up must be one of bonus, committed, one"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_bad_meta_names_the_file_and_the_problem(tmp_path, meta, message):
    prefix = write(tmp_path, make_rows(), meta)
    with pytest.raises(ConfigError, match=r"t\.meta\.json: .*" + message) as e:
        LatencyTable.load(prefix)
    assert "\n" not in str(e.value)


def test_missing_files_and_ambiguous_folders(tmp_path, table):
    with pytest.raises(ConfigError, match=r"nope\.csv: no such file"):
        LatencyTable.load(tmp_path / "nope")
    table.save(tmp_path / "a")
    table.save(tmp_path / "b")
    with pytest.raises(ConfigError, match="expected one"):
        LatencyTable.load(tmp_path)
    (tmp_path / "a.csv").unlink()
    with pytest.raises(ConfigError, match=r"a\.csv: no such file"):
        LatencyTable.load(tmp_path / "a.meta.json")


def test_unreadable_csv(tmp_path):
    prefix = write(tmp_path, "", make_meta())
    with pytest.raises(ConfigError, match=r"t\.csv: not a readable CSV"):
        LatencyTable.load(prefix)


def test_table_paths_strip_known_suffixes(tmp_path):
    assert table_paths(tmp_path / "x.csv") == (tmp_path / "x.csv", tmp_path / "x.meta.json")
    assert table_paths(tmp_path / "x.meta.json") == (tmp_path / "x.csv", tmp_path / "x.meta.json")
    assert table_paths(tmp_path / "x") == (tmp_path / "x.csv", tmp_path / "x.meta.json")


def test_in_memory_validation_needs_no_file():
    with pytest.raises(ConfigError, match="latency table rows: no rows"):
        LatencyTable(make_rows().iloc[:0], make_meta())
    with pytest.raises(ConfigError, match="latency table meta: missing key 'notes'"):
        LatencyTable(make_rows(), meta_without("notes"))

"""Workload files: spectune CSV/JSONL, the Azure trace format, gzip, and their error messages."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces import TraceError, UserNote, Workload, load_workload, save_workload

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:50.9951691,7,1"
)


def write(tmp_path, name, text):
    path = tmp_path / name
    data = text.encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


def test_csv_sorts_stably_and_numbers_rows(tmp_path):
    text = "arrival_s,prompt_tokens,output_tokens\n2,20,2\n1,10,1\n2,30,3\n"
    path = write(tmp_path, "w.csv", text)
    with pytest.warns(UserNote, match=r"line 3: arrivals are not in time order"):
        w = load_workload(path)
    assert list(w.arrival_s) == [1.0, 2.0, 2.0]
    assert list(w.request_ids) == [1, 0, 2]
    assert list(w.prompt_tokens) == [10, 20, 30]
    assert w.source == str(path) and w.prompts is None


def test_csv_optional_columns_and_extra_columns(tmp_path):
    text = ('note,category,output_tokens,prompt,prompt_tokens,arrival_s,request_id\n'
            'x,chat,5,"hello, world",3,0.5,17\n')
    w = load_workload(write(tmp_path, "w.csv", text))
    assert w[0].request_id == 17 and w[0].prompt == "hello, world" and w[0].category == "chat"


def test_jsonl_with_optional_keys(tmp_path):
    lines = [
        {"arrival_s": 0.25, "prompt_tokens": 4, "output_tokens": 2, "prompt": "p0",
         "category": "a"},
        {"arrival_s": 0.0, "prompt_tokens": 5, "output_tokens": 3.0, "prompt": "p1",
         "category": "b"},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n\n"
    with pytest.warns(UserNote, match="line 2: arrivals are not in time order"):
        w = load_workload(write(tmp_path, "w.jsonl", text))
    assert list(w.request_ids) == [1, 0]
    assert w.prompts == ("p1", "p0") and w.categories == ("b", "a")
    assert list(w.output_tokens) == [3, 2]


def test_azure_format(tmp_path):
    w = load_workload(write(tmp_path, "trace.csv", AZURE))
    assert w.arrival_s[0] == 0.0
    assert w.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert w.arrival_s[2] - w.arrival_s[1] == pytest.approx(1e-7, abs=1e-9)
    assert list(w.prompt_tokens) == [374, 396, 7] and list(w.output_tokens) == [44, 109, 1]


def test_azure_rows_with_zero_tokens_are_dropped_and_counted(tmp_path):
    text = AZURE.replace("374,44", "374,0").replace("396,109", "0,109")
    w = load_workload(write(tmp_path, "trace.csv", text))
    assert len(w) == 1 and list(w.request_ids) == [2] and w.arrival_s[0] == 0.0
    assert "dropped 2 rows with 0 ContextTokens or 0 GeneratedTokens" in w.source
    everything = text.replace("7,1", "7,0")
    with pytest.raises(TraceError, match="every request has 0 ContextTokens or 0 GeneratedTokens"):
        load_workload(write(tmp_path, "zero.csv", everything))


@pytest.mark.parametrize("name", ["w.csv.gz", "w.jsonl.gz", "azure.csv.gz"])
def test_gzip_files(tmp_path, name):
    if name.startswith("azure"):
        text = AZURE
    elif ".jsonl" in name:
        text = '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n' * 3
    else:
        text = "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,1,1\n2,1,1\n"
    assert len(load_workload(write(tmp_path, name, text))) == 3


def test_content_sniffing_for_unknown_suffix(tmp_path):
    path = write(tmp_path, "w.txt", '{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 1}\n')
    assert load_workload(path).arrival_s[0] == 1.0
    path = write(tmp_path, "w.data", "arrival_s,prompt_tokens,output_tokens\n1,1,1\n")
    assert len(load_workload(path)) == 1


HEADER = "arrival_s,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("workload.csv", "a,b,c\n1,2,3\n",
         r"workload.csv: missing column 'arrival_s' \(have: a, b, c\); a workload CSV needs "
         "arrival_s, prompt_tokens, output_tokens"),
        ("workload.csv", "arrival_s,prompt_tokens\n1,2\n", "missing column 'output_tokens'"),
        ("empty.csv", "", "empty.csv: empty file"),
        ("blank.jsonl", "\n  \n", "blank.jsonl: empty file"),
        ("header.csv", HEADER, r"no requests \(only a header\)"),
        ("w.csv", HEADER + "0,1,1\n1,ten,1\n",
         "w.csv: line 3: column 'prompt_tokens' has non-numeric value 'ten'"),
        ("w.csv", HEADER + "0,1,1\nsoon,1,1\n", "line 3: column 'arrival_s' has non-numeric"),
        ("w.csv", HEADER + "0,1,1\n1,,1\n",
         "line 3: column 'prompt_tokens' has non-numeric value ''"),
        ("w.csv", HEADER + "0,1,0\n",
         "line 2: column 'output_tokens' is 0; a token count must be >= 1"),
        ("w.csv", HEADER + "0,-3,1\n", "line 2: column 'prompt_tokens' is -3"),
        ("w.csv", HEADER + "0,2.5,1\n",
         "line 2: column 'prompt_tokens' is 2.5; it must be a whole"),
        ("w.csv", HEADER + "0,1,1\ninf,1,1\n",
         "line 3: column 'arrival_s' is inf; it must be a finite"),
        ("w.csv", HEADER + "nan,1,1\n", "line 2: column 'arrival_s' is nan"),
        ("w.csv", HEADER + "-1,1,1\n", "line 2: arrival_s is -1.0; arrival times must be >= 0"),
        ("w.csv", HEADER + "0,1\n", "line 2 has 2 fields but the header has 3"),
        ("w.csv", "request_id," + HEADER + "4,0,1,1\n4,1,1,1\n",
         "line 3: request_id 4 already used on line 2"),
        ("w.csv", "arrival_s,arrival_s,prompt_tokens,output_tokens\n0,0,1,1\n",
         "column 'arrival_s' appears twice"),
        ("w.jsonl", '{"arrival_s": 0, "prompt_tokens": 1}\n',
         "w.jsonl: line 1: missing key 'output_tokens'"),
        ("w.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n{oops\n',
         "line 2: invalid JSON"),
        ("w.jsonl", "[1, 2]\n", "line 1: expected a JSON object, got list"),
        ("w.jsonl", '{"arrival_s": "0", "prompt_tokens": 1, "output_tokens": 1}\n',
         "line 1: 'arrival_s' has non-numeric value '0'"),
        ("w.jsonl", '{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 1}\n',
         "line 1: column 'prompt_tokens' is 0"),
        ("w.jsonl", '{"arrival_s": 1e999, "prompt_tokens": 1, "output_tokens": 1}\n',
         "line 1: column 'arrival_s' is inf"),
        ("w.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n'
                    '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "prompt": "x"}\n',
         "line 2 has 'prompt' but earlier lines do not"),
        ("w.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "category": "x"}\n'
                    '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n',
         "line 2 lacks 'category' but earlier lines have it"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15,1,1\n",
         r"line 2: TIMESTAMP '2023-11-16 18:15' is not 'YYYY-MM-DD HH:MM:SS.fffffff'"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46.1,1,1\n",
         "line 2: TIMESTAMP '2023-13-16 18:15:46.1' is not a valid date"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,x,1\n",
         "line 2: column 'ContextTokens' has non-numeric value 'x'"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,1\n",
         "line 2 has 2 fields; the Azure trace format has 3"),
    ],
)
def test_bad_files_raise_one_clear_trace_error(tmp_path, name, text, message):
    with pytest.raises(TraceError, match=message) as info:
        load_workload(write(tmp_path, name, text))
    assert "\n" not in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.csv: file not found"):
        load_workload(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="not a regular file"):
        load_workload(tmp_path)


def test_corrupt_gzip_and_non_utf8(tmp_path):
    bad = tmp_path / "w.csv.gz"
    bad.write_bytes(gzip.compress(b"arrival_s,prompt_tokens,output_tokens\n0,1,1\n")[:20])
    with pytest.raises(TraceError, match="corrupt gzip data"):
        load_workload(bad)
    latin = tmp_path / "w.csv"
    latin.write_bytes(b"arrival_s,prompt_tokens,output_tokens,prompt\n0,1,1,caf\xe9\n")
    with pytest.raises(TraceError, match="not UTF-8 text"):
        load_workload(latin)


def sample_workload(arrival, prompts=None):
    n = len(arrival)
    return Workload(
        arrival_s=np.sort(np.asarray(arrival, dtype=float)),
        prompt_tokens=np.arange(1, n + 1),
        output_tokens=np.arange(n, 0, -1),
        request_ids=np.arange(100, 100 + n),
        source="memory",
        prompts=prompts,
        categories=None if prompts is None else tuple("c" for _ in range(n)),
    )


@pytest.mark.parametrize("name", ["out.csv", "out.jsonl", "out.csv.gz", "out.jsonl.gz"])
def test_save_load_round_trip_is_exact(tmp_path, name):
    w = sample_workload([0.1, 1 / 3, 2 / 3, 1e6 + 1e-7],
                        prompts=("plain", 'quote " and, comma', "new\nline", "ünï"))
    save_workload(w, tmp_path / name)
    back = load_workload(tmp_path / name)
    assert np.array_equal(back.arrival_s, w.arrival_s)
    assert np.array_equal(back.request_ids, w.request_ids)
    assert np.array_equal(back.prompt_tokens, w.prompt_tokens)
    assert np.array_equal(back.output_tokens, w.output_tokens)
    assert back.prompts == w.prompts and back.categories == w.categories
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temp file left behind


def test_gzip_save_is_reproducible(tmp_path):
    w = sample_workload([0.0, 1.0])
    save_workload(w, tmp_path / "a.csv.gz")
    save_workload(w, tmp_path / "b.csv.gz")
    assert (tmp_path / "a.csv.gz").read_bytes() == (tmp_path / "b.csv.gz").read_bytes()


def test_save_errors(tmp_path):
    w = sample_workload([0.0])
    with pytest.raises(TraceError, match=r"unknown workload file type; use .*\.csv"):
        save_workload(w, tmp_path / "w.parquet")
    with pytest.raises(TraceError, match=r"directory .* does not exist"):
        save_workload(w, tmp_path / "missing" / "w.csv")


def test_save_replaces_existing_file(tmp_path):
    target = tmp_path / "w.csv"
    target.write_text("old")
    save_workload(sample_workload([0.0, 2.0]), target)
    assert len(load_workload(target)) == 2


@settings(deadline=None, max_examples=40)
@given(st.lists(st.floats(0, 1e7, allow_nan=False, allow_subnormal=False), min_size=1,
                max_size=30),
       st.sampled_from(["w.csv", "w.jsonl"]))
def test_round_trip_property(tmp_path_factory, arrival, name):
    path = tmp_path_factory.mktemp("rt") / name
    w = sample_workload(arrival)
    save_workload(w, path)
    back = load_workload(path)
    assert np.array_equal(back.arrival_s, w.arrival_s)
    assert np.array_equal(back.request_ids, w.request_ids)

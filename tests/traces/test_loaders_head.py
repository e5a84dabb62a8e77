"""`load_workload(path, limit)` streams the file's first requests: the same workload as reading
it all and taking its head, in every format, without reading (or choking on) what follows."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from spectune.cli import main
from traces import TraceError, Workload, load_workload, save_workload

ROWS = 50


def workload() -> Workload:
    rng = np.random.default_rng(0)
    return Workload(arrival_s=np.cumsum(rng.exponential(0.5, ROWS)),
                    prompt_tokens=rng.integers(1, 900, ROWS),
                    output_tokens=rng.integers(1, 300, ROWS),
                    request_ids=np.arange(ROWS), source="test",
                    prompts=[f"question {i},\nwith a comma and a newline" for i in range(ROWS)])


@pytest.mark.parametrize("name", ["w.csv", "w.csv.gz", "w.jsonl", "w.jsonl.gz"])
def test_the_head_is_the_whole_files_head(tmp_path, name):
    save_workload(workload(), tmp_path / name)
    whole = load_workload(tmp_path / name)
    for limit in (1, 7, ROWS, ROWS + 10):
        head = load_workload(tmp_path / name, limit)
        want = whole.head(min(limit, ROWS))
        assert len(head) == len(want)
        for column in ("arrival_s", "prompt_tokens", "output_tokens", "request_ids"):
            assert np.array_equal(getattr(head, column), getattr(want, column))
        assert head.prompts == want.prompts


def test_azure_format_head(tmp_path):
    rows = [f"2023-11-16 18:15:46.{i:06d}0,{100 + i},{10 + i}" for i in range(20)]
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    head, whole = load_workload(path, 5), load_workload(path)
    assert np.array_equal(head.prompt_tokens, whole.prompt_tokens[:5])
    assert np.array_equal(head.arrival_s, whole.arrival_s[:5])


def test_what_follows_the_head_is_not_read(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,20,6\nbad,row,here\n")
    assert len(load_workload(path, 2)) == 2
    with pytest.raises(TraceError, match="line 4"):
        load_workload(path)  # the whole file still reports its bad line
    gz = tmp_path / "big.csv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert len(load_workload(gz, 2)) == 2
    (tmp_path / "empty.csv").write_text("\n\n")
    with pytest.raises(TraceError, match="empty file"):
        load_workload(tmp_path / "empty.csv", 3)
    (tmp_path / "latin.csv").write_bytes(b"arrival_s,prompt_tokens,output_tokens\n0,1\xe9,2\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_workload(tmp_path / "latin.csv", 3)


def test_simulate_reads_only_the_requests_it_simulates(tmp_path, capsys):
    path = tmp_path / "w.csv"
    save_workload(workload(), path)
    with path.open("a") as tail:
        tail.write("not,a,row,at all\n")  # past the first 30 requests: never read
    assert main(["simulate", "--workload", str(path), "--requests", "30", "--acceptance",
                 "iid:0.7", "--format", "json"]) == 0
    assert '"requests": 30' in capsys.readouterr().out

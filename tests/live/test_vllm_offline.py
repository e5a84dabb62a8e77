"""The vLLM adapter's offline parts: runs read back for a second simulation, the trace-lengths
workload, the environment a default --vllm-venv finds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from live.vllm_run import load_run
from live.vllm_server import DEFAULT_VENV, resolve_venv
from simulator import ConfigError
from spectune.record_vllm import ngram_sizes

pytest.importorskip("torch")  # the tokenizer's loader


def write_run(folder: Path, prompt_tokens: list[int]) -> None:
    folder.mkdir(parents=True)
    n = len(prompt_tokens)
    pd.DataFrame({"request_id": range(n), "arrival_s": np.arange(n) * 1.0,
                  "prompt_tokens": prompt_tokens}).to_csv(folder / "requests.csv", index=False)
    pd.DataFrame({"iteration": [0], "elapsed_ms": [5.0]}).to_csv(folder / "iterations.csv",
                                                                 index=False)
    (folder / "outputs.json").write_text(json.dumps([[1, 2]] * n))
    (folder / "per_step.json").write_text(json.dumps([[[2], [1]]] * n))
    (folder / "meta.json").write_text(json.dumps({"probe_rows": []}))


def test_a_kept_run_reads_back_and_a_partial_one_says_what_is_missing(tmp_path):
    write_run(tmp_path / "rate2", [10, 20])
    run = load_run(tmp_path / "rate2")
    assert list(run.requests.prompt_tokens) == [10, 20]
    assert run.outputs == [[1, 2], [1, 2]] and run.per_step[0] == ([2], [1])
    (tmp_path / "rate2" / "outputs.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing outputs\.json"):
        load_run(tmp_path / "rate2")


def test_measured_runs_must_have_served_the_same_workload(tmp_path):
    from spectune.validate_vllm import VllmConfig, VllmValidation, measured_runs
    from traces import Workload

    def workload(prompts):
        n = len(prompts)
        return Workload(arrival_s=np.arange(n) * 1.0, prompt_tokens=np.array(prompts),
                        output_tokens=np.full(n, 2), request_ids=np.arange(n), source="test")

    v = VllmValidation("vllm-cpu-smollm2", tmp_path, tmp_path, (2.0,), (), 2, 2)
    config = VllmConfig("fixed:k=2", 2)
    write_run(tmp_path / "old" / "k2" / "rate2", [10, 20])
    runs, log = measured_runs(v, config, {"rate2": (workload([10, 20]), None)}, tmp_path / "new",
                              tmp_path / "old", say=lambda _: None)
    assert list(runs) == ["rate2"] and log == tmp_path / "old" / "k2" / "server.log"
    with pytest.raises(ConfigError, match="served another workload"):
        measured_runs(v, config, {"rate2": (workload([10, 21]), None)}, tmp_path / "new",
                      tmp_path / "old", say=lambda _: None)
    with pytest.raises(ConfigError, match="same --policies, --rates and --calibrate"):
        measured_runs(v, VllmConfig("fixed:k=4", 4), {"rate2": (workload([10, 20]), None)},
                      tmp_path / "new", tmp_path / "old", say=lambda _: None)


def test_trace_lengths_get_real_text_cut_to_the_model_length():
    from spectune.validate_vllm import trace_workload

    wl, ids = trace_workload("azure-conv", 12, 0.5, 0, max_model_len=512)
    assert [len(p) for p in ids] == list(wl.prompt_tokens)
    assert (wl.prompt_tokens + wl.output_tokens <= 511).all()
    assert (wl.output_tokens <= 256).all()
    assert len(set(map(tuple, ids))) == 12  # each its own window of text
    assert "cut to max_model_len 512" in wl.source
    again, ids_again = trace_workload("azure-conv", 12, 0.5, 0, max_model_len=512)
    assert ids == ids_again and (again.arrival_s == wl.arrival_s).all()


def test_the_default_environment_is_the_checkouts_when_the_working_folder_has_none(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkout = Path(__file__).resolve().parents[2] / DEFAULT_VENV
    expected = checkout if checkout.exists() else Path(DEFAULT_VENV)
    assert resolve_venv(DEFAULT_VENV) == expected
    (tmp_path / DEFAULT_VENV).mkdir()
    assert resolve_venv(DEFAULT_VENV) == Path(DEFAULT_VENV)  # the working folder's comes first
    assert resolve_venv("elsewhere") == Path("elsewhere")


def test_ngram_sizes_are_vllms_lookup_bounds():
    assert ngram_sizes("ngram") == (1, 3) and ngram_sizes("ngram:2-4") == (2, 4)
    for bad in ("ngram:4-2", "ngram:x", "ngrams"):
        with pytest.raises(ValueError, match="write ngram or ngram:MIN-MAX"):
            ngram_sizes(bad)


@pytest.mark.parametrize("workload", [None, "azure-conv"])
def test_a_calibrated_validation_serves_a_calibration_window_before_each_run(workload):
    """--calibrate: each rate's window follows its calibration window on the same server, with
    the same arrivals and lengths and the training questions' text, never the held-out ones."""
    from spectune.validate_vllm import (
        VllmValidation,
        calibration_label,
        validation_workloads,
    )

    v = VllmValidation("vllm-cpu-smollm2", Path("."), Path("."), (0.5, 3.0), (), 6, 16,
                       workload=workload, max_model_len=512)
    plain = validation_workloads(v)
    assert list(plain) == ["rate0.5", "rate3"]
    calibrated = validation_workloads(VllmValidation(**{**v.__dict__, "calibrate": True}))
    assert list(calibrated) == ["rate0.5-calibration", "rate0.5", "rate3-calibration", "rate3"]
    for label, (wl, ids) in plain.items():
        assert calibrated[label][1] == ids  # the measured windows are the same
        cal, cal_ids = calibrated[calibration_label(label)]
        np.testing.assert_array_equal(cal.arrival_s, wl.arrival_s)
        np.testing.assert_array_equal(cal.output_tokens, wl.output_tokens)
        # the same prompt lengths (a trace's, or Spec-Bench's measured ones), other text
        np.testing.assert_array_equal(cal.prompt_tokens, wl.prompt_tokens)
        assert [len(x) for x in cal_ids] == list(wl.prompt_tokens)
        assert not {tuple(x) for x in cal_ids} & {tuple(x) for x in ids}
        assert "train" in cal.source and "train" not in wl.source

"""Input that used to be accepted in silence: each gets a word now, a note when the input was
changed and the run goes on, a one-line error (exit 2) when it cannot mean anything."""

from __future__ import annotations

import pytest

from spectune.cli import main

TINY = ["--requests", "5", "--format", "json"]


def _err(capsys, argv: list[str], code: int) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_unsorted_arrivals_are_sorted_with_a_note(tmp_path, capsys):
    path = tmp_path / "w.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n2,10,5\n1,10,5\n")
    err = _err(capsys, ["simulate", "--workload", str(path), *TINY], 0)
    assert f"spectune: note: {path}: line 4: arrivals are not in time order" in err
    assert "sorted by arrival_s" in err


def test_more_requests_than_the_trace_holds_get_a_note(capsys):
    err = _err(capsys, ["simulate", "--workload", "azure-code", "--requests", "100000",
                        "--rate", "50", "--format", "json"], 0)
    assert "note: --requests 100,000 is more than the 8,819 requests of the trace" in err


def test_a_tune_whose_windows_cover_the_whole_trace_says_the_seeds_repeat(tmp_path, capsys):
    path = tmp_path / "w.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{i},50,10\n" for i in range(6)))
    err = _err(capsys, ["tune", "--workload", str(path), "--requests", "10", "--rates", "4",
                        "--seeds", "2", "--policies", "fixed:k=2", "--jobs", "1",
                        "--no-samples", "--no-report", "--out", str(tmp_path / "t")], 0)
    assert "every seed serves the whole trace" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["simulate", "--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["tune", "--jobs", "-3"], "--jobs must be >= 0"),
    (["plan", "--slo-ttft", "1", "--jobs", "-3"], "--jobs must be >= 0"),
    (["plan", "--slo-ttft", "1", "--prices", "TPU=3"], "--prices: 'TPU' is not among"),
    (["simulate", "--acceptance", "smollm2-ngramm"], "did you mean 'smollm2-ngram'?"),
])
def test_bad_values_name_their_flag(argv, message, tmp_path, capsys):
    err = _err(capsys, [*argv, *(["--out", str(tmp_path)] if argv[0] != "simulate" else [])],
               2)
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_misspelt_recording_lists_the_shipped_ones(capsys):
    from traces.builtin import speculation_names

    err = _err(capsys, ["simulate", "--acceptance", "smollm2-ngramm"], 2)
    assert all(name in err for name in speculation_names())


def test_report_on_a_file_says_it_is_a_file(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("x")
    err = _err(capsys, ["report", str(text)], 2)
    assert "a file, not a folder" in err and "no such folder" not in err
    tune = tmp_path / "tune.json"
    tune.write_text("{}")
    assert f"give its folder: spectune report {tmp_path}" in _err(capsys, ["report", str(tune)],
                                                                   2)


def test_vllm_engine_flags_are_checked_before_anything_runs(tmp_path, capsys):
    err = _err(capsys, ["validate", "--engine", "vllm", "--out", str(tmp_path / "v")], 2)
    assert "--engine vllm compares with vLLM's own profile" in err
    assert "spectune profile --engine vllm" in err
    err = _err(capsys, ["validate", "--engine", "sglang", "--out", str(tmp_path / "v")], 2)
    assert "--engine must be spectune or vllm" in err
    err = _err(capsys, ["validate", "--engine", "vllm", "--profile", "vllm-cpu-smollm2",
                        "--policies", "goodput", "--vllm-venv", str(tmp_path / "none"),
                        "--out", str(tmp_path / "v")], 2)
    assert "fixed:k=K or batch_adaptive:schedule=" in err
    err = _err(capsys, ["profile", "--engine", "vllm", "--vllm-venv", str(tmp_path / "none"),
                        "--out", str(tmp_path / "p")], 2)
    assert "scripts/vllm_env.sh" in err
    err = _err(capsys, ["profile", "--speculative-tokens", "0,2", "--out", str(tmp_path / "p")],
               2)
    assert "--speculative-tokens sets the vLLM servers a profile times: add --engine vllm" in err
    for bad in ("0,x", "0,2,2", "0,17"):
        err = _err(capsys, ["profile", "--engine", "vllm", "--speculative-tokens", bad,
                            "--vllm-venv", str(tmp_path / "none"), "--out", str(tmp_path / "p")], 2)
        assert "--speculative-tokens: " in err and "give distinct ks from 0 to 16" in err
    err = _err(capsys, ["record", "--engine", "vllm", "--drafter", "eagle",
                        "--out", str(tmp_path / "r")], 2)
    assert "--engine vllm records the n-gram drafter" in err
    err = _err(capsys, ["record", "--engine", "vllm", "--vllm-venv", str(tmp_path / "none"),
                        "--out", str(tmp_path / "r")], 2)
    assert "scripts/vllm_env.sh" in err
    err = _err(capsys, ["validate", "--measured", str(tmp_path), "--out", str(tmp_path / "v")], 2)
    assert "--measured reads back runs of --engine vllm" in err
    err = _err(capsys, ["validate", "--calibrate", "--out", str(tmp_path / "v")], 2)
    assert "--calibrate serves vLLM calibration windows (--engine vllm)" in err
    err = _err(capsys, ["validate", "--engine", "vllm", "--profile", "vllm-cpu-smollm2",
                        "--measured", str(tmp_path / "none"), "--out", str(tmp_path / "v")], 2)
    assert "no such folder" in err


def test_a_vllm_profile_times_the_ks_given_in_order():
    from spectune.profile import VLLM_KS, ProfileSpec

    assert ProfileSpec(engine="vllm").vllm_ks() == VLLM_KS == (0, 2, 4, 6)
    assert ProfileSpec(engine="vllm", speculative_tokens=" 1, 3,0").vllm_ks() == (1, 3, 0)

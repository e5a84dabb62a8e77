"""`spectune simulate` as a user runs it: defaults, JSON keys, outputs, and bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from spectune.cli import main

SMALL = ["--requests", "150"]


def _json(capsys, argv):
    assert main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_without_options_runs_the_embedded_default(capsys):
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "Azure" in out and "roofline" in out
    for label in ("TTFT", "TPOT", "E2E", "mean emitted per step"):
        assert label in out


def test_no_arguments_print_the_help_and_where_to_start(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "start here:" in out and "spectune tune" in out and "usage: spectune" in out
    assert "TTFT" not in out  # no simulation the user did not ask for


def test_json_summary_has_the_documented_keys(capsys):
    s = _json(capsys, ["simulate", *SMALL])
    for key in ("requests", "duration_s", "throughput_tokens_per_s", "mean_emitted_per_step",
                "mean_k"):
        assert key in s
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(s[key]) == {"mean", "p50", "p90", "p99"}
        assert 0 < s[key]["p50"] <= s[key]["p99"]
    assert s["requests"] == 150
    assert s["mean_k"] == 4


def test_out_writes_records_and_summary(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", *SMALL, "--out", str(out)]) == 0
    req = pd.read_csv(out / "requests.csv")
    steps = pd.read_csv(out / "steps.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(req) == 150 and len(steps) > 150
    assert summary["requests"] == 150
    assert not list(out.glob(".*.tmp"))


def test_same_seed_same_records_different_seed_different(tmp_path):
    def run(seed, name):
        out = tmp_path / name
        assert main(["simulate", *SMALL, "--seed", str(seed), "--out", str(out)]) == 0
        return (out / "requests.csv").read_bytes()

    assert run(1, "a") == run(1, "b")
    assert run(1, "a") != run(2, "c")


def test_synthetic_workloads_and_acceptance_forms(capsys):
    s = _json(capsys, ["simulate", "--workload", "gamma", "--rate", "3", "--cv", "3",
                       "--requests", "100", "--acceptance", "iid:0.8", "--set", "k=2"])
    assert s["requests"] == 100 and s["mean_k"] == 2
    s = _json(capsys, ["simulate", "--workload", "poisson", "--rate", "1", "--requests", "50",
                       "--lengths", "fixed:100,50", "--acceptance", "markov:0.9,0.2@40",
                       "--draft", "none", "--replicas", "2", "--router", "least-loaded"])
    assert s["requests"] == 50


def test_policies_lists_parameters(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "fixed" in out and "k (int, default 4)" in out


BAD = [
    (["--target", "llama-9000"], "unknown model 'llama-9000'"),
    (["--hardware", "tpu-v9"], "unknown GPU 'tpu-v9'"),
    (["--rate", "-1"], "--rate must be a positive"),
    (["--rate", "0"], "--rate must be a positive"),
    (["--set", "kk=3"], "has no parameter 'kk'"),
    (["--set", "k"], "--set expects KEY=VALUE"),
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--acceptance", "iid:1.7"], "iid"),
    (["--workload", "nowhere"], "unknown workload 'nowhere'"),
    (["--replicas", "0"], "replicas must be >= 1"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_input_is_one_clear_line_and_exit_2(capsys, argv, message):
    assert main(["simulate", *SMALL, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spectune: error:")
    assert message in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_bad_workload_files(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    missing = tmp_path / "missing.csv"
    missing.write_text("arrival_s,prompt_tokens\n0.0,10\n")
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n{not json\n')
    for path, message in ((empty, "empty"), (missing, "output_tokens"), (garbled, "line 2"),
                          (tmp_path / "absent.csv", "absent.csv")):
        assert main(["simulate", "--workload", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_recorded_speculation_trace_drives_acceptance(tmp_path, capsys):
    import numpy as np

    from traces import RequestSpeculation, SpeculationTrace

    # every draft accepted up to 3 in a row, then a rejection: k=3 emits 4 per step
    run = np.tile(np.array([3, 2, 1, 0], dtype=np.int32), 400)
    trace = SpeculationTrace((RequestSpeculation(run=run, key="q1"),),
                             {"drafter": "test", "parametric": False, "source": "literal"})
    path = tmp_path / "spec.npz"
    trace.save(path)
    s = _json(capsys, ["simulate", "--requests", "40", "--acceptance", str(path),
                       "--set", "k=3", "--slo-ttft", "0.5", "--slo-tpot", "0.05"])
    # from position 4 on every step starts where run is 3, so it emits 4 (less the cut at the end)
    assert 3.6 < s["mean_emitted_per_step"] <= 4.0
    assert s["inputs"]["acceptance"]["drafter"] == "test"
    assert 0.0 <= s["slo_attainment"] <= 1.0 and "goodput_tokens_per_s" in s


def test_duration_cuts_the_workload(capsys):
    s = _json(capsys, ["simulate", "--requests", "1000", "--duration", "10"])
    assert 0 < s["requests"] < 1000


def test_bad_speculation_trace_file(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    assert main(["simulate", *SMALL, "--acceptance", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.npz" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_concentration_suffix_reaches_the_trace(capsys):
    s = _json(capsys, ["simulate", *SMALL, "--acceptance", "beta:7,3~20"])
    assert s["inputs"]["acceptance"]["position_concentration"] == 20
    assert s["inputs"]["acceptance"]["spec"] == "beta:7,3~20"


def test_json_is_strict_even_with_undefined_metrics(tmp_path, capsys):
    wl = tmp_path / "one_token.csv"
    wl.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,1\n0.5,12,1\n")
    assert main(["simulate", "--workload", str(wl), "--format", "json",
                 "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text
    s = json.loads(text)
    assert s["tpot_s"]["mean"] is None  # one-token requests have no TPOT
    json.loads((tmp_path / "o" / "summary.json").read_text(), parse_constant=_reject)


def _reject(name):
    raise AssertionError(f"non-standard JSON constant {name}")


def test_duration_alone_is_not_capped_by_the_default_request_count(capsys):
    s = _json(capsys, ["simulate", "--duration", "400"])  # azure-conv runs 5.5 req/s
    assert s["requests"] > 1500


def test_flags_without_a_subcommand_run_simulate(capsys):
    assert main(["--requests", "30"]) == 0
    assert "requests 30" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--workload", "azure-conv", "--lengths", "fixed:5,5"], "--lengths applies to"),
    (["--workload", "poisson", "--cv", "3"], "--cv applies to --workload gamma only"),
    (["--out", "/dev/null"], "exists and is not a folder"),
])
def test_options_that_do_not_apply_are_errors(capsys, argv, message):
    assert main(["simulate", *SMALL, *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_trace_capped_below_k_max_is_refused(tmp_path, capsys):
    import numpy as np

    from traces import parametric_trace

    trace = parametric_trace("iid:0.95", np.full(5, 100), np.random.default_rng(0), max_run=3)
    trace.save(tmp_path / "capped.npz")
    assert main(["simulate", *SMALL, "--acceptance", str(tmp_path / "capped.npz"),
                 "--set", "k=3"]) == 2
    assert "caps accepted runs at 3" in capsys.readouterr().err


def test_shipped_recorded_traces_drive_acceptance(capsys):
    s = _json(capsys, ["simulate", *SMALL, "--acceptance", "smollm2-ngram"])
    acc = s["inputs"]["acceptance"]
    assert acc["drafter"] == "ngram" and not acc.get("parametric")
    assert "SmolLM2" in acc["target"]
    # a weak real drafter: well below the parametric default's ~2.6 tokens per step
    emitted = s["mean_emitted_per_step"]
    assert emitted > 1.0 and emitted < 2.0

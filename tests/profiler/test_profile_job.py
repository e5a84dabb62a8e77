"""`spectune profile` end to end on CPU: the quick grid, the summary, resume, bad input."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from spectune.cli import main  # noqa: E402

TINY = ["--batch-sizes", "1,2,3", "--query-tokens", "1,2,3", "--context-tokens", "8,16,24",
        "--prompt-tokens", "4,8,12", "--prefill-batch-sizes", "1,2", "--ragged", "4",
        "--repeats", "2", "--target", "Llama-68M", "--draft", "none"]

KEYS = ("heldout_median_abs_pct_error", "heldout_p90_abs_pct_error",
        "ragged_median_abs_pct_error", "ragged_p90_abs_pct_error", "device", "rows")


def test_quick_profile_reports_its_errors_and_simulate_uses_it(tmp_path, capsys):
    out = tmp_path / "quick"
    assert main(["profile", "--quick", "--out", str(out), "--format", "json"]) == 0
    s = json.loads(capsys.readouterr().out)
    for key in KEYS:
        assert s[key] is not None, key
    # QUICK_GRID: target 6 prefill + 36 decode/verify; draft 6 prefill + 9 draft + 27 catchup
    assert s["rows"] == 84 and s["ragged_batches"] == 30 and s["device"].startswith("cpu:")
    assert set(s["roofline_vs_measured"]) == {"target/prefill", "target/decode",
                                              "target/verify", "draft/prefill", "draft/draft",
                                              "draft/catchup"}
    assert (out / "latency.csv").exists() and (out / "latency.meta.json").exists()
    assert json.loads((out / "summary.json").read_text())["rows"] == 84
    # the simulator runs on the profile it just wrote
    assert main(["simulate", "--profile", str(out), "--requests", "30", "--format", "json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["inputs"]["latency_model"].startswith("profile: cpu:")
    assert sim["requests"] == 30


def test_an_interrupted_profile_keeps_its_rounds_and_resumes(tmp_path, monkeypatch, capsys):
    import profiler.sweep as sweep

    out = tmp_path / "p"
    real_save = sweep._save
    calls = {"n": 0}

    def save_then_die(*args):
        real_save(*args)
        calls["n"] += 1
        raise KeyboardInterrupt  # as if the run were stopped after its first round

    monkeypatch.setattr(sweep, "_save", save_then_die)
    assert main(["profile", *TINY, "--out", str(out)]) == 130  # Ctrl-C: one line, exit 130
    assert capsys.readouterr().err.strip() == (
        f"interrupted; the finished rounds are kept in {out}: rerun the same command to resume")
    first = json.loads((out / "samples.json").read_text())["samples"]
    assert all(len(s) == 1 for s in first)
    monkeypatch.setattr(sweep, "_save", real_save)
    assert main(["profile", *TINY, "--out", str(out), "--format", "json"]) == 0
    done = json.loads((out / "samples.json").read_text())["samples"]
    assert all(len(s) == 2 for s in done)
    assert [s[0] for s in done] == [s[0] for s in first]  # the first round was kept, not redone
    # a rerun with other settings is refused rather than mixed in
    assert main(["profile", *TINY[:-4], "--target", "SmolLM2-135M-EE4", "--draft", "none",
                 "--out", str(out)]) == 2
    assert "other settings" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--target", "gpt-17"], "unknown model 'gpt-17'"),
    (["--batch-sizes", "0,2"], "batch_sizes has [0]"),
    (["--context-tokens", "-4"], "context_tokens has [-4]"),
    (["--query-tokens", "a,b"], "expects integers"),
    (["--batch-sizes", "4096", "--context-tokens", "100000"], "shrink the grid"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"], "device"),
    (["--dtype", "fp8"], "--dtype must be one of"),
])
def test_bad_input_is_one_clear_line(tmp_path, capsys, argv, message):
    assert main(["profile", *TINY, *argv, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1

"""Before a run that cannot fit, one line with the estimate: an error where the request records
cannot fit, a note where the step records (steps.csv) may not; without --out, no step records
are kept at all."""

from __future__ import annotations

import json

from spectune.cli import main
from traces import parametric

RUN = ["simulate", "--workload", "poisson", "--requests", "200", "--acceptance", "iid:0.7"]


def test_records_that_cannot_fit_are_refused_with_the_estimate(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(parametric, "available_memory_bytes", lambda: 10_000)
    assert main([*RUN, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "200 requests need about 0.0 GiB, and this machine has 0.0 GiB available" in err


def test_step_records_that_may_not_fit_get_a_note_and_no_steps_skips_them(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(parametric, "available_memory_bytes", lambda: 1_000_000)
    assert main([*RUN, "--format", "json", "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert "spectune: note: the step records of 200 requests (steps.csv) may need up to" \
        in captured.err and "--no-steps skips them" in captured.err
    assert (tmp_path / "a" / "steps.csv").is_file()
    assert main([*RUN, "--format", "json", "--no-steps", "--out", str(tmp_path / "b")]) == 0
    captured_b = capsys.readouterr()
    assert "note" not in captured_b.err and not (tmp_path / "b" / "steps.csv").exists()
    # the same summary with or without the step records
    assert json.loads(captured_b.out)["iterations"] == json.loads(captured.out)["iterations"]
    summary = {k: v for k, v in json.loads(captured_b.out).items() if k != "inputs"}
    assert summary == {k: v for k, v in json.loads(captured.out).items() if k != "inputs"}

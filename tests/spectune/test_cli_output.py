"""What the user reads: each job's help shows its own defaults, tables never cut a policy's
parameters or run cells together, and a plan with no capacity says why."""

from __future__ import annotations

import re

import pytest

from spectune.cli import main


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps: compare unwrapped


def test_each_job_shows_its_own_defaults(capsys):
    tune = _help(capsys, "tune")
    assert "default: none, n-gram lookup" in tune and "Llama-68M" not in tune
    assert "(default: smollm2-ngram)" in tune and "beta:7,3)" not in tune
    assert "(default: 300 per seed" in tune and "1000" not in tune
    assert "95% confidence" in tune and "%%" not in tune
    plan = _help(capsys, "plan")
    assert "(default: smollm2-ngram)" in plan and "(default: 300)" in plan
    simulate = _help(capsys, "simulate")
    assert "(default: Llama-68M)" in simulate and "(default: beta:7,3)" in simulate
    assert "(default: 1000, unless --duration is set)" in simulate


def test_plan_assumes_no_slo(tmp_path, capsys):
    assert main(["plan", "--requests", "20", "--out", str(tmp_path)]) == 2
    assert "plan needs an SLO" in capsys.readouterr().err


def _tune_result(label: str, low: float | None, high: float | None, unit: str = "s") -> dict:
    rec = {"rate": 4.0, "label": label, "policy": label.split("(")[0], "params": {},
           "objective": 1002.0 if unit == "tok/s" else 0.5885, "ci_low": low, "ci_high": high,
           "ci_method": "log-normal (modified Cox) over seeds" if low is not None
           else "no interval (1 seed)", "baseline": {"objective": 1.0}}
    fixed = dict(rec, label="fixed(k=10)", params={"k": 10}, objective=0.6)
    meta = {"unit": unit, "slo": {}, "workload": "w", "latency_model": "l", "acceptance": "a",
            "objective": "mean-e2e", "objective_metric": "e2e_mean_s", "direction": "min",
            "seeds": [0, 1, 2] if low is not None else [0], "spec": {"search": "halving"},
            "simulations": 10, "reused_from_cache": 0, "wall_s": 1.0}
    return {"meta": meta, "recommendations": [rec], "best_fixed": [fixed]}


def test_tune_table_keeps_every_parameter_and_separates_cells():
    from spectune.tune_cli import format_table

    label = "goodput(ema_keep=0.6102, k0_bonus=1.165, per_request=True, estimate=censored)"
    text = format_table(_tune_result(label, 853.0, 1150.0, unit="tok/s"))
    assert f"recommended: {label}" in text
    assert re.search(r"1,002 tok/s\s+\[853 tok/s, 1,150 tok/s\]\s", text)
    one = format_table(_tune_result("fixed(k=4)", None, None))
    assert "no interval (1 seed)" in one and "1 seed," in one and "1 seeds" not in one


def test_tune_table_prices_the_engine_configs_table_and_says_what_they_cannot_hold():
    from spectune.tune_cli import format_table

    result = _tune_result("auto()", 0.5, 0.7)
    result["engine_table"] = {"schedule": [[1, 4, 3], [5, 128, 1]], "rates": [
        {"rate": 4.0, "objective": 0.6003, "worse_than_recommended_pct": 2.0}]}
    text = format_table(result)
    assert "engine configs' table (batch size: k): 1-4: k=3, 5-128: k=1" in text
    assert re.search(r"\n\s+4\s+600\.3 ms\s+\+2\.0%\n", text)
    assert "at 4 req/s the recommendation, auto(), changes k while serving" in text
    fixed = _tune_result("fixed(k=4)", 0.5, 0.7)
    fixed["engine_table"] = result["engine_table"]
    assert "engine configs' table" in format_table(fixed)
    assert "no engine's config can hold" not in format_table(fixed)
    assert "engine configs' table" not in format_table(_tune_result("fixed(k=4)", 0.5, 0.7))


def test_plan_without_capacity_says_why(tmp_path, capsys):
    argv = ["plan", "--slo-ttft", "0.000001", "--policies", "fixed:k=0", "--hardware-options",
            "H100-SXM", "--requests", "20", "--jobs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "no capacity: even at the lowest rate tried" in out
    assert re.search(r"p99 TTFT is [\d.]+ ms > the SLO of 1.0 us", out)
    assert main([*argv, "--format", "json"]) == 0
    import json

    plan = json.loads(capsys.readouterr().out)["plans"][0]
    assert plan["max_rate_per_replica"] is None and "p99 TTFT" in plan["why_no_capacity"]


def test_plan_table_keeps_the_whole_policy_label(tmp_path, capsys):
    label = "goodput:ema_keep=0.6102:k0_bonus=1.165:per_request=true"
    argv = ["plan", "--slo-ttft", "2", "--slo-tpot", "0.05", "--policies", label,
            "--hardware-options", "H100-SXM", "--requests", "20", "--jobs", "1",
            "--tolerance", "0.2", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "goodput(ema_keep=0.6102, k0_bonus=1.165, per_request=True)\n    H100-SXM" in out

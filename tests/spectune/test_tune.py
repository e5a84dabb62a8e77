"""`spectune tune` and `plan`: the search (candidates from the policies' metadata, successive
halving against an exhaustive grid), the job end to end on a small scenario (recommendation =
best over every seed, resume from the cache, exports, JSON output), plan's maximum rate checked
at 0.95x and 1.05x, and bad input as one-line errors."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from policies import parameters
from simulator import ConfigError, SchedulerConfig
from spectune.cli import main
from spectune.plan import PlanSpec, run_plan
from spectune.search import (
    Candidate,
    candidates,
    confidence_interval,
    exhaustive_grid,
    mean_score,
    successive_halving,
)
from spectune.simulate import SimulationSpec
from spectune.tune import BASELINE, TuneSpec, run_tune
from traces import builtin_workload

SCENARIO = SimulationSpec(workload="poisson", requests=80, lengths="fixed:200,60",
                          acceptance="beta:7,3", draft="none")
SMALL = TuneSpec(rates=(5.0, 60.0), policies="fixed,goodput", seeds=2, points=2, jobs=1,
                 samples=True)


# -- search ---------------------------------------------------------------------------------------


def test_candidates_come_from_the_declared_grids_and_bounds():
    fixed = candidates("fixed")
    assert [c.params_dict["k"] for c in fixed] == [0, 1, 2, 3, 4, 5, 6, 8, 10]
    goodput = candidates("goodput", continuous_points=4)
    assert len(goodput) == 2 * 4  # per_request grid x 4 Sobol points over (ema_keep, k0_bonus)
    bounds = {p.name: p.bounds for p in parameters("goodput") if p.bounds}
    for c in goodput:
        for name, (lo, hi) in bounds.items():
            assert lo <= c.params_dict[name] <= hi
    pinned = candidates("goodput", {"per_request": True}, continuous_points=4)
    assert len(pinned) == 4 and all(c.params_dict["per_request"] is True for c in pinned)
    assert len(exhaustive_grid("goodput", points_per_bound=3)) == 2 * 3 * 3
    assert candidates("oracle") == [Candidate("oracle", ())]  # nothing searched: defaults


def test_successive_halving_finds_the_grid_optimum_with_fewer_evaluations():
    """A smooth bowl with noise per seed: halving must land within 2% of the exhaustive grid's
    best mean, spending fewer evaluations."""
    calls = []

    def evaluate(pairs):
        calls.extend(pairs)
        out = []
        for c, seed in pairs:
            p = c.params_dict
            bowl = (p["ema_keep"] - 0.8) ** 2 + 4 * (p["k0_bonus"] - 1.12) ** 2
            out.append(1.0 + bowl + (0.5 if p["per_request"] else 0) + 0.002 * seed)
        return out

    seeds = [0, 1, 2]
    tuned = successive_halving(candidates("goodput", continuous_points=8), seeds, evaluate)
    n_tuned = len(calls)
    calls.clear()
    grid = exhaustive_grid("goodput", points_per_bound=7)
    scores = dict(zip(grid, [evaluate([(c, s) for s in seeds]) for c in grid]))
    best_grid = min(mean_score(scores, c) for c in grid)
    full = {c: v for c, v in tuned.items() if len(v) == 3}
    best_tuned = min(mean_score(full, c) for c in full)
    assert best_tuned <= best_grid * 1.02
    assert n_tuned < len(calls)


def test_confidence_interval():
    assert confidence_interval([2.0]) == (2.0, 2.0)
    low, high = confidence_interval([1.0, 2.0, 3.0])
    assert low == pytest.approx(2.0 - 4.302653 / math.sqrt(3)) and high > 2.0  # t(0.975, 2)


def test_registry_checks_search_metadata():
    from policies import Policy, register

    with pytest.raises(TypeError, match="bounds"):
        @register
        @dataclass
        class Bad(Policy):
            name = "bad-bounds"
            x: float = field(default=1.0, metadata={"bounds": (2.0, 1.0)})


def test_workload_window_wraps_and_keeps_arrivals_increasing():
    trace = builtin_workload("azure-code")
    window = trace.window(len(trace) - 10, 30)
    assert len(window) == 30 and len(set(window.request_ids)) == 30
    assert np.all(np.diff(window.arrival_s) >= 0) and "wrapped" in window.source
    assert trace.window(5, 3).request_ids.tolist() == trace.request_ids[5:8].tolist()


# -- the tune job ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune")
    return run_tune(SMALL, SCENARIO, SchedulerConfig(), out), out


def test_recommendation_is_the_best_over_every_seed(tuned):
    result, _ = tuned
    assert [r["rate"] for r in result["recommendations"]] == [5.0, 60.0]
    for rec in result["recommendations"]:
        rows = [r for r in result["candidates"] if r["rate"] == rec["rate"] and r["seeds"] == 2]
        assert rec["objective"] == min(r["objective"] for r in rows)
        assert rec["ci_low"] <= rec["objective"] <= rec["ci_high"]
        assert rec["baseline"]["label"] == BASELINE.label
        assert rec["objective"] <= rec["baseline"]["objective"]  # k=0 is always a candidate
        assert rec["metrics"]["e2e_mean_s"] == pytest.approx(rec["objective"])
    low, high = (r["rate"] for r in result["best_fixed"])
    assert low == 5.0 and high == 60.0


def test_tune_writes_samples_exports_and_resumes(tuned):
    result, out = tuned
    saved = json.loads((out / "tune.json").read_text())
    assert saved["recommendations"] == json.loads(json.dumps(result["recommendations"]))
    for sample in saved["samples"]:
        k_trace = (out / sample["k_trace_csv"]).read_text().splitlines()
        assert k_trace[0] == "time_s,request_id,k" and len(k_trace) > 10
    assert saved["exports"] and all((out / p).is_file() for p in saved["exports"].values())
    again = run_tune(SMALL, SCENARIO, SchedulerConfig(), out)
    assert again["meta"]["reused_from_cache"] == again["meta"]["simulations"] > 20
    assert again["recommendations"] == result["recommendations"]


def test_cli_json_and_bad_input(tmp_path, capsys):
    args = ["tune", "--workload", "poisson", "--requests", "40", "--lengths", "fixed:100,30",
            "--acceptance", "iid:0.7", "--rates", "4", "--policies", "fixed", "--seeds", "1",
            "--jobs", "1", "--no-samples", "--format", "json", "--out", str(tmp_path / "t")]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["recommendations"][0]) == {"rate", "policy", "params", "objective",
                                                  "ci_low", "ci_high"}
    assert printed["report"].endswith("report.html")
    for bad, message in ((["--objective", "goodput-under-slo"], "needs an SLO"),
                         (["--policies", "oracle"], "simulation only"),
                         (["--policies", "nope"], "unknown policy"),
                         (["--rates", "0"], "positive")):
        assert main([*args[:-2], *bad, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


# -- plan -----------------------------------------------------------------------------------------


def test_plan_max_rate_is_met_below_and_missed_above(tmp_path):
    scenario = SimulationSpec(workload="poisson", requests=150, lengths="fixed:400,80",
                              acceptance="beta:7,3", draft="none", slo_ttft=0.5, slo_tpot=0.02)
    spec = PlanSpec(policies="fixed:k=0,fixed:k=3", hardware_options="H100-SXM,A100-80GB",
                    target_rate=200.0, prices="H100-SXM=3.5", jobs=1)
    result = run_plan(spec, scenario, SchedulerConfig(), tmp_path)
    assert len(result["plans"]) == 4
    for p in result["plans"]:
        rate = p["max_rate_per_replica"]
        assert rate and rate > 1
        assert p["checks"]["below"]["slo_attainment"] >= 0.99 > p["checks"]["above"][
            "slo_attainment"], p
        assert p["replicas_needed"] == math.ceil(200.0 / rate)
        assert (p["cost_per_hour"] is None) == (p["hardware"] != "H100-SXM")
    h100 = {p["label"]: p["max_rate_per_replica"] for p in result["plans"]
            if p["hardware"] == "H100-SXM"}
    a100 = {p["label"]: p["max_rate_per_replica"] for p in result["plans"]
            if p["hardware"] == "A100-80GB"}
    assert all(h100[k] > a100[k] for k in h100)  # the faster GPU sustains more
    assert json.loads((tmp_path / "plan.json").read_text())["kind"] == "plan"
    with pytest.raises(ConfigError, match="SLO"):
        run_plan(spec, SimulationSpec(), SchedulerConfig(), None)
    with pytest.raises(ConfigError, match="prices"):
        PlanSpec(prices="H100-SXM")


def test_plan_from_tune_reads_its_scenario_and_recommendations(tuned, tmp_path):
    from spectune.plan import from_tune

    result, out = tuned
    slos = SimulationSpec(slo_ttft=0.5, slo_tpot=0.02)
    scenario, scheduler, policies = from_tune(out, slos)
    assert (scenario.workload, scenario.requests, scenario.acceptance) == (
        SCENARIO.workload, SCENARIO.requests, SCENARIO.acceptance)
    assert (scenario.slo_ttft, scenario.slo_tpot) == (0.5, 0.02)
    assert scheduler == SchedulerConfig()
    labels = policies.split(",")
    assert labels[0] == "fixed:k=0" and len(labels) == len(set(labels))
    from spectune.plan import _candidates

    planned = {(c.policy, c.params) for c in _candidates(policies)}
    for rec in result["recommendations"] + result["best_fixed"]:  # parsed back exactly
        assert (rec["policy"], tuple(sorted(rec["params"].items()))) in planned
    with pytest.raises(ConfigError, match="not a folder written by spectune tune"):
        from_tune(tmp_path, slos)

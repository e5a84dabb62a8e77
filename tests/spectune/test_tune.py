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


def test_searches_run_together_find_what_each_finds_alone_in_fewer_rounds():
    """Two searches as steps, run side by side: each sees the values it would alone, so each
    finds the same scores; their pairs go out together, in as many rounds as the longer one
    takes alone, not the sum."""
    from spectune.search import halving_steps, run_together, successive_halving

    def bowl(c, seed):
        p = c.params_dict
        return (1.0 + (p["ema_keep"] - 0.8) ** 2 + 4 * (p["k0_bonus"] - 1.12) ** 2
                + (0.5 if p["per_request"] else 0) + 0.002 * seed)

    def valley(c, seed):
        return abs(c.params_dict["k"] - 5) + 0.01 * seed

    goodput, fixed = candidates("goodput", continuous_points=8), candidates("fixed")
    alone, rounds_alone = [], []
    for cands, f in ((goodput, bowl), (fixed, valley)):
        rounds = []

        def evaluate(pairs, f=f, rounds=rounds):
            rounds.append(len(pairs))
            return [f(c, s) for c, s in pairs]

        alone.append(successive_halving(cands, [0, 1, 2], evaluate))
        rounds_alone.append(len(rounds))
    batches = []

    def evaluate_both(batch):
        batches.append(sorted(i for i, _ in batch))
        return [[(bowl if i == 0 else valley)(c, s) for c, s in pairs] for i, pairs in batch]

    said = []
    together = run_together([halving_steps(goodput, [0, 1, 2]), halving_steps(fixed, [0, 1, 2])],
                            evaluate_both, said.append)
    assert together == alone
    assert [list(t) for t in together] == [list(a) for a in alone]  # insertion order too
    assert len(batches) == max(rounds_alone) < sum(rounds_alone)
    assert batches[0] == [0, 1]  # both searches' first pairs in one batch
    assert said[:2] == [0, 1]  # each search's first step announced before it runs


def test_a_batch_that_asks_for_a_task_twice_simulates_it_once(tmp_path, monkeypatch):
    """Searches run together can ask for the same simulation in one batch (k = 0 is fixed's
    grid point and the baseline): it runs once, and the counts are those of asking in turn:
    from the cache where there is one, else simulated again."""
    import spectune.evaluate as ev
    from spectune.evaluate import Runner, Task

    calls = []
    real = ev.evaluate

    def counted(task, keep_records=False):
        calls.append(task.key())
        return real(task, keep_records)

    monkeypatch.setattr(ev, "evaluate", counted)
    spec = SimulationSpec(workload="poisson", requests=20, lengths="fixed:50,20",
                          acceptance="iid:0.6", draft="none")
    one, two = (Task(spec, SchedulerConfig(), BASELINE, 4.0, s) for s in (0, 1))
    for cache in (tmp_path / "evals", None):
        calls.clear()
        with Runner(cache, jobs=1) as runner:
            out = runner.run([one, two, one])
        assert calls == [one.key(), two.key()] and out[0] == out[2]
        assert (runner.total, runner.done) == (3, 3)
        assert runner.cached == (1 if cache is not None else 0)
    monkeypatch.undo()  # (the workers take the module's own evaluate)
    with Runner(None, jobs=2) as runner:  # over the worker pool: the same answers and counts
        pooled = runner.run([one, two, one])
    assert pooled == out and (runner.total, runner.done, runner.cached) == (3, 3, 0)


def test_searches_run_together_say_their_notes_in_the_searches_order():
    """What each search notes while they run side by side comes out as if they had run one
    after another: all of the first search's notes, then the second's."""
    from spectune.search import seeds_steps
    from spectune.tune import _Search

    class Runner:  # every simulation's metrics: its seed
        def run(self, tasks):
            return [{"seed": t.seed} for t in tasks]

    class Objective:
        def score(self, metrics):
            return float(metrics["seed"])

    search = _Search.__new__(_Search)
    search.scenario, search.scheduler, search.k_max_given, search.k_limit = (
        SCENARIO, SchedulerConfig(), True, 64)
    search.runner, search.objective, search.seeds = Runner(), Objective(), [0, 1]
    search.metrics, search.notes, search._said, search._saying = {}, {}, None, 0

    def noting(first: str, then: str, rounds: int, rate: float):
        search.note(first, rate)
        scores = {}
        for r in range(rounds):
            yield from seeds_steps(scores, [Candidate("fixed", (("k", r),))], [0, 1])
        search.note(then, rate)
        return scores

    found = search.together([(1.0, noting("a", "c", 2, 1.0)), (2.0, noting("b", "d", 1, 2.0))])
    assert list(search.notes) == ["a", "c", "b", "d"]
    assert search.notes["a"] == [1.0] and search.notes["d"] == [2.0]
    assert [list(f) for f in found] == [[Candidate("fixed", (("k", 0),)),
                                         Candidate("fixed", (("k", 1),))],
                                        [Candidate("fixed", (("k", 0),))]]
    assert search.metrics[(1.0, Candidate("fixed", (("k", 1),)))] == {0: {"seed": 0},
                                                                       1: {"seed": 1}}
    search.note("after", 1.0)  # said directly once the searches are done
    assert list(search.notes)[-1] == "after"


def test_confidence_interval_is_log_normal_and_never_below_zero():
    one = confidence_interval([2.0])
    assert (one.low, one.high) == (None, None) and one.method == "no interval (1 seed)"
    ci = confidence_interval([1.0, 2.0, 3.0])
    y = np.log([1.0, 2.0, 3.0])  # modified Cox: exp(ybar + s2/2 +- t sqrt(s2/n + s2^2/(2(n-1))))
    half = 4.302653 * math.sqrt(y.var(ddof=1) / 3 + y.var(ddof=1) ** 2 / 4)
    assert ci.low == pytest.approx(math.exp(y.mean() + y.var(ddof=1) / 2 - half))
    assert ci.high == pytest.approx(math.exp(y.mean() + y.var(ddof=1) / 2 + half))
    assert "log-normal" in ci.method
    # the skewed pair that gave [-15.3 ms, 2.974 s] under Student-t: positive now
    skewed = confidence_interval([0.1, 1.4])
    assert 0 < skewed.low < 0.1 and skewed.high > 1.4
    zero = confidence_interval([0.0, 50.0, 100.0])  # a goodput of 0: Student-t, clipped at 0
    assert zero.low == 0.0 and zero.high > 50.0 and "clipped" in zero.method
    assert confidence_interval([1.0, math.inf]).low is None


def test_seconds_keep_their_sign_and_unit():
    from spectune.tune_cli import _value

    assert _value(-1.6601, "s") == "-1.660 s"
    assert _value(-0.0153, "s") == "-15.3 ms"
    assert _value(0.5, "s") == "500.0 ms"
    assert _value(2e-6, "s") == "2.0 us" and _value(None, "s") == "-"
    assert _value(-1002.4, "tok/s") == "-1,002 tok/s"


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


def test_the_engine_configs_table_is_priced_as_a_candidate_at_every_rate(tmp_path):
    """The table the exports hold runs on the tune's seeds at every rate, as a user's table
    pinned by hand would (the same cache entries), and the recommendation is the best over
    every candidate, that table included: here it wins under load. A table of one k is that
    fixed k, not simulated again."""
    import dataclasses
    import shutil

    scenario = dataclasses.replace(SCENARIO, acceptance="iid:0.5")
    spec = dataclasses.replace(SMALL, rates=(5.0, 150.0), samples=False)
    result = run_tune(spec, scenario, SchedulerConfig(), tmp_path / "t")
    table = result["engine_table"]
    assert len(table["schedule"]) == 2 and table["label"].startswith("batch_adaptive(")
    vllm = json.loads((tmp_path / "t" / "exports" / "vllm_speculative_config.json").read_text())
    assert vllm["speculative_config"]["num_speculative_tokens_per_batch_size"] == \
        table["schedule"]
    assert vllm["_spectune"]["source"].endswith(", ".join(  # what it was simulated to give
        f"{r['objective']:.4g} s at {r['rate']:g} req/s "
        f"({abs(r['worse_than_recommended_pct']):.1f}% "
        f"{'worse' if r['worse_than_recommended_pct'] > 0 else 'better'} than the "
        "recommendation)" for r in table["rates"]))
    assert [r["rate"] for r in table["rates"]] == [5.0, 150.0]
    for row, rec in zip(table["rates"], result["recommendations"]):
        assert row["label"] == table["label"] and row["seeds"] == 2
        assert row in [dict(c, worse_than_recommended_pct=row["worse_than_recommended_pct"])
                       for c in result["candidates"]]
        assert row["objective"] == pytest.approx(np.mean(row["per_seed"]))
        assert row["worse_than_recommended_pct"] == pytest.approx(
            (row["objective"] / rec["objective"] - 1) * 100)
        assert rec["objective"] <= row["objective"]
    assert result["recommendations"][1]["label"] == table["label"]
    shutil.copytree(tmp_path / "t" / "evals", tmp_path / "p" / "evals")
    pinned = run_tune(dataclasses.replace(spec, policies="batch_adaptive:schedule=" + json.dumps(
        table["schedule"], separators=(",", ":"))), scenario, SchedulerConfig(), tmp_path / "p")
    assert pinned["meta"]["reused_from_cache"] == pinned["meta"]["simulations"]
    assert [r["objective"] for r in pinned["recommendations"] if r["label"] == table["label"]
            ] == [r["objective"] for r in table["rates"]]
    from spectune.plan import _candidates, from_tune  # plan reads the table back exactly

    planned = _candidates(from_tune(tmp_path / "t", SimulationSpec(slo_ttft=1.0))[2])
    assert Candidate("batch_adaptive", (("schedule", table["label"][len(
        "batch_adaptive(schedule="):-1]),)) in planned
    # a table of one k is that fixed k, run on every seed by the search: not simulated again
    one = run_tune(dataclasses.replace(spec, rates=(5.0,)), scenario, SchedulerConfig(), None)
    (row,) = one["engine_table"]["rates"]
    (best,) = one["best_fixed"]
    assert one["engine_table"]["schedule"] == [[1, 256, best["params"]["k"]]]
    assert row["label"] == best["label"] and row["per_seed"] == best["per_seed"]
    assert not any(c["policy"] == "batch_adaptive" for c in one["candidates"])


def test_the_engine_tables_shortfall_reads_the_objectives_direction():
    from spectune.tune import against, worse_pct

    assert worse_pct(1.1, 1.0, "min") == pytest.approx(10.0)  # 10% slower
    assert worse_pct(90.0, 100.0, "max") == pytest.approx(10.0)  # 10% less goodput
    assert worse_pct(110.0, 100.0, "max") == pytest.approx(-10.0)
    assert worse_pct(5.0, 0.0, "max") is None and worse_pct(math.inf, 1.0, "min") is None
    assert against(10.0) == "10.0% worse than the recommendation"
    assert against(-2.5) == "2.5% better than the recommendation"
    assert "no ratio" in against(None)


def test_without_fixed_in_policies_no_table_of_k0_is_exported(tmp_path):
    """The table is built from the best fixed k per rate: with no fixed k searched it would be
    plain decoding's k = 0 everywhere, so neither it nor the exports are written, and a note
    says why."""
    spec = TuneSpec(rates=(5.0,), policies="goodput", seeds=1, points=1, jobs=1, samples=False)
    result = run_tune(spec, SCENARIO, SchedulerConfig(), tmp_path)
    assert result["engine_table"] is None and result["exports"] == {}
    assert not (tmp_path / "exports").exists()
    assert any("no engine configs written" in n for n in result["notes"])
    assert result["best_fixed"][0]["label"] == BASELINE.label  # plan still reads it


def test_a_rate_given_twice_is_refused():
    with pytest.raises(ConfigError, match="twice"):
        TuneSpec(rates=(4.0, 4.0))


def test_a_pinned_tables_largest_k_past_an_unset_k_max_raises_it():
    from spectune.tune import scheduler_for

    table = Candidate("batch_adaptive", (("schedule", "[[1,4,16],[5,128,2]]"),))
    assert scheduler_for(SchedulerConfig(), table, k_max_given=False).k_max == 16
    assert scheduler_for(SchedulerConfig(), table, k_max_given=True).k_max == 10
    low = Candidate("batch_adaptive", (("schedule", "[[1,128,3]]"),))
    assert scheduler_for(SchedulerConfig(), low, k_max_given=False).k_max == 10


def test_samples_written_by_the_workers_are_those_written_in_turn(tuned, tmp_path):
    """With two local workers the samples are simulated in the pool, and are the same files."""
    import dataclasses
    import shutil

    result, out = tuned
    shutil.copytree(out / "evals", tmp_path / "evals")  # the search from the cache: samples only
    pooled = run_tune(dataclasses.replace(SMALL, jobs=2), SCENARIO, SchedulerConfig(), tmp_path)
    assert pooled["samples"] == result["samples"] and len(result["samples"]) >= 3
    for sample in result["samples"]:
        for key in ("requests_csv", "k_trace_csv", "drafts_csv"):
            assert (tmp_path / sample[key]).read_bytes() == (out / sample[key]).read_bytes()


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
    scenario, scheduler, policies, k_max_given = from_tune(out, slos)
    assert k_max_given  # run_tune's default: the scheduler's k_max was the caller's
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


# -- the edge of the search space -------------------------------------------------------------


def _fixed_tune(acceptance: str, k_max_given: bool) -> dict:
    scenario = SimulationSpec(workload="poisson", requests=40, lengths="fixed:100,200",
                              acceptance=acceptance, draft="none")
    spec = TuneSpec(rates=(2.0,), policies="fixed", seeds=2, points=2, jobs=1, samples=False)
    return run_tune(spec, scenario, SchedulerConfig(), None, k_max_given=k_max_given)


def test_a_best_k_on_the_grids_top_extends_the_search_to_the_stated_cap():
    """Free drafting at 99% acceptance: every longer k is better, so the search runs past the
    grid's top (10) to fixed's hard cap (32) and says the optimum may lie beyond it."""
    result = _fixed_tune("iid:0.99", k_max_given=False)
    tried = sorted(c["params"]["k"] for c in result["candidates"] if c["policy"] == "fixed")
    assert tried[-4:] == [12, 16, 24, 32]
    rec = result["recommendations"][0]
    assert rec["label"] == "fixed(k=32)" and rec["k_max"] == 32
    assert any("hard cap" in n and "may lie beyond" in n for n in result["notes"])


def test_the_users_k_max_is_not_extended_and_an_inner_optimum_is_silent():
    capped = _fixed_tune("iid:0.99", k_max_given=True)
    assert max(c["params"]["k"] for c in capped["candidates"] if c["policy"] == "fixed") == 10
    assert capped["recommendations"][0]["label"] == "fixed(k=10)" and capped["notes"] == []
    inner = _fixed_tune("iid:0.3", k_max_given=False)
    assert max(c["params"]["k"] for c in inner["candidates"] if c["policy"] == "fixed") == 10
    assert inner["recommendations"][0]["params"]["k"] < 10 and inner["notes"] == []


def test_a_continuous_parameter_on_its_bound_gets_a_note():
    from spectune.search import edge_notes

    class Search:  # what edge_notes reads of a search
        k_max_given, k_limit, scheduler = False, 64, SchedulerConfig()

    lo, hi = next(p.bounds for p in parameters("goodput") if p.name == "ema_keep")
    on_edge = Candidate("goodput", (("ema_keep", hi), ("k0_bonus", 1.15), ("per_request", False)))
    inside = Candidate("goodput", (("ema_keep", (lo + hi) / 2), ("k0_bonus", 1.15),
                                   ("per_request", False)))
    assert any("ema_keep" in n and "top" in n for n in edge_notes(on_edge, {}, Search()))
    assert edge_notes(inside, {}, Search()) == []
    assert edge_notes(on_edge, {"ema_keep": hi}, Search()) == []  # pinned by the user


def test_kld_variance_tunes_over_its_k_max_grid():
    """The README's first tune failed: the grid's k_max_cfg=4 against k_init's default 5."""
    from policies import make_policy

    assert make_policy("kld_variance", {"k_max_cfg": "4"}).k_init == 4
    assert make_policy("kld_variance").k_init == 5
    with pytest.raises(ValueError, match="k_init"):
        make_policy("kld_variance", {"k_max_cfg": "4", "k_init": "5"})
    scenario = SimulationSpec(workload="poisson", requests=30, lengths="fixed:100,40",
                              acceptance="iid:0.7~20", draft="none")
    spec = TuneSpec(rates=(4.0,), policies="kld_variance", seeds=1, points=1, jobs=1,
                    samples=False)
    result = run_tune(spec, scenario, SchedulerConfig(), None)
    assert {c["params"]["k_max_cfg"] for c in result["candidates"]
            if c["policy"] == "kld_variance"} == {4, 8, 20}


def test_a_pinned_value_that_clashes_with_a_grid_value_is_skipped_with_a_note():
    scenario = SimulationSpec(workload="poisson", requests=30, lengths="fixed:100,40",
                              acceptance="iid:0.7~20", draft="none")
    spec = TuneSpec(rates=(4.0,), policies="kld_variance:k_init=6", seeds=1, points=1, jobs=1,
                    samples=False)
    result = run_tune(spec, scenario, SchedulerConfig(), None)
    grids = {c["params"]["k_max_cfg"] for c in result["candidates"]
             if c["policy"] == "kld_variance"}
    assert grids == {8, 20}
    assert any("skipped" in n and "k_max_cfg=4" in n for n in result["notes"])


def test_plan_from_a_tune_that_went_past_k_max_plans_its_k(tmp_path, capsys):
    """The README's `plan --from-tune runs/tune` failed with "chose k=16, outside 0..k_max=10"
    after a tune that had searched fixed k past the default k_max."""
    tune = ["tune", "--workload", "poisson", "--requests", "30", "--lengths", "fixed:100,200",
            "--acceptance", "iid:0.99", "--rates", "2", "--policies", "fixed", "--seeds", "1",
            "--jobs", "1", "--no-samples", "--no-report", "--out", str(tmp_path / "t")]
    assert main(tune) == 0
    saved = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert saved["recommendations"][0]["params"]["k"] > 10
    assert saved["meta"]["k_max_given"] is False
    capsys.readouterr()
    plan = ["plan", "--from-tune", str(tmp_path / "t"), "--slo-ttft", "2", "--slo-tpot", "0.05",
            "--hardware-options", "H100-SXM", "--tolerance", "0.2", "--jobs", "1", "--format",
            "json", "--out", str(tmp_path / "p")]
    assert main(plan) == 0, capsys.readouterr().err
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert {p["params"].get("k") for p in plans} >= {0, saved["recommendations"][0]["params"]["k"]}
    assert main([*plan[:-2], "--k-max", "10", "--out", str(tmp_path / "q")]) == 2


def test_a_pinned_table_is_tuned_as_given_and_its_derivation_is_not_searched():
    """batch_adaptive with vLLM's table pinned: alpha and the other derivation parameters do
    nothing, so they are not searched (one candidate), and the table, a list, stays hashable."""
    table = "[[1,4,2],[5,128,0]]"
    assert candidates("batch_adaptive", {"schedule": table}) == [
        Candidate("batch_adaptive", (("schedule", table),))]
    assert len(candidates("batch_adaptive", continuous_points=4)) == 4  # alpha searched
    scenario = SimulationSpec(workload="poisson", requests=30, lengths="fixed:100,40",
                              acceptance="iid:0.6", draft="none")
    spec = TuneSpec(rates=(2.0,), policies=f"batch_adaptive:schedule={table}", seeds=2,
                    points=2, jobs=1, samples=False)
    result = run_tune(spec, scenario, SchedulerConfig(), None)
    (rec,) = result["recommendations"]
    assert rec["params"] == {"schedule": table}
    assert rec["label"] == f"batch_adaptive(schedule={table})"

"""`spectune report`: one self-contained HTML page from tune/plan/validate output folders.

Fixtures are small but shaped like the real files (numbers vary with load and policy); the
Chromium test opens the page headless and checks plotly really drew the charts."""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectune import charts, charts_samples, charts_speedup, report_cli
from spectune.report import ReportError, rate_charts, write_report

RATES = (4.0, 12.0, 24.0)
POLICIES = {"fixed": [{"k": 0}, {"k": 2}, {"k": 4}], "goodput": [{"k0_bonus": 1.0},
                                                                 {"k0_bonus": 1.05}]}
TUNE_TITLES = ("Latency vs arrival rate", "Speed-up over plain decoding",
               "Objective by policy and rate",
               "Draft length k over time", "Latency distributions of the sample runs")
PLAN_TITLES = ("Capacity per replica", "SLO attainment vs arrival rate")
VALIDATE_TITLES = ("Simulated vs measured",)
MB = 1 << 20


def _label(policy: str, params: dict) -> str:
    return f"{policy}({','.join(f'{k}={v:g}' for k, v in params.items())})"


def _metrics(rng: np.random.Generator, e2e: float, rate: float) -> dict:
    tpot = 0.012 + 0.0015 * rate * rng.uniform(0.8, 1.2)
    ttft = 0.08 + 0.01 * rate**1.3 * rng.uniform(0.8, 1.2)
    return {"ttft_mean_s": ttft, "ttft_p50_s": ttft * 0.8, "ttft_p99_s": ttft * 3.1,
            "tpot_mean_s": tpot, "tpot_p50_s": tpot * 0.95, "tpot_p99_s": tpot * 1.9,
            "e2e_mean_s": e2e, "e2e_p50_s": e2e * 0.85, "e2e_p99_s": e2e * 2.6,
            "throughput_tokens_per_s": rate * 210 * rng.uniform(0.95, 1.05),
            "mean_k": rng.uniform(0.5, 4), "mean_emitted_per_step": rng.uniform(1.2, 3.0),
            "mean_batch_size": rate * 1.7, "slo_attainment": min(1.0, 1.02 - rate / 200),
            "goodput_tokens_per_s": None if rate > 20 else rate * 200}


def _requests(rng: np.random.Generator, rate: float, n: int = 300) -> pd.DataFrame:
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    ttft = rng.gamma(2.0, 0.05 + rate / 400, n)
    out = rng.integers(1, 400, n)
    tpot = rng.normal(0.015 + rate / 2000, 0.003, n).clip(0.005)
    first = arrival + ttft
    return pd.DataFrame({"request_id": np.arange(n), "replica": 0, "arrival_s": arrival,
                         "admitted_s": arrival + ttft / 3, "first_token_s": first,
                         "finish_s": first + tpot * (out - 1), "prompt_tokens":
                         rng.integers(20, 2000, n), "output_tokens": out,
                         "steps": (out / 2).astype(int) + 1, "drafted": out * 2,
                         "accepted": out})


def _drafts(rng: np.random.Generator, req: pd.DataFrame, plain: bool = False) -> pd.DataFrame:
    """drafts.csv: k chosen per request per step, and fewer drafted where the drafter ran out
    of proposals (as an n-gram lookup does); all zero for plain decoding."""
    parts = []
    for r in req.itertuples():
        t = np.linspace(r.first_token_s, r.finish_s, max(int(r.steps), 2))
        k = np.clip(np.round(3 - 2 * np.sin(t / 3) + rng.normal(0, 0.6, len(t))), 0, 6)
        k = np.zeros(len(t)) if plain else k
        drafted = np.minimum(k, rng.integers(0, 7, len(t)))
        parts.append(pd.DataFrame({"time_s": t, "request_id": r.request_id, "k": k.astype(int),
                                   "drafted": drafted.astype(int),
                                   "accepted": (drafted // 2).astype(int)}))
    return pd.concat(parts, ignore_index=True)


def _candidate(rng: np.random.Generator, rate: float, policy: str, params: dict,
               e2e: float, seeds: int = 3) -> dict:
    """A candidate row as tune writes it: the mean over seeds, its interval, per-seed values."""
    per_seed = list(e2e * (1 + rng.normal(0, 0.05, seeds)))
    mean = float(np.mean(per_seed))
    half = mean * rng.uniform(0.02, 0.06) if seeds > 1 else 0.0
    return {"rate": rate, "policy": policy, "params": params, "label": _label(policy, params),
            "seeds": seeds, "objective": mean, "ci_low": mean - half, "ci_high": mean + half,
            "per_seed": per_seed, "metrics": _metrics(rng, mean, rate)}


def _write_sample(rng: np.random.Generator, folder: Path, sub: Path, rate: float,
                  plain: bool) -> dict:
    """requests.csv, k_trace.csv (k chosen) and drafts.csv (k drafted) of one sample run."""
    (folder / sub).mkdir(parents=True, exist_ok=True)
    req = _requests(rng, rate)
    drafts = _drafts(rng, req, plain)
    req["drafted"] = drafts.groupby("request_id")["drafted"].sum().reindex(req["request_id"],
                                                                           fill_value=0).values
    req.to_csv(folder / sub / "requests.csv", index=False)
    drafts[["time_s", "request_id", "k"]].to_csv(folder / sub / "k_trace.csv", index=False)
    drafts.to_csv(folder / sub / "drafts.csv", index=False)
    return {name.replace(".", "_"): str(sub / name)
            for name in ("requests.csv", "k_trace.csv", "drafts.csv")}


def make_tune(folder: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    cands, recs, samples = [], [], []
    for rate in RATES:
        rows = []
        for policy, grid in POLICIES.items():
            for params in grid:
                slower = 1.4 if params == {"k": 0} else 1.3 if policy == "fixed" else 1.0
                e2e = (0.4 + rate / 30) * slower * rng.uniform(0.9, 1.2)
                rows.append(_candidate(rng, rate, policy, params, e2e))
        # dropped by successive halving after one seed: the best-looking number, not comparable
        cands += [*rows, _candidate(rng, rate, "fixed", {"k": 6}, 0.1, seeds=1)]
        best = min(rows, key=lambda r: r["objective"])
        base = next(r for r in rows if r["label"] == "fixed(k=0)")
        recs.append({**{k: best[k] for k in ("rate", "policy", "params", "label", "objective",
                                              "ci_low", "ci_high", "metrics")},
                     "baseline": {"label": base["label"], "objective": base["objective"]}})
        for row in (best, base):
            sub = Path("samples") / f"rate{rate:g}" / row["label"].replace("=", "")
            samples.append({"rate": rate, "label": row["label"],
                            **_write_sample(rng, folder, sub, rate, row is base)})
    meta = {"workload": "azure-conv", "latency_model": "roofline H100",
            "acceptance": "parametric alpha=0.7", "objective": "mean-e2e",
            "objective_metric": "e2e_mean_s", "direction": "min", "unit": "s",
            "slo": {"ttft_s": 2.0, "tpot_s": 0.05}, "seeds": [0, 1, 2], "rates": list(RATES),
            "created": "2025-01-01T00:00:00", "wall_s": 80.1}
    _dump(folder / "tune.json", {"kind": "tune", "meta": meta, "recommendations": recs,
                                 "candidates": cands, "samples": samples,
                                 "exports": {"vllm": "exports/vllm.json"},
                                 "export_problems": {"sglang": "ngram <has no table>"},
                                 "engine_table": {"schedule": [[1, 4, 3], [5, 128, 1]],
                                                  "rates": [{"rate": 4.0, "objective": 1.234,
                                                             "worse_than_recommended_pct": 1.5}]},
                                 "notes": ["fixed k=16 is the longest run (at 4 req/s)"]})
    return folder


def make_plan(folder: Path) -> Path:
    plans, curves = [], []
    for hw, speed, price in (("H100-SXM", 1.0, 3.0), ("A100-80G", 0.6, 1.8)):
        for policy, params, gain in (("fixed", {"k": 2}, 1.2), ("goodput", {"k0_bonus": 1.05},
                                                                  1.45), ("fixed", {"k": 0}, 1.0)):
            label = _label(policy, params)
            cap = 12.0 * speed * gain
            need = int(np.ceil(50 / cap))
            plans.append({"policy": policy, "params": params, "label": label, "hardware": hw,
                          "latency_model": f"roofline {hw}", "max_rate_per_replica": cap,
                          "replicas_needed": need,
                          "cost_per_hour": need * price if hw == "H100-SXM" else None,
                          "checks": {"below": {"rate": cap * 0.95, "slo_attainment": 0.995},
                                     "above": {"rate": cap * 1.05, "slo_attainment": 0.97}}})
            for rate in np.linspace(2, 30, 8):
                att = float(1 / (1 + np.exp((rate - cap * 1.1) / 1.5)))
                curves.append({"policy": policy, "label": label, "hardware": hw, "rate": rate,
                               "slo_attainment": att, "e2e_mean_s": 0.5 + rate / 20,
                               "e2e_p99_s": 1.5 + rate / 8, "ttft_p99_s": 0.2 + rate / 50,
                               "tpot_p99_s": 0.015 + rate / 900})
    meta = {"workload": "azure-conv", "acceptance": "parametric",
            "slo": {"ttft_s": 2.0, "tpot_s": 0.05}, "attainment_target": 0.99,
            "target_rate": 50.0, "created": "2025-01-01T00:00:00", "wall_s": 60}
    _dump(folder / "plan.json", {"kind": "plan", "meta": meta, "plans": plans, "curves": curves})
    return folder


def make_validate(folder: Path) -> Path:
    rng = np.random.default_rng(3)
    rows = []
    base = {"ttft_mean_s": 0.09, "ttft_p50_s": 0.08, "ttft_p99_s": 0.3, "tpot_mean_s": 0.021,
            "tpot_p50_s": 0.02, "tpot_p99_s": 0.04, "e2e_mean_s": 4.1, "e2e_p50_s": 3.5,
            "e2e_p99_s": 9.0, "emitted_per_step": 2.1, "drafted_per_step": 3.6,
            "throughput_tokens_per_s": 180.0}
    for policy in ("fixed:k=4", "goodput"):
        for rate in (0.5, 4.0):
            for metric, v in base.items():
                measured = v * (1 + rate / 10) * rng.uniform(0.9, 1.1)
                sim = measured * (1 + rng.normal(0, 0.08))
                rows.append({"policy": policy, "rate": rate, "metric": metric,
                             "simulated": sim, "measured": measured,
                             "error_pct": (sim - measured) / measured * 100,
                             "simulated_uncorrected": sim * 0.9})
    meta = {"model": "llama-tiny", "drafter": "ngram", "profile": "profiled on cpu",
            "drift": {"corrected": True, "note": "scaled 0.98-1.03"}}
    _dump(folder / "validate.json", {"rows": rows, "meta": meta})
    return folder


def _dump(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


def _read(path: Path) -> str:
    assert path.is_file()
    assert path.stat().st_size < 10 * MB
    return path.read_text(encoding="utf-8")


def _charts(page: str) -> int:
    return page.count('class="plotly-graph-div"')


def _self_contained(page: str) -> None:
    assert page.count("plotly.js v") == 1  # the library, inlined once
    assert "<script src" not in page and "<link" not in page  # no CDN, no fonts


# -- pages per job ------------------------------------------------------------------------------


def test_tune_report(tmp_path):
    out = write_report(make_tune(tmp_path / "t"))
    assert out == tmp_path / "t" / "report.html"
    page = _read(out)
    _self_contained(page)
    assert _charts(page) == len(TUNE_TITLES)
    for title in TUNE_TITLES:
        assert title in page
    for title in PLAN_TITLES + VALIDATE_TITLES:
        assert title not in page
    assert "Recommendations per arrival rate" in page
    assert "SLO TTFT 2 s" in page and "SLO TPOT 0.05 s" in page  # the SLO lines
    assert "azure-conv" in page and "roofline H100" in page  # where the numbers come from
    assert "exports/vllm.json" in page
    assert "sglang: ngram &lt;has no table&gt;" in page  # why an engine got no file, escaped
    assert "(1-4: k=3, 5-128: k=1)" in page and "4 req/s: 1.234 s (1.5% worse than" in page
    assert "<li>fixed k=16 is the longest run (at 4 req/s)</li>" in page  # the search's notes
    assert not list(out.parent.glob(".report.html.*"))  # no temp file left behind


def test_plan_report(tmp_path):
    page = _read(write_report(make_plan(tmp_path), title="Capacity for Q3"))
    _self_contained(page)
    assert _charts(page) == len(PLAN_TITLES)
    for title in PLAN_TITLES:
        assert title in page
    for title in TUNE_TITLES + VALIDATE_TITLES:
        assert title not in page
    assert "<title>Capacity for Q3</title>" in page
    assert "(target 50 req" in page and "target 99.0%" in page  # plotly writes / as \\u002f
    assert "5 replicas" in page and "$15.00" in page  # fixed(k=0) on H100: 50 / 12 -> 5 x $3
    assert "Plans (checks" in page


def test_validate_report(tmp_path):
    out = write_report(make_validate(tmp_path), out=tmp_path / "v.html")
    page = _read(out)
    _self_contained(page)
    assert _charts(page) == 1 and "Simulated vs measured" in page
    assert "llama-tiny" in page and "scaled 0.98-1.03" in page
    assert "Error per metric" in page
    for title in TUNE_TITLES + PLAN_TITLES:
        assert title not in page


def test_all_three(tmp_path):
    folder = make_validate(make_plan(make_tune(tmp_path)))
    page = _read(write_report(folder))
    _self_contained(page)
    assert _charts(page) == len(TUNE_TITLES + PLAN_TITLES + VALIDATE_TITLES)
    for title in TUNE_TITLES + PLAN_TITLES + VALIDATE_TITLES:
        assert title in page


def test_cli_parser_writes_and_prints(tmp_path, capsys):
    sub = argparse.ArgumentParser().add_subparsers()
    parser = report_cli.add_parser(sub)
    assert sub.choices["report"] is parser
    args = parser.parse_args([str(make_plan(tmp_path)), "--out", str(tmp_path / "p.html")])
    assert report_cli.main(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "p.html")
    assert (tmp_path / "p.html").stat().st_size > MB  # plotly.js is in it


# -- downsampling -------------------------------------------------------------------------------


def test_large_series_are_thinned():
    rng = np.random.default_rng(1)
    req = _requests(rng, 30.0, n=20_000)
    fig = charts_samples.latency_cdfs([("big", req)])
    assert all(len(t.x) <= charts.MAX_POINTS for t in fig.data)
    assert max(t.x[-1] for t in fig.data) == pytest.approx(
        (req["finish_s"] - req["arrival_s"]).max())  # the tail is kept
    trace = pd.DataFrame({"time_s": np.arange(50_000) * 0.01, "request_id": 7,
                          "k": rng.integers(0, 6, 50_000)})
    fig = charts_samples.k_over_time([("one request", trace)])
    request = [t for t in fig.data if t.name == "request 7"]
    assert len(request) == 1 and len(request[0].x) <= charts.MAX_POINTS
    assert request[0].x[-1] == trace["time_s"].iloc[-1]  # the end is kept


def test_best_per_policy_follows_direction():
    cands = pd.DataFrame({"policy": ["a", "a", "b"], "rate": [1.0, 1.0, 1.0],
                          "label": ["a1", "a2", "b"], "objective": [3.0, 5.0, 4.0]})
    assert list(charts.best_per_policy(cands, "min")["label"]) == ["a1", "b"]
    assert list(charts.best_per_policy(cands, "max")["label"]) == ["a2", "b"]


def test_best_per_policy_ignores_candidates_dropped_after_one_seed():
    """Successive halving's losers ran on seed 0 only: their mean is over another workload."""
    cands = pd.DataFrame({"policy": ["a", "a", "a"], "rate": [1.0, 1.0, 2.0],
                          "label": ["a1", "a2", "a1"], "seeds": [3, 1, 3],
                          "objective": [3.0, 1.0, 4.0]})
    assert list(charts.best_per_policy(cands, "min")["label"]) == ["a1", "a1"]


# -- k=0, the speed-up over it, the k really drafted ---------------------------------------------


def _tune_charts(doc: dict, direction: str = "min") -> list:
    """The per-rate charts the report draws from tune.json: latency, speed-up, heat map."""
    return rate_charts(pd.DataFrame(doc["candidates"]), doc["meta"]["objective_metric"],
                       direction, doc["meta"]["slo"])


def _k0(doc: dict, rate: float) -> dict:
    return next(c for c in doc["candidates"] if c["label"] == "fixed(k=0)" and c["rate"] == rate)


def _best(doc: dict, rate: float, policy: str) -> dict:
    """The policy's best at `rate` among the candidates that ran on all three seeds."""
    return min((c for c in doc["candidates"] if c["rate"] == rate and c["policy"] == policy
                and c["seeds"] == 3), key=lambda c: c["objective"])


def test_latency_chart_has_plain_decoding_in_every_panel(tmp_path):
    doc = json.loads((make_tune(tmp_path) / "tune.json").read_text())
    latency = _tune_charts(doc)[0]
    k0 = [t for t in latency.data if t.name == charts.BASELINE_NAME]
    assert len(k0) == len({t.yaxis for t in latency.data}) == 4  # mean E2E, p99 E2E, TPOT, TTFT
    base = [_k0(doc, rate) for rate in RATES]
    assert list(k0[0].customdata) == list(RATES)
    assert list(k0[0].y) == pytest.approx([c["objective"] for c in base])
    assert list(k0[1].y) == pytest.approx([c["metrics"]["e2e_p99_s"] for c in base])
    assert list(k0[0].error_y.array) == pytest.approx([c["ci_high"] - c["objective"]
                                                       for c in base])
    assert all(t.line.dash == "dash" for t in k0)
    fixed = next(t for t in latency.data if t.name == "fixed")
    assert "fixed(k=0)" not in fixed.text and "fixed(k=6)" not in fixed.text  # not fixed's best


def test_overlapping_policy_lines_stay_apart(tmp_path):
    doc = json.loads((make_tune(tmp_path) / "tune.json").read_text())
    for c in doc["candidates"]:  # every policy exactly as good: the lines coincide
        c["objective"], c["ci_low"], c["ci_high"] = 1.0, 0.9, 1.1
    first = [t for t in _tune_charts(doc)[0].data if t.yaxis == "y"]
    assert [t.name for t in first] == ["fixed", "goodput", charts.BASELINE_NAME]
    assert len({t.marker.symbol for t in first}) == len({t.line.dash for t in first}) == 3
    xs = [t.x[0] for t in first]
    assert len(set(xs)) == 3 and max(xs) - min(xs) < (RATES[1] - RATES[0]) / 2  # side by side
    assert all(t.customdata[0] == RATES[0] for t in first)  # hover: the true rate


def test_speedup_panel_is_k0_over_each_policys_best_with_a_paired_interval(tmp_path):
    from scipy.stats import t as student

    doc = json.loads((make_tune(tmp_path) / "tune.json").read_text())
    speed = _tune_charts(doc)[1]
    assert speed.layout.title.text.startswith("Speed-up over plain decoding")
    assert "paired" in speed.layout.title.text
    assert sorted(t.name for t in speed.data) == sorted(POLICIES)
    for trace in speed.data:
        bars = zip(trace.customdata, trace.y, trace.error_y.array, trace.error_y.arrayminus)
        for rate, y, up, down in bars:
            base, best = _k0(doc, rate), _best(doc, rate, trace.name)
            assert y == pytest.approx(base["objective"] / best["objective"])
            a, b = np.array(base["per_seed"]), np.array(best["per_seed"])
            r = a.mean() / b.mean()
            half = student.ppf(0.975, 2) * np.std(a - r * b, ddof=1) / (np.sqrt(3) * b.mean())
            assert (y - down, y + up) == pytest.approx((max(r - half, 0), r + half))
    assert len(speed.data[0].y) == len(RATES)


def test_speedup_without_per_seed_values_is_conservative_and_says_so(tmp_path):
    doc = json.loads((make_tune(tmp_path) / "tune.json").read_text())
    for c in doc["candidates"]:
        c.pop("per_seed")
    speed = _tune_charts(doc)[1]
    assert "conservative" in speed.layout.title.text
    for trace in speed.data:
        for rate, y, up, down in zip(trace.customdata, trace.y, trace.error_y.array,
                                     trace.error_y.arrayminus):
            base, best = _k0(doc, rate), _best(doc, rate, trace.name)
            assert (y - down, y + up) == pytest.approx((base["ci_low"] / best["ci_high"],
                                                        base["ci_high"] / best["ci_low"]))


def test_speedup_of_a_higher_is_better_objective_is_policy_over_k0():
    row = {"rate": 4.0, "seeds": 2, "metrics": {}}
    best = pd.DataFrame([{**row, "policy": "goodput", "label": "goodput()", "objective": 300.0,
                          "ci_low": 270.0, "ci_high": 330.0}])
    base = pd.DataFrame([{**row, "policy": "fixed", "label": "fixed(k=0)", "objective": 200.0,
                          "ci_low": 190.0, "ci_high": 220.0}])
    got = charts_speedup.speedups(best, base, "max").iloc[0]
    assert got["speedup"] == pytest.approx(1.5)
    assert (got["low"], got["high"]) == pytest.approx((270 / 220, 330 / 190))


def test_k_over_time_plots_the_k_drafted_not_the_k_chosen(tmp_path):
    folder = make_tune(tmp_path)
    doc = json.loads((folder / "tune.json").read_text())
    drafts = pd.read_csv(folder / doc["samples"][0]["drafts_csv"])
    assert (drafts["drafted"] < drafts["k"]).mean() > 0.3  # the drafter often ran out
    fig = charts_samples.k_over_time([("best at 4 req/s", drafts)])
    assert fig.layout.yaxis.title.text == "k drafted"
    dots = [t for t in fig.data if t.name.startswith("request ")]
    assert len(dots) == 8
    for dot in dots:
        want = drafts[drafts["request_id"] == int(dot.name.split()[1])].sort_values("time_s")
        assert list(dot.y) == list(want["drafted"])
        assert list(dot.x) == pytest.approx(want["time_s"])
    mean = next(t for t in fig.data if t.name == "mean k drafted")
    edges = np.linspace(drafts["time_s"].min(), drafts["time_s"].max(), 61)
    inside = drafts[(drafts["time_s"] >= edges[10]) & (drafts["time_s"] < edges[11])]
    assert mean.y[10] == pytest.approx(inside["drafted"].mean())
    chosen = next(t for t in fig.data if t.name == "mean k the policy chose")
    assert np.nanmean(chosen.y) > np.nanmean(mean.y)
    page = _read(write_report(folder))
    assert page.count("drafted per step on average") == len(RATES)  # k=0 samples: no panel


def test_sample_run_records_the_k_drafted(tmp_path):
    """An n-gram drafter proposes only what it matched: fixed k=10 drafts less, and drafts.csv
    adds up to what requests.csv counts per request."""
    from simulator import SchedulerConfig
    from spectune.evaluate import Task
    from spectune.samples import write_sample
    from spectune.search import Candidate
    from spectune.simulate import SimulationSpec

    scenario = SimulationSpec(workload="poisson", requests=30, lengths="fixed:100,40",
                              acceptance="smollm2-ngram", draft="none")
    paths = write_sample(Task(scenario, SchedulerConfig(), Candidate("fixed", (("k", 10),)),
                              4.0, 0), tmp_path)
    drafts, req = pd.read_csv(paths["drafts_csv"]), pd.read_csv(paths["requests_csv"])
    assert list(drafts.columns) == ["time_s", "request_id", "k", "drafted", "accepted"]
    assert (drafts["k"] == 10).all() and 0 < drafts["drafted"].mean() < 9
    per = drafts.groupby("request_id")
    counted = req.set_index("request_id").loc[per.size().index]
    assert (per["drafted"].sum() == counted["drafted"]).all()
    assert (per["accepted"].sum() == counted["accepted"]).all()
    assert (per.size() == counted["steps"]).all()
    assert len(pd.read_csv(paths["k_trace_csv"])) == len(drafts)


# -- bad input ----------------------------------------------------------------------------------


def test_missing_folder(tmp_path):
    with pytest.raises(ReportError, match=r"no such folder; run spectune tune/plan/validate"):
        write_report(tmp_path / "nope")


def test_folder_without_results(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ReportError, match=r"no tune.json, plan.json or validate.json; run "):
        write_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_malformed_json(tmp_path):
    (tmp_path / "plan.json").write_text('{"kind": "plan", "meta": {')
    with pytest.raises(ReportError, match=r"plan.json: not valid JSON .* line 1.*spectune plan"):
        write_report(tmp_path)


def test_missing_key(tmp_path):
    _dump(tmp_path / "tune.json", {"kind": "tune", "meta": {}})
    with pytest.raises(ReportError, match=r"tune.json: missing or malformed 'candidates'"):
        write_report(tmp_path)


def test_missing_csv(tmp_path):
    folder = make_tune(tmp_path)
    victim = folder / json.loads((folder / "tune.json").read_text())["samples"][1]["drafts_csv"]
    victim.unlink()
    with pytest.raises(ReportError) as err:
        write_report(folder)
    message = str(err.value)
    assert str(victim) in message and "samples[1].drafts_csv" in message
    assert "run the job again" in message
    assert not (folder / "report.html").exists()


def test_csv_without_columns(tmp_path):
    folder = make_tune(tmp_path)
    rel = json.loads((folder / "tune.json").read_text())["samples"][0]["requests_csv"]
    (folder / rel).write_text("a,b\n1,2\n")
    with pytest.raises(ReportError, match=r"requests.csv \(named in .*\): no column request_id"):
        write_report(folder)


def test_out_folder_missing(tmp_path):
    with pytest.raises(ReportError, match=r"does not exist; create it first"):
        write_report(make_plan(tmp_path), out=tmp_path / "missing" / "r.html")


# -- the page in a real browser -----------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists()
                                        else None)
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=5000", "--no-first-run", "--disable-extensions",
         "--enable-logging=stderr", "--v=0")


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=60)


def read_png(path: Path) -> np.ndarray:
    """8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) as an (h, w, channels) array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, [], None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", data[pos + 8:pos + 8 + 13])
        elif kind == b"IDAT":
            idat.append(data[pos + 8:pos + 8 + n])
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = head
    assert depth == 8 and colour in (2, 6) and interlace == 0, head
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, w * bpp + 1)
    return _unfilter(raw, bpp).reshape(h, w, bpp)


def _unfilter(raw: np.ndarray, bpp: int) -> np.ndarray:
    """Undo PNG's per-row filters (None, Sub, Up, Average, Paeth)."""
    out = np.zeros((raw.shape[0], raw.shape[1] - 1), np.int32)
    prev = np.zeros(raw.shape[1] - 1, np.int32)
    for y, (ftype, row) in enumerate(zip(raw[:, 0], raw[:, 1:].astype(np.int32))):
        if ftype == 0:
            cur = row
        elif ftype == 2:
            cur = (row + prev) & 255
        elif ftype == 1:
            cur = np.cumsum(row.reshape(-1, bpp), axis=0).reshape(-1) & 255
        else:
            cur = _sequential(row.tolist(), prev.tolist(), bpp, ftype)
        out[y] = prev = cur
    return out.astype(np.uint8)


def _sequential(row: list, prev: list, bpp: int, ftype: int) -> np.ndarray:
    cur = [0] * len(row)
    for i, v in enumerate(row):
        a = cur[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if ftype == 3:
            cur[i] = (v + (a + b) // 2) & 255
        else:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            cur[i] = (v + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return np.array(cur, np.int32)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH or at /usr/bin/chromium: "
                    "install it (apt-get install chromium) to render the report headless")
def test_renders_in_headless_chromium(tmp_path):
    folder = make_validate(make_plan(make_tune(tmp_path / "run")))
    page = write_report(folder)
    url = page.resolve().as_uri()
    dom = _chromium(["--dump-dom", url], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    # plotly draws one <svg class="main-svg"> (plus overlays) per chart once its JS has run
    drawn = dom.stdout.count('class="plot-container plotly"')
    assert drawn == len(TUNE_TITLES + PLAN_TITLES + VALIDATE_TITLES)
    assert dom.stdout.count('class="main-svg"') >= drawn
    shot = tmp_path / "report.png"
    run = _chromium([f"--screenshot={shot}", "--window-size=1400,3000", url], tmp_path)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    assert "Uncaught" not in run.stderr, run.stderr[-2000:]
    rgb = read_png(shot)[:, :, :3]
    assert rgb.shape[:2] == (3000, 1400)
    ink = (rgb < 235).any(axis=2).mean()
    assert ink > 0.05, f"only {ink:.1%} of the screenshot is not white"
    coarse = {tuple(c) for c in (rgb[::4, ::4] // 32).reshape(-1, 3)}
    assert len(coarse) >= 12, f"only {len(coarse)} colours: the traces were not drawn"


def test_sparse_inputs_still_chart(tmp_path):
    """One seed (no interval), null metrics, no samples, no SLO, no target rate, no costs, a
    validate row without a measurement: the charts that apply, no crash."""
    tune = json.loads((make_tune(tmp_path / "full") / "tune.json").read_text())
    for c in tune["candidates"]:
        c.pop("ci_low"), c.pop("ci_high")
        c["metrics"]["tpot_p99_s"] = None
    tune["meta"]["slo"] = {}
    tune.pop("samples"), tune.pop("exports")
    folder = tmp_path / "sparse"
    _dump(folder / "tune.json", tune)
    plan = json.loads((make_plan(tmp_path / "plan") / "plan.json").read_text())
    plan["meta"]["target_rate"] = None
    for p in plan["plans"]:
        p.update(replicas_needed=None, cost_per_hour=None)
    _dump(folder / "plan.json", plan)
    rows = json.loads((make_validate(tmp_path / "v") / "validate.json").read_text())["rows"]
    rows[0]["measured"] = None
    _dump(folder / "validate.json", {"rows": rows, "meta": {}})
    page = _read(write_report(folder))
    assert _charts(page) == 3 + len(PLAN_TITLES) + 1
    assert "Draft length k" not in page and "SLO TTFT" not in page and "3 replicas" not in page
    assert "SLO: none" in page and "no target rate" in page


def test_wrong_types_are_a_report_error(tmp_path):
    folder = make_tune(tmp_path / "run.1")  # a dot in the folder name, too
    doc = json.loads((folder / "tune.json").read_text())
    doc["candidates"][0]["objective"] = "fast"
    _dump(folder / "tune.json", doc)
    with pytest.raises(ReportError, match=r"run\.1/tune\.json: unexpected content .*spectune tune"):
        write_report(folder)
    doc["meta"] = []
    _dump(folder / "tune.json", doc)
    with pytest.raises(ReportError, match=r"malformed 'meta' .*spectune tune --out .*run\.1"):
        write_report(folder)

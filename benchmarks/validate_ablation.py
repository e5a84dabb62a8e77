"""What a modelled piece changes, on the same live runs: re-simulate a validate run with the
simulator as it is (`model`: the chain's first draft pass charged its catch-up,
simulator/draft_feed.py) and without it (`one`: one token per request in the first pass, the
simulator before 2026-11-26), against the same measurements. (A third variant measured the
profile's chain factors, commit 8466e13, before they were reverted for making drafting runs
worse: benchmarks/results/validate-cpu-smollm2-eagle-chain-ablation.txt.)

A whole `spectune validate` on a shared 2-core VM moves by several percent between runs (its
drift scale spread 0.93-1.13 on 2026-11-26), more than these pieces are worth; the paired
comparison holds the live runs fixed, so only the model differs. Everything else is as validate
simulated it: the saved profile (samples.json; goodput reads the rounds it had read live), each
policy's host-time fit and each run's drift scale from validate.json, and the speculation trace
teacher-forced on the target's greedy outputs (the live run is lossless in fp32; the column
`same` checks that the `model` variant reproduces validate's own simulation).

    python benchmarks/validate_ablation.py runs/validate-eagle [--threads 2]
"""

from __future__ import annotations

import os
import sys

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from models.generate import target_outputs  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import StepCostModel, simulate  # noqa: E402
from spectune.validate import ValidateSpec, _probe  # noqa: E402
from spectune.validate_calibration import HostFit  # noqa: E402
from spectune.validate_report import metrics  # noqa: E402
from spectune.validate_setup import build_workload, record_trace, setup_models  # noqa: E402

METRICS = ("e2e_mean_s", "tpot_mean_s", "e2e_p99_s", "ttft_mean_s")
VARIANTS = ("model", "one")


def _run_folder(out: Path, label: str, rate: float) -> Path:
    return out / "runs" / f"{label.replace(':', '_').replace('=', '')}_rate{rate:g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a `spectune validate --out` folder")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    saved = json.loads((args.out / "validate.json").read_text())
    meta, rows = saved["meta"], pd.DataFrame(saved["rows"])
    spec = ValidateSpec(**meta["spec"])  # its thread count names the profile's device
    setup = setup_models(spec)
    workloads = {rate: build_workload(spec, rate, setup.vocab, setup.tokenizer)
                 for rate in spec.rate_list}
    probe = _probe(spec, setup, workloads, args.out)  # resumes the saved rounds, times nothing
    table = probe.table()
    torch.set_num_threads(args.threads)  # what follows is not timed
    print(f"# {args.out}: {meta['profile']}; draft_catch_up "
          f"{table.meta.get('draft_catch_up', 'bonus')}")
    traces = {}
    for rate, (_, prompts) in workloads.items():
        outputs = target_outputs(setup.target, prompts, spec.n_output)
        traces[rate] = record_trace(setup.target, setup.drafter, prompts, outputs, spec.k_max,
                                    True, spec.temperature)
    hosts = {label: HostFit(**h) for label, h in meta["host"].items()}
    policies = {label: (name, params) for label, name, params in spec.policy_specs}
    table_rows = []
    for run in meta["runs"]:
        label, rate, scale = run["policy"], run["rate"], run["pass_scale"]
        name, params = policies[label]
        before = run["rounds_around"][0]
        seen_table = probe.sweep.results(slice(0, before + 1))[0]  # what the live policy read
        seen = StepCostModel(hosts[label].latency(
            type(table)(seen_table.rows, {**seen_table.meta, "repeats": before + 1}),
            setup.drafter))
        folder = _run_folder(args.out, label, rate)
        measured = metrics(pd.read_csv(folder / "live_requests.csv"),
                           pd.read_csv(folder / "live_steps.csv"))
        row = {"policy": label, "rate": rate}
        for rule in VARIANTS:
            latency = hosts[label].latency(table, setup.drafter, scale)
            if rule == "one":
                latency.draft_catch_up = "one"
            sim = simulate(workloads[rate][0], latency, traces[rate], make_policy(name, params),
                           setup.scheduler.kv_capacity_tokens, setup.scheduler,
                           policy_cost=seen)
            got = metrics(sim.requests, sim.steps)
            for m in METRICS:
                row[f"{rule}:{m}"] = (got[m] - measured[m]) / measured[m] * 100
            if rule == "model":
                mine = rows[(rows.policy == label) & (rows.rate == rate)]
                validate = dict(zip(mine.metric, mine.simulated))
                row["same"] = bool(all(np.isclose(got[m], validate[m], rtol=1e-6)
                                       for m in METRICS))
        table_rows.append(row)
    df = pd.DataFrame(table_rows)
    print(f"error %, simulated vs measured: {' / '.join(VARIANTS)}")
    for m in METRICS:
        df[m] = [" / ".join(f"{x:+5.1f}" for x in values)
                 for values in zip(*(df[f"{rule}:{m}"] for rule in VARIANTS))]
    print(df[["policy", "rate", "same", *METRICS]].to_string(index=False))
    drafting = df[~df.policy.str.fullmatch("fixed:k=0")]
    for rule in VARIANTS:
        e2e, tpot = drafting[f"{rule}:e2e_mean_s"], drafting[f"{rule}:tpot_mean_s"]
        print(f"{rule:>8}: drafting runs' mean E2E error {e2e.mean():+.2f}% (mean |err| "
              f"{e2e.abs().mean():.2f}%), mean TPOT error {tpot.mean():+.2f}% "
              f"(mean |err| {tpot.abs().mean():.2f}%)")


if __name__ == "__main__":
    main()

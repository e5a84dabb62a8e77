"""How to calibrate a simulated vLLM run to its server's speed, compared on measured runs: the
folder of a `spectune validate --engine vllm --calibrate` (read back, nothing served), each run
simulated again with its passes and host time scaled by each way of estimating the speed from
what its server ran before it, and by its own speed (a diagnostic, not a prediction).

Ways, each known before the run it scales:
  busy, calibration window      one factor: the calibration window's busy ratio (the first
                                `--calibrate`, 2026-11-29)
  per phase, calibration window prefill/decode/verify, shape for shape (`phase_speeds`)
  per phase, pooled             the same over every window the server ran before the run
  busy, pooled, decaying        one factor, over every window the server ran before the run,
                                each earlier window weighing POOL_KEEP of the next
  per phase, pooled, decaying   per phase, pooled so: what `validate --calibrate` does
and, diagnostics, the run's own busy ratio, and its own speed per phase (what the
speed-matched table uses).

Per way: runs with mean E2E within 5% of vLLM's, the mean and worst error, and per rate the
Kendall tau of the simulated against the measured ranking of the configurations.

    python benchmarks/vllm_calibration.py runs/vllm-calibrated-matched \\
        --profile benchmarks/results/vllm-epyc/latency-idle [--out calibration.json]
    # a folder measured before calibration windows took the measured window's prompt lengths:
    python benchmarks/vllm_calibration.py runs/vllm-calibrated --unmatched-calibration ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WAYS = ("plain", "busy, calibration window", "busy, pooled, decaying",
        "per phase, calibration window", "per phase, pooled", "per phase, pooled, decaying",
        "own busy ratio (diagnostic)", "own speed (diagnostic)")


def kendall_tau(simulated: list[float], measured: list[float]) -> float:
    pairs = list(itertools.combinations(range(len(measured)), 2))
    signs = [np.sign((simulated[i] - simulated[j]) * (measured[i] - measured[j]))
             for i, j in pairs]
    return float(np.sum(signs) / len(pairs)) if pairs else float("nan")


def main() -> int:
    from live.vllm_acceptance import ngram_trace
    from spectune.flags import parse_policy_list
    from spectune.validate_report import metrics
    from spectune.validate_vllm import (
        POOL_KEEP,
        VllmValidation,
        calibration_label,
        calibration_times,
        configs_of,
        kv_tokens,
        load_profile,
        measured_metrics,
        measured_runs,
        simulate_run,
        spec_bench_workload,
        validation_workloads,
    )
    from spectune.vllm_speed import ServedTimes, pooled

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a `validate --engine vllm --calibrate` --out")
    ap.add_argument("--profile", default="benchmarks/results/vllm-epyc/latency-idle")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.5, 3.0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", default=None,
                    help="a trace's lengths, as the validation served (default: Spec-Bench's)")
    ap.add_argument("--policies", default="fixed:k=0,fixed:k=1,fixed:k=2,fixed:k=3,fixed:k=4,"
                    "fixed:k=6,batch_adaptive:schedule=[[1,1,3],[2,4,2],[5,128,1]]")
    ap.add_argument("--out", type=Path, help="also write the errors and the summary as JSON")
    ap.add_argument("--unmatched-calibration", action="store_true",
                    help="calibration windows of their own training questions' lengths (folders "
                         "measured before they took the measured window's)")
    args = ap.parse_args()

    v = VllmValidation(profile=args.profile, venv=ROOT / ".venv-vllm", model_dir=Path("."),
                       rates=tuple(args.rates), configs=configs_of(parse_policy_list(
                           args.policies)), requests=args.requests,
                       output_tokens=args.output_tokens, seed=args.seed,
                       workload=args.workload, calibrate=True)
    workloads = validation_workloads(v)
    if args.unmatched_calibration:
        for rate in v.rates:
            workloads[calibration_label(f"rate{rate:g}")] = spec_bench_workload(
                v.requests, rate, v.output_tokens, v.seed, "train")
    table = load_profile(v)
    errors: dict[str, list[float]] = {way: [] for way in WAYS}
    by_rate: dict[float, dict[str, list[tuple[float, float]]]] = {
        rate: {way: [] for way in WAYS} for rate in v.rates}
    for config in v.configs:
        runs, log = measured_runs(v, config, workloads, None, args.folder, lambda *_: None)
        capacity = kv_tokens(log)
        pool = decaying = None
        for rate in v.rates:
            label = f"rate{rate:g}"
            window = calibration_times(v, config, workloads, runs, label, capacity, table)
            pool = pooled(pool, window, 1.0)
            decaying = pooled(decaying, window, POOL_KEEP)
            (wl, ids), run = workloads[label], runs[label]
            trace = ngram_trace(ids, run.outputs, 16, {"source": f"vLLM, {config.label}"})
            sim, latency = simulate_run(v, config, wl, trace, capacity, table)
            own = ServedTimes.of(run, sim.steps, latency)
            cal = window.speed()
            scales = {
                "plain": {},
                "busy, calibration window": dict(pass_scale=cal.busy or 1.0, host_scale=cal.host),
                "busy, pooled, decaying": dict(pass_scale=decaying.speed().busy or 1.0,
                                               host_scale=decaying.speed().host),
                "per phase, calibration window": dict(host_scale=cal.host,
                                                      phase_scales=cal.phases),
                "per phase, pooled": dict(host_scale=pool.speed().host,
                                          phase_scales=pool.speed().phases),
                "per phase, pooled, decaying": dict(host_scale=decaying.speed().host,
                                                    phase_scales=decaying.speed().phases),
                "own busy ratio (diagnostic)": dict(pass_scale=own.speed().busy or 1.0,
                                                    host_scale=own.speed().host),
                "own speed (diagnostic)": dict(host_scale=own.speed().host,
                                               phase_scales=own.speed().phases),
            }
            measured = measured_metrics(run.requests, run.iterations)["e2e_mean_s"]
            for way, kw in scales.items():
                scaled = sim if not kw else simulate_run(v, config, wl, trace, capacity, table,
                                                         **kw)[0]
                simulated = metrics(scaled.requests, scaled.steps)["e2e_mean_s"]
                errors[way].append((simulated / measured - 1) * 100)
                by_rate[rate][way].append((simulated, measured))
            pool = pooled(pool, own, 1.0)
            decaying = pooled(decaying, own, POOL_KEEP)
    print(f"{args.folder}: {len(errors['plain'])} runs, profile {args.profile}; error of the "
          "simulated mean E2E against vLLM's")
    print(f"{'way':>32} {'within 5%':>10} {'mean':>7} {'mean |e|':>9} {'worst':>7}  "
          + "  ".join(f"tau@{r:g}" for r in v.rates))
    summary = {}
    for way in WAYS:
        e = np.array(errors[way])
        taus = [kendall_tau(*zip(*by_rate[r][way])) for r in v.rates]
        summary[way] = {"within_5pct": int((np.abs(e) <= 5).sum()), "runs": len(e),
                        "mean_pct": float(e.mean()), "mean_abs_pct": float(np.abs(e).mean()),
                        "worst_abs_pct": float(np.abs(e).max()),
                        "kendall_tau": dict(zip((f"{r:g}" for r in v.rates), taus)),
                        "errors_pct": [round(float(x), 2) for x in e]}
        print(f"{way:>32} {summary[way]['within_5pct']:>6}/{len(e):<3} {e.mean():>+6.1f}% "
              f"{np.abs(e).mean():>8.1f}% {np.abs(e).max():>6.1f}%  "
              + "  ".join(f"{t:>6.2f}" for t in taus))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"folder": str(args.folder), "profile": args.profile,
                                        "ways": summary}, indent=1))
    return 0


if __name__ == "__main__":
    from simulator.errors import ConfigError

    try:
        sys.exit(main())
    except ConfigError as e:  # bad input: one line, no traceback
        sys.exit(f"error: {e}")

"""Does the simulator rank vLLM's speculation configurations as vLLM does, once the measurement
is repeated? Several rates and Poisson windows (held-out Spec-Bench questions, a seed each),
every configuration on its own server, all windows of all rates served by that server in turn
(window by window, each at every rate, so that the machine's drift over a server's minutes is
shared by the rates).

Per rate and configuration: vLLM's mean E2E in each window and over the windows, the
simulator's on the same arrivals and acceptance (`spectune validate --engine vllm`'s simulation:
vLLM's profile, its scheduler, the acceptance rebuilt from what it wrote). Then Kendall's tau
between the two over all pairs, and over the pairs whose measured means differ by more than
`--noise` percent (one window measured twice on new servers moved by up to 3.7% on one VM and
14% on another near saturation, docs/vllm.md): a ranking error there is the simulator's, not
the measurement's.

With `--loop` (a `benchmarks/vllm_loop.py` output): its tune's predicted mean E2E ranks the
configurations too, its recommendation is checked against the best of the windows' means, and
its own measured window (seed 0) joins the windows.

Each run is also simulated with its passes scaled by how fast vLLM ran the window its server
served just before (that window's busy ratio: known before the run, so still a prediction), and
the share of runs whose mean E2E is within 5% is printed for both: a server instance's speed
varies by several percent (docs/vllm.md), and this says how much of the error that is.

Measured runs are kept in OUT/<config>/<rate>-seed<S> and read back when a rerun finds them; no
other process may run while vLLM is timed.

    python benchmarks/vllm_ranking.py --rates 1.5 --windows 1 2 3 --out runs/vllm-ranking
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = ("fixed:k=0,fixed:k=1,fixed:k=2,fixed:k=4,fixed:k=6,"
           "batch_adaptive:schedule=[[1,4,2],[5,128,1]]")


def pair_tau(sim: list[float], real: list[float], noise_pct: float) -> tuple[float, int]:
    """Kendall's tau over the pairs whose measured values differ by more than noise_pct
    (concordant minus discordant over their number), and how many pairs that is."""
    agree = disagree = 0
    for i, j in itertools.combinations(range(len(real)), 2):
        if abs(real[i] - real[j]) / min(real[i], real[j]) * 100 <= noise_pct:
            continue
        if np.sign(real[i] - real[j]) == np.sign(sim[i] - sim[j]):
            agree += 1
        else:
            disagree += 1
    n = agree + disagree
    return ((agree - disagree) / n if n else float("nan")), n


def window_label(rate: float, seed: int) -> str:
    return f"rate{rate:g}-seed{seed}"


def loop_inputs(loop: Path) -> tuple[dict, dict]:
    """A vllm_loop output's tune predictions {(rate, config): s} and recommendations
    {rate: config}."""
    data = json.loads((loop / "loop.json").read_text())
    predicted = {(float(r["rate"]), r["config"]): r["predicted_e2e_s"] for r in data["table"]}
    recommended = {float(r["rate"]): r["recommended"] for r in data["verdicts"]}
    return predicted, recommended


def main() -> int:
    from live.vllm_acceptance import ngram_trace
    from live.vllm_server import DEFAULT_VENV, resolve_venv
    from simulator.metrics import latencies
    from spectune.flags import parse_policy_list
    from spectune.validate_vllm import (
        VllmValidation,
        configs_of,
        kv_tokens,
        load_profile,
        measured_runs,
        simulate_run,
        spec_bench_workload,
    )
    from spectune.vllm_speed import busy_ratio, step_host_s

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", "--rate", dest="rates", type=float, nargs="+", default=[1.5])
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 2, 3],
                    help="the windows' seeds (seed 0 is the validation's own window)")
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--profile", default="vllm-cpu-smollm2")
    ap.add_argument("--loop", type=Path, help="a benchmarks/vllm_loop.py output: rank by its "
                    "tune's predictions too, check its recommendation, add its window (seed 0)")
    ap.add_argument("--window0", type=Path, help="where the loop's measured window is (a "
                    "`validate --engine vllm` folder; default: LOOP/validate)")
    ap.add_argument("--noise", type=float, default=4.0,
                    help="measured differences up to this many percent count as ties")
    ap.add_argument("--out", type=Path, default=Path("runs/vllm-ranking"))
    args = ap.parse_args()
    configs = configs_of(parse_policy_list(args.configs, "--configs"))
    venv = resolve_venv(DEFAULT_VENV)
    v = VllmValidation(args.profile, venv, venv / "models" / "SmolLM2-135M-Instruct",
                       tuple(args.rates), configs, args.requests, args.output_tokens)
    windows = {window_label(r, s): spec_bench_workload(args.requests, r, args.output_tokens, s)
               for s in args.windows for r in args.rates}
    # each label's rate: these windows', the loop's own (seed 0) and its validation's folders
    rate_of = {window_label(r, s): r for s in {0, *args.windows} for r in args.rates}
    rate_of |= {f"rate{r:g}": r for r in args.rates}
    predicted, recommended = loop_inputs(args.loop) if args.loop else ({}, {})
    table = load_profile(v)
    rows = []
    for config in configs:
        folder = args.out / config.folder
        kept = args.out if (folder / "server.log").is_file() else None  # read back, checked
        runs, log = measured_runs(v, config, windows, folder, kept, print)
        capacity = kv_tokens(log)
        served = {label: (windows[label], run) for label, run in runs.items()}
        if args.loop:  # the loop's own window (seed 0), read back from its validation
            loop_windows = {f"rate{r:g}": spec_bench_workload(args.requests, r,
                                                              args.output_tokens, 0)
                            for r in args.rates if window_label(r, 0) not in served}
            if loop_windows:
                kept0, _ = measured_runs(v, config, loop_windows, folder,
                                         args.window0 or args.loop / "validate", print)
                served |= {window_label(rate_of[name], 0): (loop_windows[name], run)
                           for name, run in kept0.items()}
        previous = None  # the busy ratio of the window this server served just before
        for label, ((wl, ids), run) in served.items():
            trace = ngram_trace(ids, run.outputs, 16, {})
            sim, latency = simulate_run(v, config, wl, trace, capacity, table)
            row = {"config": config.label, "window": label, "rate": rate_of[label],
                   "measured_e2e_s": float(latencies(run.requests).e2e_s.mean()),
                   "simulated_e2e_s": float(latencies(sim.requests).e2e_s.mean())}
            if label in runs:  # served here, in this order (the loop's window 0 was not)
                if previous is not None:
                    scaled, _ = simulate_run(v, config, wl, trace, capacity, table, previous)
                    row["calibrated_by_previous_e2e_s"] = float(
                        latencies(scaled.requests).e2e_s.mean())
                previous = busy_ratio(run.iterations, sim.steps, step_host_s(latency, sim.steps))
            rows.append(row)
    labels = [c.label for c in configs]
    results = [rank_rate(rate, rows, labels, predicted, recommended.get(rate), args.noise)
               for rate in args.rates]
    calibrated = [r for r in rows if "calibrated_by_previous_e2e_s" in r]
    for name, subset in (("simulated_e2e_s", calibrated), ("calibrated_by_previous_e2e_s",
                                                           calibrated)):
        errors = np.array([r[name] / r["measured_e2e_s"] - 1 for r in subset]) * 100
        if len(errors):
            print(f"{name}: mean E2E within 5% in {int((abs(errors) <= 5).sum())} of "
                  f"{len(errors)} runs (those after another on their server), median |error| "
                  f"{np.median(abs(errors)):.1f}%")
    (args.out / "ranking.json").write_text(json.dumps(
        {"rates": args.rates, "rows": rows, "per_rate": results, "noise_pct": args.noise},
        indent=1))
    return 0


def rank_rate(rate: float, rows: list[dict], labels: list[str], predicted: dict,
              recommended: str | None, noise: float) -> dict:
    """One rate's table and taus, printed and returned."""
    rows = [r for r in rows if r["rate"] == rate]
    windows = sorted({r["window"] for r in rows})
    cell = {(r["config"], r["window"]): r for r in rows}
    mean = {name: {c: float(np.mean([r[name] for r in rows if r["config"] == c]))
                   for c in labels} for name in ("measured_e2e_s", "simulated_e2e_s")}
    print(f"\nmean E2E at {rate:g} req/s, s, measured / simulated (windows: {', '.join(windows)})")
    print(f"{'configuration':46s} " + " ".join(f"{w:>15s}" for w in windows)
          + "   mean measured  mean simulated" + ("  tune predicted" if predicted else ""))
    for c in labels:
        cells = [cell[c, w] for w in windows]
        print(f"{c:46s} " + " ".join(f"{x['measured_e2e_s']:6.2f} / {x['simulated_e2e_s']:6.2f}"
                                     for x in cells)
              + f"   {mean['measured_e2e_s'][c]:13.3f}  {mean['simulated_e2e_s'][c]:14.3f}"
              + (f"  {predicted[rate, c]:14.3f}" if predicted else ""))
    real = [mean["measured_e2e_s"][c] for c in labels]
    result = {"rate": rate, "windows": windows, "mean": mean}
    sims = {"replay": [mean["simulated_e2e_s"][c] for c in labels]}
    if predicted:
        sims["tune"] = [predicted[rate, c] for c in labels]
    for name, sim in sims.items():
        tau_all = float(kendalltau(sim, real).statistic)
        tau_clear, pairs = pair_tau(sim, real, noise)
        result[name] = {"kendall_tau": tau_all, "kendall_tau_clear": tau_clear,
                        "clear_pairs": pairs}
        print(f"Kendall tau, {name} vs the windows' means: {tau_all:.2f} (all "
              f"{len(labels) * (len(labels) - 1) // 2} pairs); {tau_clear:.2f} over the "
              f"{pairs} pairs measured more than {noise:g}% apart")
    result["per_window_replay_tau"] = {
        w: float(kendalltau([cell[c, w]["simulated_e2e_s"] for c in labels],
                            [cell[c, w]["measured_e2e_s"] for c in labels]).statistic)
        for w in windows}
    best = labels[int(np.argmin(real))]
    print("per window (replay): " + ", ".join(
        f"{w} {t:.2f}" for w, t in result["per_window_replay_tau"].items()))
    print(f"best measured: {best}; best simulated: {labels[int(np.argmin(sims['replay']))]}")
    if recommended is not None:
        gap = (mean["measured_e2e_s"][recommended] / min(real) - 1) * 100
        result["recommended"], result["recommended_vs_best_pct"] = recommended, gap
        print(f"the tune's recommendation {recommended}: {gap:+.1f}% from the best measured")
    result["best_measured"] = best
    return result


if __name__ == "__main__":
    sys.exit(main())

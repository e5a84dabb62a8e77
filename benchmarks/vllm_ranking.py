"""Does the simulator rank vLLM's speculation configurations as vLLM does, once the measurement
is repeated? One rate, several Poisson windows (held-out Spec-Bench questions, a seed each),
every configuration on its own server, all windows served by that server in turn.

Per configuration: vLLM's mean E2E in each window and over the windows, the simulator's on the
same arrivals and acceptance (`spectune validate --engine vllm`'s simulation: vLLM's profile,
its scheduler, the acceptance rebuilt from what it wrote). Then Kendall's tau between the two
over all pairs, and over the pairs whose measured means differ by more than `--noise` percent
(one window measured twice on new servers moved by up to 3.7%, docs/vllm.md): a ranking error
there is the simulator's, not the measurement's.

Measured runs are kept in OUT/<config>/seed<S> and read back when a rerun finds them; no other
process may run while vLLM is timed.

    python benchmarks/vllm_ranking.py --rate 1.5 --windows 1 2 3 --out runs/vllm-ranking
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

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 2, 3],
                    help="the windows' seeds (seed 0 is the validation's own window)")
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--profile", default="vllm-cpu-smollm2")
    ap.add_argument("--noise", type=float, default=4.0,
                    help="measured differences up to this many percent count as ties")
    ap.add_argument("--out", type=Path, default=Path("runs/vllm-ranking"))
    args = ap.parse_args()
    configs = configs_of(parse_policy_list(args.configs, "--configs"))
    venv = resolve_venv(DEFAULT_VENV)
    v = VllmValidation(args.profile, venv, venv / "models" / "SmolLM2-135M-Instruct",
                       (args.rate,), configs, args.requests, args.output_tokens)
    windows = {f"seed{s}": spec_bench_workload(args.requests, args.rate, args.output_tokens, s)
               for s in args.windows}
    table = load_profile(v)
    rows = []
    for config in configs:
        folder = args.out / config.folder
        kept = args.out if (folder / "server.log").is_file() else None  # read back, checked
        runs, log = measured_runs(v, config, windows, folder, kept, print)
        capacity = kv_tokens(log)
        for label, run in runs.items():
            wl, ids = windows[label]
            trace = ngram_trace(ids, run.outputs, 16, {})
            sim, _ = simulate_run(v, config, wl, trace, capacity, table)
            rows.append({"config": config.label, "window": label,
                         "measured_e2e_s": float(latencies(run.requests).e2e_s.mean()),
                         "simulated_e2e_s": float(latencies(sim.requests).e2e_s.mean())})
    labels = [c.label for c in configs]
    cell = {(r["config"], r["window"]): r for r in rows}
    mean = {name: {c: float(np.mean([r[name] for r in rows if r["config"] == c]))
                   for c in labels} for name in ("measured_e2e_s", "simulated_e2e_s")}
    print(f"\nmean E2E at {args.rate:g} req/s, s (windows: {', '.join(windows)})")
    print(f"{'configuration':46s} " + " ".join(f"{w:>15s}" for w in windows)
          + "   mean measured  mean simulated")
    for c in labels:
        cells = [cell[c, w] for w in windows]
        print(f"{c:46s} " + " ".join(f"{x['measured_e2e_s']:6.2f} / {x['simulated_e2e_s']:6.2f}"
                                     for x in cells)
              + f"   {mean['measured_e2e_s'][c]:13.3f}  {mean['simulated_e2e_s'][c]:14.3f}")
    real = [mean["measured_e2e_s"][c] for c in labels]
    sim = [mean["simulated_e2e_s"][c] for c in labels]
    tau_all = float(kendalltau(sim, real).statistic)
    tau_clear, pairs = pair_tau(sim, real, args.noise)
    per_window = {w: float(kendalltau([cell[c, w]["simulated_e2e_s"] for c in labels],
                                      [cell[c, w]["measured_e2e_s"] for c in labels]).statistic)
                  for w in windows}
    print(f"\nKendall tau over the windows' means: {tau_all:.2f} (all "
          f"{len(labels) * (len(labels) - 1) // 2} pairs); "
          f"{tau_clear:.2f} over the {pairs} pairs measured more than {args.noise:g}% apart")
    print("per window: " + ", ".join(f"{w} {t:.2f}" for w, t in per_window.items()))
    print(f"best measured: {labels[int(np.argmin(real))]}; best simulated: "
          f"{labels[int(np.argmin(sim))]}")
    (args.out / "ranking.json").write_text(json.dumps(
        {"rate": args.rate, "rows": rows, "mean": mean, "kendall_tau": tau_all,
         "kendall_tau_clear": tau_clear, "clear_pairs": pairs, "noise_pct": args.noise,
         "per_window": per_window}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

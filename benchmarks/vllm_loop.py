"""Close the loop on a real vLLM: tune its speculation in the simulator, then measure on vLLM
whether the recommendation wins and whether the simulator ranks the configurations as vLLM does.

1. **Tune** (`spectune tune`): vLLM's own profile (`vllm-cpu-smollm2`), its scheduler
   (`--scheduler vllm-v1`, its CPU defaults and KV capacity) and an acceptance recording made on
   vLLM (`spectune record --engine vllm --split train`: vLLM's greedy outputs on the Spec-Bench
   questions the validation never serves). Workload: Poisson arrivals, (prompt, output) lengths
   of those train questions. Every fixed k is simulated over every seed (`--search grid`), and
   the tune's vLLM export, a per-batch-size table built from the best fixed k per rate, is
   priced on the same seeds (`engine_table`); the recommendation per rate is the best of them.
2. **Measure** (`spectune validate --engine vllm`): k in {0, 2, 4, 6}, each rate's best fixed
   k and the table, each on its own server, on held-out questions with Poisson arrivals.
3. **Compare**, per rate: the recommendation's measured mean E2E against the best measured
   configuration (target: within 3%), and Kendall's tau between the tune's predicted and vLLM's
   measured mean E2E over the configurations (target: >= 0.8).

Each step keeps its output in OUT and is skipped when a rerun finds it (delete OUT/validate to
measure again). No other process may run while vLLM is timed.

    python benchmarks/vllm_loop.py --recording runs/vllm-record/trace.npz [--out runs/vllm-loop]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parents[1]
SPECTUNE = [sys.executable, "-m", "spectune"]
#: vLLM-CPU's serving defaults (docs/vllm-v1-scheduler.md) and the KV it allocates in bf16 with
#: VLLM_CPU_KVCACHE_SPACE=2 (its log's "KV cache size")
SCENARIO = ["--scheduler", "vllm-v1", "--max-num-seqs", "128", "--max-batched-tokens", "2048",
            "--kv-capacity-tokens", "93184"]


def run(cmd: list[str], log: Path) -> None:
    """Run one spectune command, show it, keep its stderr; stop on failure."""
    print("$ spectune " + " ".join(cmd), flush=True)
    with log.open("w") as err:
        done = subprocess.run(SPECTUNE + cmd, cwd=ROOT, stderr=err)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}); see {log}")


def train_lengths(path: Path, output_tokens: int) -> None:
    """(prompt, output) pairs of the train questions, as vLLM gets them (SmolLM2's template)."""
    from models.gguf import load_smollm2_tokenizer
    from models.tokenizer import chat_prompt
    from traces import Workload, save_workload
    from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts

    tok = load_smollm2_tokenizer()
    prompts = [p for p in load_prompts(DEFAULT_PROMPTS) if in_split(p.key, "train")]
    n = np.array([len(tok.encode(chat_prompt(p.text))) for p in prompts])
    save_workload(Workload(arrival_s=np.zeros(len(n)), prompt_tokens=n,
                           output_tokens=np.full(len(n), output_tokens),
                           request_ids=np.arange(len(n)),
                           source="Spec-Bench train questions' lengths"), path)


def predictions(tune: Path) -> pd.DataFrame:
    """rate, config (a --policies spelling), predicted mean E2E: every candidate of a tune."""
    rows = []
    for c in json.loads((tune / "tune.json").read_text())["candidates"]:
        if c["policy"] == "fixed":
            config = f"fixed:k={c['params']['k']}"
        else:
            table = c["params"]["schedule"]  # JSON text, as pinned
            config = "batch_adaptive:schedule=" + (table if isinstance(table, str) else
                                                   json.dumps(table, separators=(",", ":")))
        rows.append({"rate": c["rate"], "config": config, "predicted_e2e_s": c["objective"],
                     "seeds": c["seeds"]})
    return pd.DataFrame(rows).drop_duplicates(["rate", "config"])


def table_config(table: list[list[int]]) -> str:
    """A vLLM-form table as the configuration it is served as (a table of one k as that k)."""
    if len(table) == 1:
        return f"fixed:k={table[0][2]}"
    return "batch_adaptive:schedule=" + json.dumps(table, separators=(",", ":"))


def served_as(recommendation: dict) -> str:
    """The configuration a tune's recommendation is served as: its fixed k, or its table."""
    if recommendation["policy"] == "fixed":
        return f"fixed:k={recommendation['params']['k']}"
    return table_config(json.loads(recommendation["params"]["schedule"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, required=True,
                    help="trace.npz of `spectune record --engine vllm --split train`")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.5, 3.0])
    ap.add_argument("--requests", type=int, default=24, help="measured requests per rate")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--ks", default="0,2,4,6", help="fixed k measured beside the recommendation")
    ap.add_argument("--seeds", type=int, default=20, help="tune's Poisson windows per candidate")
    ap.add_argument("--profile", default="vllm-cpu-smollm2", help="vLLM's latency profile")
    ap.add_argument("--measured", type=Path, help="an earlier run's OUT/validate: simulate its "
                    "measured runs again instead of serving them (its configurations must "
                    "include this run's)")
    ap.add_argument("--out", type=Path, default=Path("runs/vllm-loop"))
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rates = [f"{r:g}" for r in args.rates]
    lengths = out / "train_lengths.csv"
    if not lengths.is_file():
        train_lengths(lengths, args.output_tokens)
    common = [*SCENARIO, "--profile", args.profile, "--workload", "poisson", "--lengths",
              str(lengths), "--requests", str(args.requests), "--acceptance",
              str(args.recording.resolve()), "--rates", *rates, "--seeds", str(args.seeds),
              "--search", "grid", "--k-max", "6", "--no-report", "--format", "json"]
    if not (out / "tune" / "tune.json").is_file():
        run(["tune", *common, "--policies", "fixed", "--out", str(out / "tune")],
            out / "tune.log")
    tune = json.loads((out / "tune" / "tune.json").read_text())
    best_ks = {int(r["params"]["k"]) for r in tune["best_fixed"]}
    export = json.loads((out / "tune" / "exports" / "vllm_speculative_config.json").read_text())
    table = export["speculative_config"].get("num_speculative_tokens_per_batch_size")
    # a table of one k is that fixed k, measured already
    table_spec = table_config(table) if table and len(table) > 1 else None
    recommended = {f"{r['rate']:g}": served_as(r) for r in tune["recommendations"]}
    predicted = predictions(out / "tune")  # the table's rows among them
    ks = sorted({int(k) for k in args.ks.split(",")} | best_ks)
    configs = [f"fixed:k={k}" for k in ks] + ([table_spec] if table_spec else [])
    if not (out / "validate" / "validate.csv").is_file():
        again = [] if args.measured is None else ["--measured", str(args.measured.resolve())]
        run(["validate", "--engine", "vllm", "--profile", args.profile, "--rates", *rates,
             "--requests", str(args.requests), "--output-tokens", str(args.output_tokens),
             "--policies", ",".join(configs), *again, "--format", "json", "--out",
             str(out / "validate")], out / "validate.log")
    rows = pd.read_csv(out / "validate" / "validate.csv")
    e2e = rows[rows.metric == "e2e_mean_s"].rename(columns={
        "policy": "config", "measured": "measured_e2e_s", "simulated": "replayed_e2e_s"})
    table_df = e2e[["rate", "config", "measured_e2e_s", "replayed_e2e_s"]].merge(
        predicted, on=["rate", "config"], how="left")
    verdicts = []
    for rate, group in table_df.groupby("rate"):
        best = group.measured_e2e_s.min()
        rec = group[group.config == recommended[f"{rate:g}"]].measured_e2e_s.iloc[0]
        tau = kendalltau(group.predicted_e2e_s, group.measured_e2e_s).statistic
        tau_replay = kendalltau(group.replayed_e2e_s, group.measured_e2e_s).statistic
        verdicts.append({"rate": rate, "recommended": recommended[f"{rate:g}"],
                         "best_measured": group.loc[group.measured_e2e_s.idxmin(), "config"],
                         "recommended_vs_best_pct": (rec / best - 1) * 100,
                         "kendall_tau_tune": tau, "kendall_tau_replay": tau_replay})
    pd.set_option("display.width", 200)
    print(table_df.sort_values(["rate", "config"]).to_string(index=False, float_format="%.3f"))
    print()
    print(pd.DataFrame(verdicts).to_string(index=False, float_format="%.3f"))
    (out / "loop.json").write_text(json.dumps(
        {"table": table_df.to_dict("records"), "verdicts": verdicts, "export": export,
         "recommended": recommended}, indent=1))
    return 0


if __name__ == "__main__":
    from simulator.errors import ConfigError

    try:
        sys.exit(main())
    except ConfigError as e:  # bad input: one line, no traceback
        sys.exit(f"error: {e}")

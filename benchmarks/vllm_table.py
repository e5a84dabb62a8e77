"""The table docs/vllm.md shows for a `spectune validate --engine vllm` folder: per configuration
and rate, the simulated value's error against vLLM's (TTFT, TPOT, E2E mean and p99, tokens per
step), the iterations, the iteration-level agreement, how fast vLLM ran against its profile
(busy ratio) and the speed-matched E2E error (a diagnostic: see spectune/validate_vllm.py).

    python benchmarks/vllm_table.py runs/vllm-loop/validate
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

METRICS = ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s", "e2e_p99_s", "emitted_per_step")


def folder_of(config: str) -> str:
    if config.startswith("fixed:k="):
        return f"k{config.removeprefix('fixed:k=')}"
    table = json.loads(config.removeprefix("batch_adaptive:schedule="))
    return "table-" + "_".join(f"{lo}-{hi}x{k}" for lo, hi, k in table)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args()
    rows = pd.read_csv(args.folder / "validate.csv")
    matched = pd.read_csv(args.folder / "speed-matched" / "validate.csv")
    print("| configuration | rate | TTFT mean | TPOT mean | E2E mean | E2E p99 | tokens/step | "
          "iterations sim/vLLM | iteration median \\|err\\| (matched) | vLLM/profile | "
          "E2E mean, speed-matched |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (config, rate), group in rows.groupby(["policy", "rate"], sort=False):
        err = group.set_index("metric").error_pct
        m = matched[(matched.policy == config) & (matched.rate == rate)].set_index("metric")
        check = json.loads((args.folder / folder_of(config) / f"rate{rate:g}" /
                            "check.json").read_text())
        agree = check["iteration_agreement"]
        cells = [f"{err[name]:+.1f}%" for name in METRICS]
        print(f"| {config} | {rate:g}/s | " + " | ".join(cells) +
              f" | {check['iterations']['simulated']}/{check['iterations']['vllm']} | "
              f"{agree['median_abs_error_pct']:.1f}% ({agree['matched']}) | "
              f"{check['busy_ratio']:.3f} | {m.error_pct['e2e_mean_s']:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

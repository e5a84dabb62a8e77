"""What `validate` prints and writes: metrics per run, simulated vs measured rows, the table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

#: one row per (policy, rate, metric); `simulated_uncorrected`: the profile alone (no host time,
#: no drift scale), to show what the corrections are worth
ROW_KEYS = ("policy", "rate", "metric", "simulated", "measured", "error_pct",
            "simulated_uncorrected")


def metrics(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float]:
    """The compared metrics, flat: ttft/tpot/e2e mean, p50, p99 (s), emitted and drafted per
    decode request-step, throughput."""
    from simulator import summarize

    s = summarize(requests, steps)
    out = {}
    for name in ("ttft", "tpot", "e2e"):
        for q in ("mean", "p50", "p99"):
            out[f"{name}_{q}_s"] = s[f"{name}_s"][q]
    out["emitted_per_step"] = s["mean_emitted_per_step"]
    out["drafted_per_step"] = s["mean_k"]  # tokens actually drafted (n-gram may run out)
    out["throughput_tokens_per_s"] = s["throughput_tokens_per_s"]
    return out


def compare(label: str, rate: float, sim: dict, measured: dict, bare: dict) -> list[dict]:
    """Rows of ROW_KEYS: error_pct = (simulated - measured) / measured * 100."""
    rows = []
    for metric, m in measured.items():
        s = sim[metric]
        err = (s - m) / m * 100 if m and np.isfinite(m) and np.isfinite(s) else float("nan")
        rows.append({"policy": label, "rate": rate, "metric": metric, "simulated": s,
                     "measured": m, "error_pct": err, "simulated_uncorrected": bare[metric]})
    return rows


def write_records(out: Path, label: str, rate: float, live, sim) -> None:
    """Both sides' requests and steps of one run, and the live iterations' pass times."""
    from spectune.files import write_csv

    folder = out / "runs" / f"{label.replace(':', '_').replace('=', '')}_rate{rate:g}"
    folder.mkdir(parents=True, exist_ok=True)
    steps = live.steps.assign(pass_s=live.pass_s) if live.pass_s is not None else live.steps
    write_csv(folder / "live_requests.csv", live.requests)
    write_csv(folder / "live_steps.csv", steps)
    write_csv(folder / "sim_requests.csv", sim.requests)
    write_csv(folder / "sim_steps.csv", sim.steps)


def write_results(out: Path, rows: list[dict], meta: dict) -> None:
    import pandas as pd

    from spectune.files import write_csv, write_json

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "validate.csv", pd.DataFrame(rows, columns=list(ROW_KEYS)))
    write_json(out / "validate.json", {"rows": rows, "meta": meta})


def format_table(rows: list[dict], meta: dict | None = None) -> str:
    """Side by side per policy and rate: simulated, measured, error; with where the profile,
    the drift scale and the host time came from."""
    lines = []
    runs = {}
    if meta:
        lines.append(f"model {meta['model']} ({meta.get('weights', 'real')} weights)   "
                     f"drafter {meta['drafter']}")
        if meta.get("replay"):
            lines.append(f"acceptance replayed from {meta['replay']['acceptance']}: "
                         f"{meta['replay']['source']}")
        lines.append(meta["profile"])
        lines.append(f"drift: {meta['drift']['note']}")
        for label, h in meta["host"].items():
            lines.append(f"host time of {label}: {h['step_overhead_s'] * 1e3:.2f} ms/iteration "
                         f"+ {h['per_seq_overhead_s'] * 1e3:.3f} ms/request "
                         f"+ {h['per_draft_token_s'] * 1e3:.3f} ms/draft "
                         f"({h['iterations']} calibration iterations)")
        runs = {(r["policy"], r["rate"]): r for r in meta["runs"]}
    key = None
    for r in rows:
        if (r["policy"], r["rate"]) != key:
            key = (r["policy"], r["rate"])
            run = runs.get(key)
            scale = f"   (pass scale {run['pass_scale']:.3f})" if run else ""
            lines += ["", f"{r['policy']} at {r['rate']:g} req/s{scale}",
                      f"  {'metric':<24}{'simulated':>12}{'measured':>12}{'error':>9}"
                      f"{'uncorrected':>12}"]
        lines.append(f"  {r['metric']:<24}{_fmt(r['simulated'], r['metric'])}"
                     f"{_fmt(r['measured'], r['metric'])}{r['error_pct']:>+8.1f}%"
                     f"{_fmt(r['simulated_uncorrected'], r['metric'])}")
    return "\n".join(lines)


def _fmt(v: float, metric: str) -> str:
    if v is None or not np.isfinite(v):
        return f"{'-':>12}"
    if metric.endswith("_s") and not metric.endswith("_per_s"):
        return f"{v * 1e3:>9.1f} ms"
    return f"{v:>12.3f}"

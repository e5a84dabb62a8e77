"""The loop on a real vLLM with a calibrated profile, offline: tune with the profile calibrated
to the speed the servers ran at before the measured windows, and compare the recommendation and
the predicted ranking with what vLLM measured.

The folder of a `spectune validate --engine vllm --calibrate` holds, for every configuration
and rate, a calibration window served just before the measured one on the same server, and
the measured window itself. Per rate, the speed known before that rate's measured windows is
pooled over every server: each server's windows before them (its calibration window at the
rate, its earlier rates' windows weighing `POOL_KEEP` of the next, as `validate --calibrate`
pools one server's), summed over the servers. The profile is written again with that speed in
its meta (`ProfiledLatency`'s calibration: each target phase and the host time scaled), and
`spectune tune` (the loop's scenario: vLLM's scheduler and KV, the training questions'
lengths, the recording made on vLLM, 20 Poisson windows) weighs the folder's configurations
with it, beside the same tune with the plain profile. Nothing is served: the candidates are
the configurations the folder measured, so every recommendation has a measured mean E2E.

Per rate and profile: the recommendation, its measured mean E2E against the best measured
configuration's (the loop's target: within 3%), and Kendall's tau between the tune's predicted
and vLLM's measured mean E2E over the configurations (target: >= 0.8).

    python benchmarks/vllm_loop_calibrated.py runs/vllm-calibrated-matched \\
        --recording runs/vllm-record/trace.npz --out runs/vllm-loop-calibrated
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.vllm_calibration import kendall_tau  # noqa: E402
from benchmarks.vllm_loop import SCENARIO, predictions, train_lengths  # noqa: E402
from simulator.latency_table import table_paths  # noqa: E402

SPECTUNE = [sys.executable, "-m", "spectune"]
POLICIES = ("fixed:k=0,fixed:k=1,fixed:k=2,fixed:k=3,fixed:k=4,fixed:k=6,"
            "batch_adaptive:schedule=[[1,1,3],[2,4,2],[5,128,1]]")


def speeds_before(folder: Path, v, say) -> dict[float, object]:
    """Per rate, the speed every server ran at before its measured window at that rate
    (`WindowSpeed`), pooled over the servers."""
    from live.vllm_acceptance import ngram_trace
    from spectune.validate_vllm import (
        POOL_KEEP,
        calibration_times,
        kv_tokens,
        load_profile,
        measured_runs,
        simulate_run,
        validation_workloads,
    )
    from spectune.vllm_speed import ServedTimes, pooled

    workloads = validation_workloads(v)
    table = load_profile(v)
    hour: dict[float, ServedTimes] = {}
    for config in v.configs:
        runs, log = measured_runs(v, config, workloads, None, folder, lambda *_: None)
        capacity = kv_tokens(log)
        before = None  # this server's windows so far, the later weighing more
        for rate in v.rates:
            label = f"rate{rate:g}"
            window = calibration_times(v, config, workloads, runs, label, capacity, table)
            before = pooled(before, window, POOL_KEEP)
            hour[rate] = before if rate not in hour else hour[rate] + before
            (wl, ids), run = workloads[label], runs[label]
            trace = ngram_trace(ids, run.outputs, 16, {"source": f"vLLM, {config.label}"})
            sim, latency = simulate_run(v, config, wl, trace, capacity, table)
            before = pooled(before, ServedTimes.of(run, sim.steps, latency), POOL_KEEP)
        say(f"  {config.label}: windows read")
    return {rate: times.speed() for rate, times in hour.items()}


def calibrated_profile(profile: Path, speed, rate: float, folder: Path, out: Path) -> Path:
    """A copy of the profile whose meta holds `speed` (ProfiledLatency's calibration)."""
    from simulator.latency_table import LatencyTable

    table = LatencyTable.load(profile)
    meta = dict(table.meta)
    meta["calibration"] = {
        "phase_scales": dict(speed.phases), "host_scale": speed.host,
        "source": f"{folder}: every server's windows before its measured window at "
                  f"{rate:g} req/s ({speed.windows} window(s), pooled)"}
    out.mkdir(parents=True, exist_ok=True)
    LatencyTable(table.rows, meta).save(out / "latency")
    return out / "latency"


def tune(profile: Path, policies: str, rates: list[float], lengths: Path, recording: Path,
         requests: int, seeds: int, out: Path) -> pd.DataFrame:
    """`spectune tune` of the configurations over `rates` with `profile`: each configuration's
    predicted mean E2E per rate. Kept in `out` and reused only while its command and the
    contents of the files it reads are the same (`inputs.json`)."""
    cmd = ["tune", *SCENARIO, "--profile", str(profile), "--workload", "poisson",
           "--lengths", str(lengths), "--requests", str(requests), "--acceptance",
           str(recording), "--rates", *[f"{r:g}" for r in rates], "--seeds", str(seeds),
           "--search", "grid", "--k-max", "6", "--policies", policies, "--no-report",
           "--format", "json", "--out", str(out)]
    inputs = {"command": cmd, "contents": {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
                                           for p in (*table_paths(profile), lengths, recording)}}
    if not ((out / "tune.json").is_file() and (out / "inputs.json").is_file()
            and json.loads((out / "inputs.json").read_text()) == inputs):
        shutil.rmtree(out, ignore_errors=True)
        print("$ spectune " + " ".join(cmd), flush=True)
        done = subprocess.run(SPECTUNE + cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            sys.exit(f"spectune tune failed ({done.returncode})")
        (out / "inputs.json").write_text(json.dumps(inputs, indent=1))
    return predictions(out)


def measured_e2e(folder: Path) -> pd.DataFrame:
    """rate, config, measured mean E2E: a validation folder's runs."""
    rows = pd.read_csv(folder / "validate.csv")
    return rows[rows.metric == "e2e_mean_s"].rename(columns={
        "policy": "config", "measured": "measured_e2e_s"})[["rate", "config", "measured_e2e_s"]]


def across_windows(windows: list[pd.DataFrame], predicted: pd.DataFrame) -> list[dict]:
    """Per rate, over the windows (this folder's first, then the others): Kendall's tau
    between each pair of vLLM's windows' rankings of the configurations (how far one window's
    ranking can be trusted), the tune's against each window and against their mean, and its
    recommendation against the best of the mean."""
    both = predicted
    for i, window in enumerate(windows):
        both = both.merge(window.rename(columns={"measured_e2e_s": f"w{i}"}),
                          on=["rate", "config"])
    names = [f"w{i}" for i in range(len(windows))]
    rows = []
    for rate, g in both.groupby("rate"):
        g = g.reset_index(drop=True)
        mean = list(g[names].mean(axis=1))
        tune = list(g.predicted_e2e_s)
        rows.append({
            "rate": rate,
            "tau_vllm_vs_vllm": [round(kendall_tau(list(g[a]), list(g[b])), 2)
                                 for i, a in enumerate(names) for b in names[i + 1:]],
            "tau_tune_vs_each": [round(kendall_tau(tune, list(g[a])), 2) for a in names],
            "tau_tune_vs_mean": kendall_tau(tune, mean),
            "best_of_mean": g.config.iloc[int(pd.Series(mean).idxmin())],
            "recommended_vs_best_of_mean_pct": (
                mean[int(g.predicted_e2e_s.idxmin())] / min(mean) - 1) * 100})
    return rows


def main() -> int:
    from spectune.flags import parse_policy_list
    from spectune.validate_vllm import VllmValidation, configs_of

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="a `validate --engine vllm --calibrate` --out")
    ap.add_argument("--recording", type=Path, required=True,
                    help="trace.npz of `spectune record --engine vllm --split train`")
    ap.add_argument("--profile", type=Path,
                    default=Path("benchmarks/results/vllm-epyc/latency-idle"),
                    help="the profile the folder's validation used")
    ap.add_argument("--policies", default=POLICIES,
                    help="the configurations the folder's validation measured")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.5, 3.0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="the folder's validation seed")
    ap.add_argument("--seeds", type=int, default=20, help="tune's Poisson windows")
    ap.add_argument("--other-windows", type=Path, nargs="+", default=[],
                    help="other such folders, the same configurations on other windows: also "
                         "how vLLM ranks them across the windows, and the tune against their "
                         "mean")
    ap.add_argument("--out", type=Path, default=Path("runs/vllm-loop-calibrated"))
    args = ap.parse_args()
    if not (args.folder / "validate.csv").is_file():
        sys.exit(f"{args.folder}: no validate.csv; give the --out of a `spectune validate "
                 "--engine vllm --calibrate`")
    if not any(args.folder.glob("*/rate*-calibration")):
        sys.exit(f"{args.folder}: no calibration windows; it was validated without "
                 "--calibrate")
    from simulator.latency_table import LatencyTable
    from simulator.profiled import CALIBRATION_KEY

    if CALIBRATION_KEY in LatencyTable.load(args.profile).meta:
        sys.exit(f"{args.profile}: this profile is calibrated already; give the plain profile "
                 "the folder's validation ran with")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    v = VllmValidation(profile=str(args.profile), venv=ROOT / ".venv-vllm", model_dir=Path("."),
                       rates=tuple(args.rates),
                       configs=configs_of(parse_policy_list(args.policies)),
                       requests=args.requests, output_tokens=args.output_tokens,
                       seed=args.seed, calibrate=True)
    lengths = out / f"train_lengths-{args.output_tokens}.csv"
    if not lengths.is_file():
        train_lengths(lengths, args.output_tokens)
    recording = args.recording.resolve()
    measured = measured_e2e(args.folder)
    print(f"{args.folder}: the speed before each rate's measured windows")
    speeds = speeds_before(args.folder, v, print)
    profile_path = args.profile.resolve()
    predicted = {"plain": tune(profile_path, args.policies, args.rates, lengths, recording,
                               args.requests, args.seeds, out / "tune-plain")}
    parts = []
    for rate in args.rates:
        speed = speeds[rate]
        print(f"  {rate:g} req/s: " + ", ".join(f"{p} {x:.3f}x" for p, x in speed.phases.items())
              + f", host {speed.host:.3f}x ({speed.windows} windows)")
        profile = calibrated_profile(profile_path, speed, rate, args.folder,
                                     out / f"profile-rate{rate:g}")
        parts.append(tune(profile, args.policies, [rate], lengths, recording, args.requests,
                          args.seeds, out / f"tune-calibrated-rate{rate:g}"))
    predicted["calibrated"] = pd.concat(parts, ignore_index=True)
    verdicts = []
    for name, table in predicted.items():
        both = measured.merge(table, on=["rate", "config"], how="inner")
        for rate, group in both.groupby("rate"):
            best = group.measured_e2e_s.min()
            pick = group.loc[group.predicted_e2e_s.idxmin()]
            verdicts.append({
                "profile": name, "rate": rate, "recommended": pick.config,
                "best_measured": group.loc[group.measured_e2e_s.idxmin(), "config"],
                "recommended_vs_best_pct": (pick.measured_e2e_s / best - 1) * 100,
                "kendall_tau": kendall_tau(list(group.predicted_e2e_s),
                                           list(group.measured_e2e_s)),
                "configs": len(group)})
    pd.set_option("display.width", 200)
    frame = pd.DataFrame(verdicts)
    print(frame.to_string(index=False, float_format="%.3f"))
    windows = []
    if args.other_windows:
        every = [measured, *map(measured_e2e, args.other_windows)]
        windows = across_windows(every, predicted["calibrated"])
        for row, plain in zip(windows, across_windows(every, predicted["plain"])):
            row["tau_plain_vs_mean"] = plain["tau_tune_vs_mean"]  # the tune without calibration
    if windows:
        others = ", ".join(map(str, args.other_windows))
        print(f"\nwith {others} (the same configurations, other windows; tau_vllm_vs_vllm "
              "for each pair):")
        print(pd.DataFrame(windows).to_string(index=False, float_format="%.2f"))
    (out / "loop.json").write_text(json.dumps(
        {"folder": str(args.folder), "profile": str(args.profile),
         "speeds": {f"{r:g}": s.to_json() for r, s in speeds.items()},
         "verdicts": verdicts, "across_windows": windows,
         "predicted": {k: t.to_dict("records") for k, t in predicted.items()},
         "measured": measured.to_dict("records")}, indent=1))
    return 0


if __name__ == "__main__":
    from simulator.errors import ConfigError

    try:
        sys.exit(main())
    except ConfigError as e:  # bad input: one line, no traceback
        sys.exit(f"error: {e}")

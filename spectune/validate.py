"""The `validate` job: serve a workload live (real forward passes, real clock), simulate the same
workload, and compare them metric by metric.

For every policy and rate the live engine serves the workload; its outputs are recorded as a
speculation trace (`live.recorder.record_outputs`), so the simulator replays acceptance exactly;
the simulator serves the same workload with the same scheduler, KV capacity and policy. Its other
inputs are measured, never fitted to the compared runs (validate_calibration.py): pass times from
a profile timed between the runs, scaled for drift (--no-drift), and a host time per iteration
per policy (--no-overhead); rows also carry `simulated_uncorrected`, with neither. Batch-level
policies (goodput) may not replay exactly. What replays, and the why of each input:
docs/validate.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from simulator import ConfigError
from spectune.validate_calibration import (
    NO_HOST,
    DriftProbe,
    HostFit,
    fit_host,
    latency_for,
    validation_grid,
)
from spectune.validate_report import (
    ROW_KEYS,
    compare,
    format_table,
    metrics,
    write_records,
    write_results,
)
from spectune.validate_setup import (
    Setup,
    build_workload,
    calibration_workload,
    record_trace,
    setup_models,
)
from spectune.validate_spec import ValidateSpec
from traces import UserNote

__all__ = ["ROW_KEYS", "ValidateSpec", "add_parser", "format_table", "main", "run_validate"]

# -- the job ------------------------------------------------------------------------------------

WARM_ROUNDS = 2  # profile rounds before the first live run (the first one also warms up)


@dataclass
class _Run:
    label: str
    name: str
    params: dict
    rate: float
    live: object
    trace: object
    before: int  # the profile round just before the run (the next one comes just after)
    latency: object  # the cost model the live policy read: the simulated policy reads it too


def _live(setup: Setup, policy, latency, wl, prompts, realtime: bool = True, replay=None):
    from live.engine import LiveEngine
    from simulator import StepCostModel

    engine = LiveEngine(setup.target, setup.drafter, policy, setup.scheduler,
                        cost=StepCostModel(latency),
                        kv_capacity_tokens=setup.scheduler.kv_capacity_tokens,
                        temperature=setup.temperature, seed=setup.seed, replay=replay)
    return engine.run(wl, prompts, realtime=realtime)


def run_validate(spec: ValidateSpec, out: Path | None = None, log=None) -> list[dict]:
    """Live vs simulated for every policy and rate; rows of ROW_KEYS (written to `out`, with
    the records of every run and a meta block). Torch's thread count is restored afterwards."""
    from models.runtime import threads_restored

    with threads_restored():
        if out is not None:
            return _run(spec, out, out, log)
        with tempfile.TemporaryDirectory(prefix="spectune-validate-") as scratch:
            return _run(spec, None, Path(scratch), log)


def _say(log, text: str) -> None:
    if log is not None:
        print(text, file=log, flush=True)


def _probe(spec: ValidateSpec, setup: Setup, workloads, scratch: Path) -> DriftProbe:
    """The profile rounds' grid, shaped for every workload served."""
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import LatencyTable

    prompts = np.concatenate([wl.prompt_tokens for wl, _ in workloads.values()])
    outputs = np.concatenate([wl.output_tokens for wl, _ in workloads.values()])
    drafting = any(not (name == "fixed" and params.get("k", "0") == "0")
                   for _, name, params in spec.policy_specs)
    grid = validation_grid(spec.max_num_seqs, spec.k_max, prompts, outputs, drafting,
                           setup.drafter.tree)
    fixed = LatencyTable.load(resolve_profile(spec.profile)) if spec.profile else None
    draft = None if setup.drafter.model_free else setup.drafter.timing_model
    if fixed is not None:
        check_profile_models(fixed, setup.target.config.shape,
                             None if draft is None else draft.config.shape, spec.profile)
    return DriftProbe(setup.target, draft, grid, scratch / "profile", fixed)


#: what makes two model shapes time alike (their names and sources may differ)
_SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")


def check_profile_models(table, target, draft, name) -> None:
    """A given --profile must time the models validate serves: a profile of other models would
    predict other passes, and the comparison would be silently wrong."""

    def key(shape):
        return None if shape is None else tuple(getattr(shape, f) for f in _SHAPE_FIELDS)

    def text(shape):
        return "no draft model" if shape is None else shape.name

    for role, served, timed in (("target", target, table.target),
                                ("draft", draft, table.draft)):
        if key(served) != key(timed) and not (role == "draft" and served is None):
            raise ConfigError(
                f"--profile {name} times {text(timed)} as the {role}, but this validation "
                f"serves {text(served)}: give a profile of the same models (spectune profile "
                f"--target/--draft), or leave --profile out to time one between the runs")


def _run(spec: ValidateSpec, out: Path | None, scratch: Path, log) -> list[dict]:
    from policies import make_policy

    started = time.perf_counter()
    setup = setup_models(spec)
    vocab = setup.vocab
    workloads = {rate: build_workload(spec, rate, vocab, setup.tokenizer)
                 for rate in spec.rate_list}
    policies = usable_policies(spec, setup, next(iter(workloads.values()))[0])
    probe = _probe(spec, setup, workloads, scratch)
    while probe.rounds < WARM_ROUNDS:
        probe.round()
        _say(log, f"  profile round {probe.rounds}: {probe.round_times[-1]:.1f} s")
    hosts: dict[str, HostFit] = {}
    runs: list[_Run] = []
    for rate, (wl, prompts) in workloads.items():
        for label, name, params in policies:
            if label not in hosts:
                hosts[label] = _calibrate_host(spec, setup, probe, make_policy(name, params))
                _say(log, f"  host time of {label}: {_host_text(hosts[label])}")
            latency = hosts[label].latency(probe.table(), setup.drafter)
            policy = make_policy(name, params)
            replayed = setup.replay_trace(wl)
            live = _live(setup, policy, latency, wl, prompts, replay=replayed)
            probe.round()
            want_kl = "kl" in type(policy).signals
            trace = replayed if replayed is not None else record_trace(
                setup.target, setup.drafter, prompts, live.outputs, spec.k_max, want_kl,
                spec.temperature)
            runs.append(_Run(label, name, params, rate, live, trace, probe.rounds - 2, latency))
            _say(log, f"  {label} at {rate:g} req/s: live {live.meta['wall_s']:.1f} s, "
                      f"then a profile round of {probe.round_times[-1]:.1f} s")
    rows, run_meta = _compare_all(spec, setup, probe, hosts, runs, workloads, out)
    replay = None
    if setup.acceptance is not None and runs:
        replay = {"acceptance": setup.acceptance,
                  "source": runs[0].trace.meta.get("source", "")}
    meta = _meta(spec, setup, probe, hosts, run_meta, time.perf_counter() - started, replay)
    if out is not None:
        write_results(out, rows, meta)
    return rows


def usable_policies(spec: ValidateSpec, setup: Setup, workload) -> list:
    """The policies to run, checked before any live run: in replay mode, one that reads a
    signal the replayed acceptance lacks (kld_variance's KL, with an n-gram recording) is an
    error when the user named it, and is left out with a note from the default list."""
    from policies import make_policy
    from simulator.acceptance import signals_needed

    specs = spec.policy_specs
    trace = setup.replay_trace(workload)
    if trace is None:  # live acceptance: the recorder records what each policy reads
        return specs
    available = trace.signals_available()
    keep, dropped = [], []
    for label, name, params in specs:
        missing = signals_needed(make_policy(name, params)) - available
        (dropped if missing else keep).append((label, name, params, missing))
    if not dropped:
        return specs
    why = "; ".join(f"{label} reads {', '.join(sorted(missing))}"
                    for label, _, _, missing in dropped)
    if spec.policies is not None or not keep:
        raise ConfigError(f"--acceptance {setup.acceptance} lacks signals that policies read "
                          f"({why}); drop those policies, or replay a recording that has them")
    warnings.warn(f"left out of the default policies: {why}, which --acceptance "
                  f"{setup.acceptance} does not record", UserNote, stacklevel=2)
    return [(label, name, params) for label, name, params, _ in keep]


def _calibrate_host(spec: ValidateSpec, setup: Setup, probe: DriftProbe, policy) -> HostFit:
    """Host time per iteration of this policy's live engine, fitted on its calibration run."""
    if not spec.overhead:
        return NO_HOST
    wl, prompts = calibration_workload(spec, setup.vocab, setup.tokenizer)
    latency = latency_for(probe.table(), setup.drafter)
    return fit_host(_live(setup, policy, latency, wl, prompts, realtime=False,
                          replay=setup.replay_trace(wl)))


def _host_text(h: HostFit) -> str:
    return (f"{h.step_overhead_s * 1e3:.2f} ms + {h.per_seq_overhead_s * 1e3:.3f} ms/request "
            f"+ {h.per_draft_token_s * 1e3:.3f} ms/draft")


def _compare_all(spec, setup, probe, hosts, runs, workloads, out):
    """Simulate every run with the final profile, its host model and its drift scale."""
    from policies import make_policy
    from simulator import StepCostModel, simulate

    table = probe.table()
    bare = latency_for(table, setup.drafter)
    capacity = setup.scheduler.kv_capacity_tokens
    rows, run_meta = [], []
    for run in runs:
        scale = probe.scale(run.before, run.before + 1) if spec.drift else 1.0
        latency = hosts[run.label].latency(table, setup.drafter, scale)
        wl = workloads[run.rate][0]
        seen = StepCostModel(run.latency)  # what the live policy read
        sims = [simulate(wl, lat, run.trace, make_policy(run.name, run.params), capacity,
                         setup.scheduler, policy_cost=seen) for lat in (latency, bare)]
        measured = metrics(run.live.requests, run.live.steps)
        rows += compare(run.label, run.rate, metrics(sims[0].requests, sims[0].steps),
                        measured, metrics(sims[1].requests, sims[1].steps))
        host = run.live.steps["duration_s"].to_numpy() - run.live.pass_s
        run_meta.append({"policy": run.label, "rate": run.rate, "pass_scale": scale,
                         "live_wall_s": run.live.meta["wall_s"],
                         "rounds_around": [run.before, run.before + 1],
                         "live_host_mean_ms": float(np.nanmean(host) * 1e3),
                         "live_pass_share": float(np.nansum(run.live.pass_s)
                                                  / run.live.steps["duration_s"].sum())})
        if out is not None:
            write_records(out, run.label, run.rate, run.live, sims[0])
    return rows, run_meta


def _meta(spec, setup, probe, hosts, runs, wall_s, replay: dict | None) -> dict:
    from models.runtime import threads, torch_version

    table = probe.table()
    scales = [r["pass_scale"] for r in runs]
    drift = (f"each run's passes scaled by the speed measured in the profile rounds around it "
             f"({min(scales):.3f}-{max(scales):.3f})" if spec.drift and scales
             else "not corrected (--no-drift)")
    return {"spec": asdict(spec), "model": setup.target.config.shape.name,
            "drafter": setup.drafter.name, "replay": replay,
            "weights": "random (replay mode)" if setup.acceptance is not None else (
                "real" if spec.model == "smollm2" else "random"),
            "profile": latency_for(table, setup.drafter).source
            + ("" if spec.profile else f", {probe.rounds} rounds between the live runs"),
            "profile_rounds_s": probe.round_times,
            "scheduler": setup.scheduler.__dict__, "threads": threads(),
            "torch_version": torch_version(),
            "dtype": str(setup.target.config.dtype).removeprefix("torch."),
            "drift": {"corrected": spec.drift, "note": drift},
            "host": {label: asdict(h) for label, h in hosts.items()},
            "runs": runs, "wall_s": wall_s}


# -- CLI ----------------------------------------------------------------------------------------


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `spectune validate` on the CLI's subparsers."""
    from spectune.flags import add_dataclass_flags

    p = subparsers.add_parser(
        "validate", help="serve live and simulate the same workload; compare",
        description="Serve a workload live (real forward passes, real clock) and simulate the "
        "same workload with the profile's latency, the same scheduler and policy, and the "
        "acceptance the live run saw; print simulated vs measured TTFT, TPOT, E2E and tokens per "
        "step. Needs torch.")
    add_dataclass_flags(p, ValidateSpec, "what to validate", skip=("rates",))
    p.add_argument("--rates", nargs="+", type=float, default=None, metavar="REQ_PER_S",
                   help="arrival rates (default: 0.5 4; quick: 2 50)")
    p.add_argument("--out", type=Path, default=Path("runs/validate"),
                   help="folder for validate.csv, validate.json and the records")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(args: argparse.Namespace) -> int:
    import json

    from spectune.console import require_torch
    from spectune.files import prepare_out, to_json
    from spectune.flags import dataclass_from_args

    require_torch("validate")
    rates = tuple(args.rates) if args.rates else None
    spec = dataclass_from_args(ValidateSpec, args, rates=rates)
    prepare_out(args.out)
    tables = {}
    if spec.engine == "vllm":
        tables = _validate_vllm(spec, args.out)
        rows = tables["validate"]
    else:
        rows = run_validate(spec, args.out, log=sys.stderr)
    if args.format == "json":
        print(to_json(rows))
        return 0
    meta = json.loads((args.out / "validate.json").read_text())["meta"]
    print(format_table(rows, meta if spec.engine != "vllm" else None))
    print(f"\nwritten to {args.out}/validate.csv and validate.json")
    if spec.engine == "vllm":
        print(f"speed-matched diagnostic (passes and host time scaled to each run's own "
              f"logged speed): {args.out}/speed-matched/validate.csv")
    if "calibrated" in tables:
        print("\ncalibrated (passes per phase and host time scaled to how fast each run's "
              "server ran its windows before it, its calibration window weighing most):")
        print(format_table(tables["calibrated"], None))
        print(f"written to {args.out}/calibrated/validate.csv")
    return 0


def _validate_vllm(spec: ValidateSpec, out: Path) -> dict[str, list[dict]]:
    """`--engine vllm` (spectune/validate_vllm.py), written as validate writes its results;
    returns its tables (`run_vllm_validation`)."""
    from live.vllm_server import resolve_venv
    from spectune.flags import parse_policy_list
    from spectune.validate_vllm import VllmValidation, configs_of, run_vllm_validation

    venv = resolve_venv(spec.vllm_venv)
    policies = parse_policy_list(spec.policies or "fixed:k=0,fixed:k=4")
    v = VllmValidation(profile=spec.profile, venv=venv,
                       model_dir=venv / "models" / "SmolLM2-135M-Instruct",
                       rates=spec.rate_list, configs=configs_of(policies), requests=spec.n_requests,
                       output_tokens=spec.n_output, seed=spec.seed, workload=spec.workload,
                       calibrate=spec.calibrate)
    tables = run_vllm_validation(
        v, out, say=lambda text: print(text, file=sys.stderr),
        measured=None if spec.measured is None else Path(spec.measured))
    meta = {"engine": "vllm", "spec": asdict(spec), "profile": str(spec.profile)}
    write_results(out, tables["validate"], meta)
    write_results(out / "speed-matched", tables["speed-matched"], meta | {
        "note": "passes per phase and host time scaled to each run's own logged speed: a "
                "diagnostic"})
    if "calibrated" in tables:
        write_results(out / "calibrated", tables["calibrated"], meta | {
            "note": "passes per phase and host time scaled to how fast each run's server ran "
                    "its windows before it (the calibration window just before it weighing "
                    "most, each earlier one half the next)"})
    return tables

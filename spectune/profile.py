"""The `profile` job: time real forward passes, fit the profiled model, report its error.

Steps: build random-weight models of the catalog shapes on the device; sweep the grid (resumable);
time random ragged batches for real; hold out interior grid points and refit to measure the
interpolation error; predict the ragged batches with the full model; compare a roofline built
from the device's measured peaks. Everything lands in `--out`: the table (`latency.csv`,
`latency.meta.json`), `ragged.csv` and `summary.json`.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator import ConfigError, get_model

if TYPE_CHECKING:
    import pandas as pd

DTYPES = ("fp32", "bf16", "fp16")
#: the num_speculative_tokens a vLLM profile times by default (spectune.profile_vllm)
VLLM_KS: tuple[int, ...] = (0, 2, 4, 6)


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--{name.replace('_', '-')} expects integers separated by commas, "
                         f"got {text!r}") from None


@dataclass(frozen=True)
class ProfileSpec:
    """What to profile. The CLI's flags are these fields."""

    target: str = field(default="SmolLM2-135M", metadata={"help": "target model shape"})
    draft: str = field(default="SmolLM2-135M-EE4", metadata={
        "help": "draft model shape, or 'none' for a model-free drafter"})
    device: str = field(default="cpu", metadata={"help": "cpu, cuda or cuda:N"})
    dtype: str | None = field(default=None, metadata={
        "help": "fp32, bf16 or fp16 (unset: fp32 on CPU, bf16 on CUDA)"})
    threads: int = field(default=1, metadata={
        "help": "CPU threads (1 times steadily on a shared machine)"})
    quick: bool = field(default=False, metadata={"help": "the small CI grid and fewer repeats"})
    repeats: int | None = field(default=None, metadata={
        "help": "rounds: each times every point once; a point's time is the median over "
                "rounds (5; 3 quick; --engine vllm: 2)"})
    warmup: int | None = field(default=None, metadata={
        "help": "untimed calls before each timed one (1)"})
    ragged: int = field(default=30, metadata={"help": "random ragged batches timed for real"})
    batch_sizes: str | None = field(default=None, metadata={"help": "grid axis, e.g. 1,2,4,8"})
    query_tokens: str | None = field(default=None, metadata={"help": "grid axis (1 = decode)"})
    context_tokens: str | None = field(default=None, metadata={"help": "grid axis"})
    prompt_tokens: str | None = field(default=None, metadata={"help": "prefill grid axis"})
    prefill_batch_sizes: str | None = field(default=None, metadata={"help": "prefill grid axis"})
    seed: int = field(default=0, metadata={"help": "seed of weights, tokens and ragged batches"})
    engine: str = field(default="spectune", metadata={
        "help": "spectune (time our passes) or vllm (time a real vLLM's iterations: "
                "scripts/vllm_env.sh builds it; the other flags do not apply)"})
    vllm_venv: str = field(default=".venv-vllm", metadata={"help": "vLLM's environment"})
    speculative_tokens: str | None = field(default=None, metadata={
        "help": "--engine vllm: the num_speculative_tokens to time, one server each, "
                "comma-separated (the first also times the prefills)", "unset": "0,2,4,6"})
    gap_from: str | None = field(default=None, metadata={
        "help": "--engine vllm: folders of measured vLLM runs (comma-separated, as spectune "
                "validate --engine vllm writes them): fit vLLM's host time between iterations "
                "on them and write it into the profile at --out; starts no vLLM"})

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        for name in ("repeats", "ragged"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "ragged" else 1):
                raise ValueError(f"--{name} must be >= {0 if name == 'ragged' else 1}, "
                                 f"got {value}")
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.engine not in ("spectune", "vllm"):
            raise ValueError(f"--engine must be spectune or vllm, got {self.engine!r}")
        if self.gap_from is not None and self.engine != "vllm":
            raise ValueError("--gap-from fits vLLM's gap between iterations: add --engine vllm")
        if self.speculative_tokens is not None:
            if self.engine != "vllm":
                raise ValueError("--speculative-tokens sets the vLLM servers a profile times: "
                                 "add --engine vllm")
            self.vllm_ks()  # a clear error for a malformed list

    def vllm_ks(self) -> tuple[int, ...]:
        """--speculative-tokens as distinct ks of 0 to 16, in the order given."""
        if self.speculative_tokens is None:
            return VLLM_KS
        ks: list[int] = []
        for item in (t.strip() for t in self.speculative_tokens.split(",")):
            if not item.isdigit() or int(item) > 16 or int(item) in ks:
                raise ValueError(f"--speculative-tokens: {item!r}: give distinct ks from 0 to "
                                 f"16, comma-separated, e.g. 0,1,2,3,4,6")
            ks.append(int(item))
        return tuple(ks)

    def grid(self):
        from profiler.grid import DEFAULT_GRID, QUICK_GRID, Grid

        base = QUICK_GRID if self.quick else DEFAULT_GRID
        axes = {name: _ints(getattr(self, name), name) for name in base.as_dict()}
        return Grid(**{name: values if values is not None else getattr(base, name)
                       for name, values in axes.items()})


def run_profile(spec: ProfileSpec, out: Path, progress=None) -> dict:
    """Profile, evaluate, write everything to `out`; return the summary."""
    from models.llama import LlamaModel, config_for
    from models.runtime import dtype_named, set_threads, torch_version
    from profiler import device as devices
    from profiler.peaks import device_memory_bytes, measure_peaks
    from profiler.sweep import Models, run_sweep
    from simulator.latency_table import new_meta
    from spectune.files import write_csv

    started = time.perf_counter()
    grid = spec.grid()
    device = devices.resolve(spec.device)
    dtype_name = spec.dtype or ("fp32" if device.type == "cpu" else "bf16")
    dtype = dtype_named(dtype_name)
    if device.type == "cpu":
        set_threads(spec.threads)
    target_shape = get_model(spec.target)
    draft_shape = None if spec.draft.lower() in ("none", "ngram") else get_model(spec.draft)
    repeats = spec.repeats or (3 if spec.quick else 5)
    warmup = spec.warmup if spec.warmup is not None else 1
    check_memory(grid, target_shape, draft_shape, dtype, device)

    def build(shape):
        return LlamaModel.random(config_for(shape, dtype=dtype, device=device), seed=spec.seed)

    models = Models(build(target_shape), build(draft_shape) if draft_shape else None)
    name, driver = devices.describe(device)
    meta = new_meta(name, driver, torch_version(), dtype_name, target_shape, draft_shape,
                    grid.as_dict(), repeats, warmup,
                    notes="random weights (latency does not depend on values); "
                          f"spectune profile{' --quick' if spec.quick else ''}")
    meta["memory_bytes"] = device_memory_bytes(device)
    meta["threads"] = spec.threads if device.type == "cpu" else None
    out.mkdir(parents=True, exist_ok=True)
    table, ragged = run_sweep(models, grid, device, meta, out, warmup, repeats, spec.ragged,
                              spec.seed, progress=progress)
    if len(ragged):
        write_csv(out / "ragged.csv", ragged)
    peaks = measure_peaks(device, dtype, name)
    summary = model_errors(table, ragged, peaks, dtype)
    summary.update({"device": name, "dtype": dtype_name, "rows": len(table.rows),
                    "ragged_batches": len(ragged), "table": str(out / "latency.csv"),
                    "spec": asdict(spec), "wall_s": time.perf_counter() - started})
    return summary


def check_memory(grid, target, draft, dtype, device) -> None:
    """Refuse a grid whose largest pass cannot fit, before timing anything."""
    from models.runtime import element_size
    from profiler.peaks import available_bytes

    size = element_size(dtype)
    weights = sum(m.params for m in (target, draft) if m) * size
    kv = sum(m.kv_bytes_per_token(size) for m in (target, draft) if m)
    b = max(max(grid.batch_sizes), max(grid.prefill_batch_sizes))
    tokens = max(max(grid.context_tokens) + max(grid.query_tokens), max(grid.prompt_tokens))
    q = max(max(grid.query_tokens) * max(grid.batch_sizes),
            max(grid.prompt_tokens) * max(grid.prefill_batch_sizes))
    activations = q * max(target.vocab, 4 * target.ffn) * 4 * size
    need = weights + b * tokens * kv + activations
    have = available_bytes(device)
    if need > 0.8 * have:
        raise ConfigError(f"the largest pass of this grid needs about {need / 2**30:.1f} GiB "
                          f"({b} requests x {tokens} tokens of KV + weights + activations) but "
                          f"{device} has {have / 2**30:.1f} GiB free; shrink the grid")


def model_errors(table, ragged: pd.DataFrame, peaks, dtype) -> dict:
    """Held-out and ragged errors of the profiled model; the roofline's error per phase."""
    from simulator import RooflineLatency
    from simulator.profiled import (
        ProfiledLatency,
        error_summary,
        heldout_split,
        prediction_errors,
        ragged_errors,
    )
    from simulator.roofline import RooflineParams

    train, held = heldout_split(table)
    trained = ProfiledLatency(train)
    heldout = error_summary(prediction_errors(trained, held))
    full = ProfiledLatency(table)
    ragged_summary = error_summary(ragged_errors(full, ragged) if len(ragged) else np.array([]))
    size = 4 if str(dtype).endswith("float32") else 2
    pure = RooflineParams(bandwidth_efficiency=1.0, flops_efficiency=1.0, pass_fixed_s=0.0,
                          per_layer_s=0.0, step_overhead_s=0.0, per_seq_overhead_s=0.0)
    roofline = RooflineLatency(table.target, table.draft, peaks, dtype_bytes=size, params=pure)
    per_phase = {}
    for (role, phase), rows in table.rows.groupby(["role", "phase"]):
        errors = prediction_errors(roofline, rows)
        mine = held[(held["role"] == role) & (held["phase"] == phase)]
        per_phase[f"{role}/{phase}"] = {
            "roofline_median_abs_pct": float(np.median(np.abs(errors)) * 100),
            "roofline_median_signed_pct": float(np.median(errors) * 100),
            "profiled_heldout_median_abs_pct": error_summary(
                prediction_errors(trained, mine))["median_abs_pct"] if len(mine) else None,
            "heldout_points": len(mine), "rows": len(rows)}
    return {
        "heldout_median_abs_pct_error": heldout["median_abs_pct"],
        "heldout_p90_abs_pct_error": heldout["p90_abs_pct"],
        "heldout_points": heldout["n"],
        "ragged_median_abs_pct_error": ragged_summary["median_abs_pct"],
        "ragged_p90_abs_pct_error": ragged_summary["p90_abs_pct"],
        "roofline_vs_measured": per_phase,
        "roofline_peaks": peaks.source,
        "model": full.describe(),
    }


def print_summary(s: dict, out=sys.stdout) -> None:
    def pct(v):
        return "-" if v is None else f"{v:.1f}%"

    print(f"device   {s['device']}, {s['dtype']}   rows {s['rows']}   "
          f"({s['wall_s']:.0f} s)", file=out)
    print("profiled model error: held-out grid points median "
          f"{pct(s['heldout_median_abs_pct_error'])}, p90 "
          f"{pct(s['heldout_p90_abs_pct_error'])} ({s['heldout_points']} points); "
          f"ragged batches median {pct(s['ragged_median_abs_pct_error'])}, p90 "
          f"{pct(s['ragged_p90_abs_pct_error'])} ({s['ragged_batches']} batches)", file=out)
    print(f"\nroofline from measured peaks ({s['roofline_peaks']}) vs measured:", file=out)
    print(f"  {'phase':<16}{'rows':>5}{'roofline |err|':>16}{'signed':>9}"
          f"{'profiled |err| (held-out pts)':>31}", file=out)
    for phase, r in s["roofline_vs_measured"].items():
        held = f"{pct(r['profiled_heldout_median_abs_pct'])} ({r['heldout_points']})"
        print(f"  {phase:<16}{r['rows']:>5}{pct(r['roofline_median_abs_pct']):>16}"
              f"{r['roofline_median_signed_pct']:>+8.0f}%{held:>31}", file=out)


# -- CLI ----------------------------------------------------------------------------------------


def add_parser(subparsers) -> argparse.ArgumentParser:
    from spectune.flags import add_dataclass_flags

    prof = subparsers.add_parser(
        "profile", help="time real forward passes and fit a latency model",
        description="Time forward passes of random-weight models of catalog shapes (torch), fit "
        "the profiled latency model, and report its error on held-out grid points and on "
        "ragged batches timed for real. Needs the torch extra: pip install -e '.[torch]'.")
    add_dataclass_flags(prof, ProfileSpec, "what to profile")
    prof.add_argument("--out", type=Path, default=Path("profiles/default"),
                      help="folder for latency.csv, latency.meta.json, ragged.csv, summary.json "
                           "(a rerun resumes)")
    prof.add_argument("--format", choices=("table", "json"), default="table")
    prof.add_argument("--debug", action="store_true", help="show tracebacks")
    return prof


def main(args: argparse.Namespace) -> int:
    from spectune.console import Resumable, end_progress, progress_line, require_torch
    from spectune.files import prepare_out, to_json, write_json
    from spectune.flags import dataclass_from_args

    require_torch("profile")
    spec = dataclass_from_args(ProfileSpec, args)
    prepare_out(args.out)
    if spec.engine == "vllm":
        return _main_vllm(spec, args)
    progress = progress_line("round {}/{} done")
    try:
        summary = run_profile(spec, args.out, progress)
    except KeyboardInterrupt:
        raise Resumable(f"the finished rounds are kept in {args.out}") from None
    end_progress(progress)
    write_json(args.out / "summary.json", summary)
    if args.format == "json":
        print(to_json(summary))
    else:
        print_summary(summary)
        print(f"\nprofile written to {args.out}/ (use it: spectune simulate --profile {args.out})")
    return 0


def _main_vllm(spec: ProfileSpec, args: argparse.Namespace) -> int:
    from live.vllm_server import resolve_venv
    from spectune.files import to_json, write_json
    from spectune.profile_vllm import run_profile_vllm

    if spec.gap_from is not None:
        return _refit_gap(spec.gap_from, args)
    summary = run_profile_vllm(resolve_venv(spec.vllm_venv), args.out, ks=spec.vllm_ks(),
                               rounds=spec.repeats or 2,
                               progress=lambda text: print(text, file=sys.stderr, flush=True))
    write_json(args.out / "summary.json", summary)
    if args.format == "json":
        print(to_json(summary))
    else:
        held = summary["heldout"]
        print(f"vLLM profile: {summary['rows']} rows, {summary['iteration_gap_s'] * 1000:.2f} ms "
              f"between iterations; held-out points median {held['median_abs_pct']:.1f}%, p90 "
              f"{held['p90_abs_pct']:.1f}% ({held['n']} points)")
        print(f"written to {args.out}/ (use it: spectune validate --engine vllm --profile "
              f"{args.out}/latency)")
    return 0


def _refit_gap(folders: str, args: argparse.Namespace) -> int:
    from spectune.files import to_json
    from spectune.profile_vllm import refit_gap

    gap = refit_gap(args.out, [Path(f) for f in folders.split(",") if f])
    if args.format == "json":
        print(to_json(gap))
    else:
        print(f"vLLM's gap between iterations: {gap['fixed_s'] * 1e3:.2f} ms + "
              f"{gap['per_request_s'] * 1e3:.3f} ms per request + "
              f"{gap['speculative_step_s'] * 1e3:.2f} ms when the step verifies drafts "
              f"({gap['runs']} runs, {gap['iterations']} iterations; residual "
              f"{gap['rms_s'] * 1e3:.2f} ms per iteration, rms over runs)")
        print(f"written to {args.out}/latency.meta.json")
    return 0

"""`spectune simulate` on the command line: flags, the summary table, JSON output, records."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    from simulator import ClusterConfig, SchedulerConfig
    from spectune.flags import add_dataclass_flags
    from spectune.simulate import SimulationSpec

    sim = subparsers.add_parser(
        "simulate", help="simulate serving a workload under a policy",
        description="Simulate serving with speculative decoding. With no options: the embedded "
        "default (Azure conversation trace, Llama-3.1-8B + Llama-68M on H100, roofline latency).")
    add_dataclass_flags(sim, SimulationSpec, "workload, models, acceptance, policy")
    sim.add_argument("--set", dest="params", action="append", default=[], metavar="KEY=VALUE",
                     help="a policy parameter (repeatable); `spectune policies` lists them")
    add_dataclass_flags(sim, SchedulerConfig, "scheduler (mirror the live engine's settings)")
    add_dataclass_flags(sim, ClusterConfig, "cluster")
    sim.add_argument("--out", type=Path, help="write requests.csv, steps.csv, summary.json here")
    sim.add_argument("--format", choices=("table", "json"), default="table")
    sim.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                     help="cost every iteration one by one (slower; same results)")
    sim.add_argument("--no-steps", dest="steps", action="store_false",
                     help="with --out, skip steps.csv (a row per iteration, streamed as the run "
                          "goes: at millions of requests, gigabytes of disk)")
    sim.add_argument("--debug", action="store_true", help="show tracebacks")
    return sim


def main(args: argparse.Namespace) -> int:
    from simulator import ClusterConfig, SchedulerConfig
    from simulator.logs import STEP_COLUMNS
    from spectune.files import CsvStream, prepare_out, to_json, write_csv, write_json
    from spectune.flags import dataclass_from_args
    from spectune.simulate import SimulationSpec, run

    spec = dataclass_from_args(SimulationSpec, args)
    scheduler = dataclass_from_args(SchedulerConfig, args)
    cluster = dataclass_from_args(ClusterConfig, args)
    if args.out:
        prepare_out(args.out)
    # the summary needs only the steps' totals; steps.csv is streamed as the run goes
    stream = CsvStream(args.out / "steps.csv", STEP_COLUMNS) if args.out and args.steps else None
    try:
        result, summary = run(spec, _params(args.params), scheduler, cluster, args.fast_path,
                              keep_steps=False, steps_sink=stream)
    except BaseException:
        if stream is not None:
            stream.abort()
        raise
    if stream is not None:
        stream.close()
    if args.out:
        write_csv(args.out / "requests.csv", result.requests)
        write_json(args.out / "summary.json", summary)
    if args.format == "json":
        print(to_json(summary))
    else:
        print(_summary_table(summary))
        if args.out:
            print(f"\nrecords written to {args.out}/")
    return 0


def _params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _acceptance_line(acc: dict) -> str:
    if acc.get("parametric"):
        return acc.get("description", acc.get("spec", "?"))
    tiled = ", repeated to the workload's lengths" if acc.get("tiled_to_workload_lengths") else ""
    return (f"recorded: {acc.get('drafter', '?')} drafting for {acc.get('target', '?')} "
            f"({acc.get('trace_requests', '?')} requests{tiled})")


def _summary_table(s: dict) -> str:
    """The summary of one simulation as the terminal shows it."""
    from spectune.console import seconds

    inputs = s["inputs"]
    pol = inputs["policy"]
    params = ", ".join(f"{k}={v}" for k, v in pol["params"].items())
    acc = inputs["acceptance"]
    replicas = inputs["cluster"]["replicas"]
    tp = inputs["spec"].get("tp", 1)
    group = f" of TP {tp} ({replicas * tp} GPUs)" if tp > 1 else ""
    lines = [
        f"workload     {inputs['workload']}",
        f"latency      {inputs['latency_model']}",
        f"acceptance   {_acceptance_line(acc)}",
        f"policy       {pol['name']}({params})   replicas {replicas}{group}   "
        f"KV capacity {inputs['kv_capacity_tokens']:,} tokens",
        "",
        f"requests {s['requests']:,} over {s['duration_s']:,.1f} s simulated "
        f"({inputs['wall_s']:.2f} s wall)   throughput {s['throughput_tokens_per_s']:,.0f} tok/s"
        f"   mean batch {s['mean_batch_size']:.1f}",
        f"mean k {s['mean_k']:.2f}   mean emitted per step {s['mean_emitted_per_step']:.3f}",
        "",
        f"{'':8}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}",
    ]
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        d = s[key]
        lines.append(f"{label:8}" + "".join(f"{seconds(d[q]):>12}" for q in
                                            ("mean", "p50", "p90", "p99")))
    if "slo_attainment" in s:
        lines.append(f"\nSLO {s['slo']}: attainment {s['slo_attainment']:.1%}, goodput "
                     f"{s['goodput_tokens_per_s']:,.0f} tok/s")
    return "\n".join(lines)

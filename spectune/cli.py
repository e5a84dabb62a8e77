"""`spectune`: one command line for the user's jobs. Thin: parse, call a job, print.

Bad input ends with exit code 2 and one line on stderr saying what was wrong (never a traceback;
`--debug` shows one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. Ctrl-C anywhere ends with one line on stderr and exit code 130
    (a cached run says how much it kept), not a traceback; `--debug` shows one."""
    debug = False
    _print_notes_as_lines()
    try:
        parser = _parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        if not argv:
            return _start_here(parser)
        if argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
            argv = ["simulate", *argv]  # flags alone: the main job is the default subcommand
        args = parser.parse_args(argv)
        debug = getattr(args, "debug", False)
        return _run(args)
    except KeyboardInterrupt as exc:
        if debug:
            raise
        from spectune.console import interrupted_line

        print(interrupted_line(exc), file=sys.stderr)
        return EXIT_INTERRUPTED


def _print_notes_as_lines() -> None:
    """A `traces.UserNote` (input that was accepted but changed, like rows sorted by arrival)
    prints as one `spectune: note:` line on stderr, each once, instead of a warning with its
    source line."""
    import warnings

    from traces import UserNote

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, UserNote):
            print(f"spectune: note: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    if getattr(shown, "spectune_notes", False):
        return
    show.spectune_notes = True  # type: ignore[attr-defined]
    warnings.showwarning = show
    warnings.filterwarnings("once", category=UserNote)


START_HERE = """
start here:
  spectune tune              find the best speculation policy per request rate (~2 minutes):
                             recommendations, engine configs and an HTML report in runs/tune/
  spectune simulate          one simulation of the embedded default (a few seconds); add
                             --help for the workload, model, acceptance and policy options"""


def _start_here(parser: argparse.ArgumentParser) -> int:
    """`spectune` alone: the commands and where to start, not a run the user did not ask for."""
    parser.print_help()
    print(START_HERE)
    return 0


def _run(args: argparse.Namespace) -> int:
    """The subcommand's handler, with bad input as one line on stderr and exit code 2."""
    try:
        return args.handler(args)
    except BrokenPipeError:  # the reader went away (`spectune ... | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except MemoryError:
        print("spectune: error: ran out of memory; simulate fewer requests (--requests, "
              "--duration) or a smaller grid", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ValueError, OSError, KeyError) as exc:
        if getattr(args, "debug", False):
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"spectune: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _parser() -> argparse.ArgumentParser:
    from simulator import ClusterConfig, SchedulerConfig
    from spectune.flags import add_dataclass_flags
    from spectune.simulate import SimulationSpec

    parser = argparse.ArgumentParser(prog="spectune", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")

    sim = sub.add_parser("simulate", help="simulate serving a workload under a policy",
                         description="Simulate serving with speculative decoding. With no "
                         "options: the embedded default (Azure conversation trace, Llama-3.1-8B "
                         "+ Llama-68M on H100, roofline latency).")
    add_dataclass_flags(sim, SimulationSpec, "workload, models, acceptance, policy")
    sim.add_argument("--set", dest="params", action="append", default=[], metavar="KEY=VALUE",
                     help="a policy parameter (repeatable); `spectune policies` lists them")
    add_dataclass_flags(sim, SchedulerConfig, "scheduler (mirror the live engine's settings)")
    add_dataclass_flags(sim, ClusterConfig, "cluster")
    sim.add_argument("--out", type=Path, help="write requests.csv, steps.csv, summary.json here")
    sim.add_argument("--format", choices=("table", "json"), default="table")
    sim.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                     help="cost every iteration one by one (slower; same results)")
    sim.add_argument("--debug", action="store_true", help="show tracebacks")
    sim.set_defaults(handler=cmd_simulate)

    pol = sub.add_parser("policies", help="list the registered policies and their parameters")
    pol.add_argument("--format", choices=("table", "json"), default="table")
    pol.set_defaults(handler=cmd_policies)

    from spectune.profile import ProfileSpec

    prof = sub.add_parser("profile", help="time real forward passes and fit a latency model",
                          description="Time forward passes of random-weight models of catalog "
                          "shapes (torch), fit the profiled latency model, and report its error "
                          "on held-out grid points and on ragged batches timed for real. Needs "
                          "the torch extra: pip install -e '.[torch]'.")
    add_dataclass_flags(prof, ProfileSpec, "what to profile")
    prof.add_argument("--out", type=Path, default=Path("profiles/default"),
                      help="folder for latency.csv, latency.meta.json, ragged.csv, summary.json "
                           "(a rerun resumes)")
    prof.add_argument("--format", choices=("table", "json"), default="table")
    prof.add_argument("--debug", action="store_true", help="show tracebacks")
    prof.set_defaults(handler=cmd_profile)

    from spectune.plan import add_plan_parser
    from spectune.record import add_record_parser
    from spectune.report import add_report_parser
    from spectune.tune_cli import add_tune_parser
    from spectune.validate import add_validate_parser

    add_tune_parser(sub)
    add_plan_parser(sub)
    add_report_parser(sub)
    add_record_parser(sub)
    add_validate_parser(sub)

    cat = sub.add_parser("catalog", help="list the known model shapes and GPUs")
    cat.set_defaults(handler=cmd_catalog)
    return parser


def _params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def cmd_simulate(args: argparse.Namespace) -> int:
    from simulator import ClusterConfig, SchedulerConfig
    from spectune.files import prepare_out, to_json, write_csv, write_json
    from spectune.flags import dataclass_from_args
    from spectune.simulate import SimulationSpec, run

    spec = dataclass_from_args(SimulationSpec, args)
    scheduler = dataclass_from_args(SchedulerConfig, args)
    cluster = dataclass_from_args(ClusterConfig, args)
    if args.out:
        prepare_out(args.out)
    result, summary = run(spec, _params(args.params), scheduler, cluster, args.fast_path)
    if args.out:
        write_csv(args.out / "requests.csv", result.requests)
        write_csv(args.out / "steps.csv", result.steps)
        write_json(args.out / "summary.json", summary)
    if args.format == "json":
        print(to_json(summary))
    else:
        print(_summary_table(summary))
        if args.out:
            print(f"\nrecords written to {args.out}/")
    return 0


def _fmt_s(value: float) -> str:
    from spectune.console import seconds

    return seconds(value)


def _acceptance_line(acc: dict) -> str:
    if acc.get("parametric"):
        return acc.get("description", acc.get("spec", "?"))
    tiled = ", repeated to the workload's lengths" if acc.get("tiled_to_workload_lengths") else ""
    return (f"recorded: {acc.get('drafter', '?')} drafting for {acc.get('target', '?')} "
            f"({acc.get('trace_requests', '?')} requests{tiled})")


def _summary_table(s: dict) -> str:
    inputs = s["inputs"]
    pol = inputs["policy"]
    params = ", ".join(f"{k}={v}" for k, v in pol["params"].items())
    acc = inputs["acceptance"]
    lines = [
        f"workload     {inputs['workload']}",
        f"latency      {inputs['latency_model']}",
        f"acceptance   {_acceptance_line(acc)}",
        f"policy       {pol['name']}({params})   replicas {inputs['cluster']['replicas']}   "
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
        lines.append(f"{label:8}" + "".join(f"{_fmt_s(d[q]):>12}" for q in
                                            ("mean", "p50", "p90", "p99")))
    if "slo_attainment" in s:
        lines.append(f"\nSLO {s['slo']}: attainment {s['slo_attainment']:.1%}, goodput "
                     f"{s['goodput_tokens_per_s']:,.0f} tok/s")
    return "\n".join(lines)


def cmd_profile(args: argparse.Namespace) -> int:
    from spectune.console import Resumable, end_progress, progress_line, require_torch
    from spectune.files import prepare_out, to_json, write_json
    from spectune.flags import dataclass_from_args
    from spectune.profile import ProfileSpec, print_summary, run_profile

    require_torch("profile")
    spec = dataclass_from_args(ProfileSpec, args)
    prepare_out(args.out)
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


def cmd_policies(args: argparse.Namespace) -> int:
    from policies import parameters, policy_class, policy_names

    rows = []
    for name in policy_names():
        cls = policy_class(name)
        rows.append({"name": name, "description": cls.description,
                     "parameters": [p.__dict__ for p in parameters(name)]})
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for row in rows:
        print(f"{row['name']}: {row['description']}")
        for p in row["parameters"]:
            past = (f", then past its top up to {p['extend'][-1]} while the best sits there"
                    if p.get("extend") else "")
            searched = (f"; tune searches {list(p['grid'])}{past}" if p["grid"] is not None else
                        f"; tune searches [{p['bounds'][0]}, {p['bounds'][1]}]"
                        if p["bounds"] is not None else "")
            print(f"    {p['name']} ({p['type_name']}, default {p['default']}): {p['help']}"
                  f"{searched}")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from simulator import get_gpu, get_model, gpu_names, model_names

    print("models:")
    for name in model_names():
        m = get_model(name)
        print(f"    {m.name:16} {m.params / 1e9:7.2f} B params  layers {m.layers:3}  "
              f"hidden {m.hidden:5}  kv heads {m.kv_heads:2}   [{m.source}]")
    print("GPUs:")
    for name in gpu_names():
        g = get_gpu(name)
        print(f"    {g.name:12} {g.memory_bytes / 2**30:6.1f} GiB  "
              f"{g.bandwidth_bytes_per_s / 1e12:5.2f} TB/s  "
              f"{g.bf16_flops_per_s / 1e12:6.0f} TFLOP/s bf16   [{g.source}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`spectune`: one command line for the user's jobs. Thin: parse, call a job, print.

Bad input ends with exit code 2 and one line on stderr saying what was wrong (never a traceback;
`--debug` shows one).

Each job is a module with `add_parser(subparsers)`, which registers its subcommand and returns
its parser, and `main(args) -> int`, which runs it; JOBS lists them in the order `spectune --help`
shows. A job's command line is in its own module (profile, plan, record, validate), or in
`<job>_cli.py` where that module is part of every cached simulation's key (simulate), at its size
limit (tune) or heavy to import (report), or where the job's logic is a package (policies,
catalog). Building the parser imports no pandas, plotly, scipy, SimPy or torch: a job imports
what it needs in `main`, when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from spectune import (
    catalog_cli,
    plan,
    policies_cli,
    profile,
    record,
    report_cli,
    simulate_cli,
    tune_cli,
    validate,
)

#: the jobs, in the order `spectune --help` lists their subcommands
JOBS = (simulate_cli, policies_cli, profile, tune_cli, plan, report_cli, record, validate,
        catalog_cli)
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
    parser = argparse.ArgumentParser(prog="spectune", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    for job in JOBS:
        job.add_parser(sub).set_defaults(handler=job.main)
    return parser


if __name__ == "__main__":
    sys.exit(main())

"""`spectune report FOLDER` on the command line (report.py, with pandas and plotly, loads only
when a report is written)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="one HTML page of charts from tune/plan/validate output",
        description="Read tune.json, plan.json and/or validate.json (and the sample CSVs they "
        "name) from FOLDER and write one self-contained HTML page of charts (opens offline).")
    p.add_argument("folder", type=Path, metavar="FOLDER",
                   help="the --out folder of spectune tune, plan or validate")
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="where to write the page (default: FOLDER/report.html)")
    p.add_argument("--title", default=None, help="page title (default: from the folder name)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def main(args: argparse.Namespace) -> int:
    from spectune.report import write_report

    print(write_report(args.folder, args.out, args.title))
    return 0

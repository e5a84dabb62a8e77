"""`spectune policies`: the registered policies, their parameters and what tune searches."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> argparse.ArgumentParser:
    pol = subparsers.add_parser("policies",
                                help="list the registered policies and their parameters")
    pol.add_argument("--format", choices=("table", "json"), default="table")
    return pol


def main(args: argparse.Namespace) -> int:
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

"""The command line starts quickly because building its parser imports no heavy package: each
job imports pandas, plotly, scipy, SimPy or torch in its `main`, when it runs. Checked by what a
fresh interpreter has loaded (sys.modules), not by a clock."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from spectune import cli

HEAVY = ("pandas", "plotly", "scipy", "torch", "simpy")


def _loaded_after(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


def test_building_the_parser_imports_no_heavy_package():
    loaded = _loaded_after("import spectune.cli\nspectune.cli._parser()")
    assert "spectune" in loaded  # the probe itself works
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


@pytest.mark.parametrize("argv", [["policies"], ["policies", "--format", "json"], ["catalog"]])
def test_listing_commands_import_no_heavy_package(argv):
    loaded = _loaded_after("import contextlib, io\nfrom spectune.cli import main\n"
                           "with contextlib.redirect_stdout(io.StringIO()):\n"
                           f"    assert main({argv!r}) == 0")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_every_job_has_one_shape():
    """add_parser(subparsers) registers one subcommand and returns its parser; main(args) runs
    it; the CLI wires each the same way."""
    sub = argparse.ArgumentParser().add_subparsers()
    for job in cli.JOBS:
        before = set(sub.choices)
        parser = job.add_parser(sub)
        added = set(sub.choices) - before
        assert len(added) == 1 and sub.choices[added.pop()] is parser, job.__name__
        assert callable(job.main), job.__name__
    subcommands = next(a for a in cli._parser()._actions
                       if isinstance(a, argparse._SubParsersAction)).choices
    assert list(subcommands) == ["simulate", "policies", "profile", "tune", "plan", "report",
                                 "record", "validate", "catalog"]
    assert [p.get_default("handler") for p in subcommands.values()] == [j.main for j in cli.JOBS]

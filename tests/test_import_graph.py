"""The import graph is a DAG (traces -> policies -> simulator -> spectune) and only profiler/ may
import torch: planners install spectune without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = {
    "traces": ("torch", "simpy", "policies", "simulator", "spectune", "profiler"),
    "policies": ("torch", "simpy", "traces", "simulator", "spectune", "profiler"),
    "simulator": ("torch", "spectune", "profiler"),
    "spectune.cli": ("torch", "profiler"),
}


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_module_does_not_import(module):
    code = (
        f"import sys, {module}\n"
        "if '{0}' == 'spectune.cli':\n"
        "    from spectune.cli import main\n"
        "    main(['simulate', '--requests', '20', '--format', 'json'])\n"
        "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))\n"
    ).replace("{0}", module)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert module.split(".")[0] in loaded  # the probe itself works
    for name in FORBIDDEN[module]:
        assert name not in loaded, f"{module} imports {name}"

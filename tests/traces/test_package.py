"""The package surface: public names, and a light import with no upward dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import traces

PUBLIC = {
    "Request", "Workload", "TraceError", "UserNote", "atomic_write", "load_workload",
    "save_workload",
    "builtin_workload",
    "builtin_names", "DEFAULT_WORKLOAD", "poisson_arrivals", "gamma_arrivals",
    "synthetic_workload", "rescale_to_rate", "parse_lengths", "EmpiricalLengths", "FixedLengths",
    "RequestSpeculation", "SpeculationTrace", "SIGNALS", "run_from_matches",
    "ParametricAcceptance", "parse_acceptance", "parametric_trace",
}


def test_public_names():
    assert set(traces.__all__) == PUBLIC
    assert all(hasattr(traces, name) for name in PUBLIC)


def test_import_is_light_and_stays_at_the_bottom_of_the_graph():
    probe = (
        "import sys, json, traces; "
        "print(json.dumps({'modules': sorted(sys.modules), "
        "'cached': traces.builtin_workload.cache_info().currsize}))"
    )
    root = Path(traces.__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True,
                         check=True)
    report = json.loads(out.stdout)
    top = {name.split(".")[0] for name in report["modules"]}
    assert not top & {"torch", "simpy", "simulator", "policies", "spectune", "profiler", "pandas"}
    assert report["cached"] == 0  # no trace is loaded at import time


def test_sources_do_not_import_upper_layers():
    forbidden = ("torch", "simpy", "simulator", "policies", "spectune", "profiler")
    for path in Path(traces.__file__).parent.glob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and len(words) > 1:
                assert words[1].split(".")[0] not in forbidden, (path.name, line)

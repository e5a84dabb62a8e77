"""The package surface: every public name resolves, and importing the package or its light
names (configs, catalog, errors) does not load the engine (SimPy, pandas)."""

from __future__ import annotations

import json
import subprocess
import sys

import simulator


def test_public_names_resolve_to_their_modules():
    assert sorted(simulator.__all__) == sorted(simulator._HOMES)
    for name in simulator.__all__:
        value = getattr(simulator, name)
        assert getattr(sys.modules[f"simulator.{simulator._HOMES[name]}"], name) is value
    assert set(simulator.__all__) <= set(dir(simulator))


def test_an_unknown_name_is_an_attribute_error():
    try:
        simulator.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("simulator.no_such_name resolved")


def test_light_names_do_not_load_the_engine():
    probe = ("import json, sys\n"
             "from simulator import ClusterConfig, ConfigError, SchedulerConfig, get_gpu\n"
             "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert "simulator" in loaded
    assert not loaded & {"simpy", "pandas", "scipy", "torch"}

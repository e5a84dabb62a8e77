"""scripts/device_gpu.sh end to end on the CPU with tiny shapes (TINY=1), as the issue asks: a
GPU call must never be spent on a typo. Every step must exit 0 and leave its files: the log,
the benchmark's JSON, the profile summary and the tarball of the folders (~30 s)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_script_runs_end_to_end_on_the_cpu(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, OUT=str(out), WORK=str(work), TINY="1", PY=sys.executable,
               DEADLINE="400")
    done = subprocess.run(["bash", "scripts/device_gpu.sh"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (out / "all.log").read_text()
    exits = dict(re.findall(r"== (\w+): exit (\d+)", log))
    assert exits == {"check": "0", "engine": "0", "profile": "0", "validate": "0"}, log[-3000:]
    assert "Traceback" not in log
    engine = json.loads((out / "gpu_engine.json").read_text())
    assert set(engine["median_ms"]) == {"per-request", "paged-eager"}  # graphs: CUDA only
    assert all(v > 0 for times in engine["median_ms"].values() for v in times.values())
    summary = json.loads((out / "profile_summary.json").read_text())
    assert summary["ragged_median_abs_pct_error"] >= 0
    with tarfile.open(out / "results.tgz") as tar:
        names = tar.getnames()
    assert any(n.endswith("validate/validate.csv") for n in names)
    assert len(list(out.iterdir())) <= 8  # what a device call brings back

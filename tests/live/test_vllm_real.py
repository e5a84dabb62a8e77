"""A real vLLM, end to end, as docs/vllm.md shows it: build its environment
(scripts/vllm_env.sh, cached in the checkout's .venv-vllm), then `spectune validate --engine
vllm` on a tiny workload (3 requests, one rate, no speculation and n-gram k=2: two server
starts, ~6 min on 2 cores). The simulator must replay vLLM's tokens per step exactly and every
server must be gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    done = subprocess.run(["bash", "scripts/vllm_env.sh"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "vLLM 0.32.0 ready" in done.stdout
    again = subprocess.run(["bash", "scripts/vllm_env.sh"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "up to date" in again.stdout  # idempotent
    return ROOT / ".venv-vllm"


def test_validate_against_a_real_vllm(vllm_venv, tmp_path):
    out = tmp_path / "v"
    cmd = [sys.executable, "-m", "spectune", "validate", "--engine", "vllm",
           "--vllm-venv", str(vllm_venv), "--profile", "vllm-cpu-smollm2", "--rates", "2",
           "--requests", "3", "--output-tokens", "16", "--policies", "fixed:k=0,fixed:k=2",
           "--format", "json", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    rows = pd.DataFrame(json.loads(done.stdout))
    assert set(rows.policy) == {"fixed:k=0", "fixed:k=2"}
    per_step = rows[rows.metric == "emitted_per_step"].set_index("policy")
    assert (per_step.error_pct.abs() < 1e-9).all()  # the replay is exact
    assert per_step.loc["fixed:k=2", "measured"] >= 1.0
    for metric in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s"):
        got = rows[rows.metric == metric]
        assert (got.measured > 0).all() and (got.simulated > 0).all()
    check = json.loads((out / "k2" / "rate2" / "check.json").read_text())
    assert check["per_step"]["different"] == 0
    served = pd.read_csv(out / "k2" / "rate2" / "requests.csv")
    assert (served.output_tokens == 16).all() and served.error.isna().all()  # "" in the csv
    assert (out / "validate.csv").is_file() and (out / "k0" / "server.log").is_file()
    leftover = subprocess.run(["pgrep", "-f", str(vllm_venv / "bin" / "python")],
                              capture_output=True)
    assert leftover.returncode == 1, f"vLLM processes left: {leftover.stdout!r}"

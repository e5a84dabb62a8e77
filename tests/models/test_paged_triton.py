"""The Triton paged-attention kernel (models/paged_triton.py) against the torch backend, on
the CPU through Triton's interpreter. spectune's own environment has no triton (the CPU torch
does not pull it); the vLLM environment has, so the check runs there (tests/support/
triton_check.py: GQA and MHA, decode and ragged verify, contexts across blocks and splits)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_triton_kernel_agrees_with_the_torch_backend(vllm_venv):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    command = [str(vllm_venv / "bin" / "python"), "scripts/gpu_check.py", "--device", "cpu",
               "--kernel-only"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "agrees with the torch backend" in done.stdout
    assert "store_kv: largest difference from index_copy_ 0.0e+00" in done.stdout
    assert done.stdout.count("relative error") == 6

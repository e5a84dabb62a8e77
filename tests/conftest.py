"""Fixtures shared across test folders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The vLLM environment (scripts/vllm_env.sh, kept in the checkout's .venv-vllm): the real
    vLLM's tests serve from it, and its triton runs the paged kernel's interpreter check."""
    done = subprocess.run(["bash", "scripts/vllm_env.sh"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "vLLM 0.32.0 ready" in done.stdout
    again = subprocess.run(["bash", "scripts/vllm_env.sh"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "up to date" in again.stdout  # idempotent
    return ROOT / ".venv-vllm"

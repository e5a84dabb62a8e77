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


@pytest.fixture(autouse=True)
def _policy_loops_restored(monkeypatch):
    """Every test leaves the policies' loops as it found them (a run's `kernels.prepare` hands
    them over), so a policy's own tests take its numpy code whatever ran before them."""
    from policies import kernels as policy_kernels

    monkeypatch.setattr(policy_kernels, "_active", None)


@pytest.fixture
def loops(monkeypatch):
    """Switch between the compiled loops and the numpy code within a test: `loops(True)`
    compiled (the simulator's and the policies'), `loops(False)` numpy (the process's choice
    restored after: later tests take what they would have)."""
    from policies import kernels as policy_kernels
    from simulator import kernels

    monkeypatch.setattr(kernels, "_loaded", kernels._loaded)
    monkeypatch.setattr(kernels, "_active", kernels._active)
    monkeypatch.setattr(policy_kernels, "_active", policy_kernels._active)

    def use(compiled: bool):
        monkeypatch.setenv("SPECTUNE_KERNELS", "numba" if compiled else "numpy")
        return kernels.prepare(0)
    return use

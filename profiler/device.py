"""Which device a profile was taken on, named precisely enough to trust or distrust it later."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def resolve(name: str) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N'; a clear error when CUDA is asked for and absent."""
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: no CUDA device here (torch {torch.__version__}); "
                             "use --device cpu")
        return torch.device(name)
    raise ValueError(f"unknown device {name!r}; use cpu, cuda or cuda:N")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (or the platform's best guess)."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe(device: torch.device) -> tuple[str, str]:
    """(device name, driver) for a latency table's meta."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        driver = f"CUDA {torch.version.cuda}"
        return name, driver
    threads = torch.get_num_threads()
    return f"cpu: {cpu_model()} ({threads} thread{'s' if threads != 1 else ''})", "none"

"""The device's own achievable peaks, measured: what a roofline for this device should use.

A CPU has no datasheet row in the catalog, so `spectune profile` measures a large matrix
product's FLOP rate and a large copy's bandwidth, and builds the roofline from those. The
roofline's error against the profiled table then shows what that model leaves out (per-pass
overheads, small-matrix inefficiency), on the device at hand.
"""

from __future__ import annotations

from pathlib import Path

import torch

from profiler.timing import time_call
from simulator.catalog import GpuSpec
from traces.parametric import available_memory_bytes


def device_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read the machine's memory size from /proc/meminfo")


def available_bytes(device: torch.device) -> int:
    """Memory a profile may still use on the device."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    available = available_memory_bytes()
    return available if available is not None else device_memory_bytes(device) // 2


def measure_peaks(device: torch.device, dtype: torch.dtype, name: str) -> GpuSpec:
    """Matrix-product FLOP/s and copy bandwidth, each the median of a few timed runs."""
    n = 1024 if device.type == "cpu" else 8192
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    matmul = time_call(lambda: a @ b, device, warmup=2, repeats=5)
    elements = (256 if device.type == "cpu" else 2048) * 2**20 // a.element_size()
    src = torch.empty(elements, dtype=dtype, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    copy = time_call(lambda: dst.copy_(src), device, warmup=2, repeats=5)
    flops = 2 * n**3 / matmul.median_s
    bandwidth = 2 * src.numel() * src.element_size() / copy.median_s  # read + write
    return GpuSpec(
        name=name, memory_bytes=device_memory_bytes(device), bandwidth_bytes_per_s=bandwidth,
        bf16_flops_per_s=flops,
        source=f"measured here: {n}x{n} {str(dtype).removeprefix('torch.')} matmul "
               f"{flops / 1e9:.1f} GFLOP/s, {src.numel() * src.element_size() / 2**20:.0f} MiB "
               f"copy {bandwidth / 1e9:.1f} GB/s",
    )

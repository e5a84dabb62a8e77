"""`spectune catalog`: the model shapes and GPUs the roofline knows."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> argparse.ArgumentParser:
    return subparsers.add_parser("catalog", help="list the known model shapes and GPUs (with "
                                 "the links between GPUs that --tp groups use)")


def main(args: argparse.Namespace) -> int:
    from simulator import get_gpu, get_model, gpu_names, model_names

    print("models:")
    for name in model_names():
        m = get_model(name)
        print(f"    {m.name:16} {m.params / 1e9:7.2f} B params  layers {m.layers:3}  "
              f"hidden {m.hidden:5}  kv heads {m.kv_heads:2}   [{m.source}]")
    print("GPUs:")
    for name in gpu_names():
        g = get_gpu(name)
        print(f"    {g.name:12} {g.memory_bytes / 2**30:6.1f} GiB  "
              f"{g.bandwidth_bytes_per_s / 1e12:5.2f} TB/s  "
              f"{g.bf16_flops_per_s / 1e12:6.0f} TFLOP/s bf16   [{g.source}]")
        if g.interconnect is not None:  # what a --tp group's all-reduces cross
            link = g.interconnect
            print(f"    {'':12} GPU to GPU: {link.name}, {link.bytes_per_s / 1e9:g} GB/s each way"
                  f"   [{link.source}]")
    return 0

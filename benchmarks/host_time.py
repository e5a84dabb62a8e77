"""Host time of the live engine per decode iteration: what an iteration spends outside passes.

The live engine times its forward passes inside every iteration (`LiveResult.pass_s`), so
duration - passes is the host's share: the policy, acceptance (the greedy argmax over the
target's vocabulary), the signals a policy reads (KL and acceptance probability over the whole
vocabulary per observed draft), drafting bookkeeping. The simulator models it per policy from a
calibration run (spectune/validate_calibration.py); the less there is, the less that fit can get
wrong. Real SmolLM2-135M, real held-out prompts, all arriving at once (one batch of --batch
requests), each policy served --repeats times, interleaved.

    python benchmarks/host_time.py [--drafter eagle] [--dtype float32] [--threads 1]

To compare two versions of the engine side by side, run this file under each one's PYTHONPATH
(e.g. a `git worktree` of the older commit) alternately; the numbers are per iteration, so
machine drift between runs moves the passes, not much the host time.
"""

from __future__ import annotations

import os
import sys

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from drafters import make_drafter  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from models.gguf import load_smollm2  # noqa: E402
from models.tokenizer import chat_prompt  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import SchedulerConfig  # noqa: E402
from spectune.flags import parse_policy_list  # noqa: E402
from traces import Workload  # noqa: E402
from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts  # noqa: E402


def eval_prompts(n: int) -> list:
    """The first n odd-id (evaluation split) questions."""
    return [p for p in load_prompts(DEFAULT_PROMPTS) if in_split(p.key, "eval")][:n]


def host_ms(target, drafter, spec: str, prompts, batch: int, tokens: int) -> dict:
    [(_, name, params)] = parse_policy_list(spec)
    sched = SchedulerConfig(max_num_seqs=batch, kv_capacity_tokens=10_000_000, k_max=8)
    wl = Workload(arrival_s=np.zeros(len(prompts)),
                  prompt_tokens=np.asarray([len(p) for p in prompts]),
                  output_tokens=np.full(len(prompts), tokens),
                  request_ids=np.arange(len(prompts)), source="eval split")
    engine = LiveEngine(target, drafter, make_policy(name, params), sched)
    res = engine.run(wl, prompts, realtime=False)
    decode = (res.steps.decode_seqs > 0).to_numpy()
    host = (res.steps.duration_s.to_numpy() - res.pass_s)[decode] * 1e3
    return {"median": float(np.median(host)), "mean": float(host.mean()),
            "iterations": int(decode.sum()),
            "pass_ms": float(np.mean(res.pass_s[decode]) * 1e3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="eagle")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--policies", nargs="+",
                    default=["fixed:k=0", "fixed:k=4", "kld_variance", "gammatune"],
                    help="policies without a cost model (goodput needs a profile)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2(getattr(torch, args.dtype))
    drafter = make_drafter(args.drafter, target)
    prompts = [tok.encode(chat_prompt(p.text)) for p in eval_prompts(args.batch)]
    import live

    print(f"SmolLM2-135M-Instruct {args.dtype}, {args.threads} thread(s), drafter "
          f"{args.drafter}, batch {args.batch}, {args.tokens} tokens per request; engine code "
          f"from {os.path.dirname(os.path.dirname(os.path.abspath(live.__file__)))}")
    print(f"{'policy':<16} {'run':>3} {'host ms/iter (median)':>22} {'mean':>7} "
          f"{'passes ms/iter':>15} {'iterations':>10}")
    for repeat in range(args.repeats):
        for spec in args.policies:
            r = host_ms(target, drafter, spec, prompts, args.batch, args.tokens)
            print(f"{spec:<16} {repeat:>3} {r['median']:>22.2f} {r['mean']:>7.2f} "
                  f"{r['pass_ms']:>15.1f} {r['iterations']:>10}", flush=True)


if __name__ == "__main__":
    main()

"""Choose the EAGLE head's static draft tree from the training split, and score tree sizes.

    python scripts/eagle_tree.py [--nodes 16] [--depth 4] [--score-eval]

Why a tree: the head's top-1 matches the target's next token at ~0.6 of positions, but its
second and third candidates catch a good share of the misses, and the target verifies every
branch in one pass (drafters/tree_layout.py). Which branches: the rank paths that most often lie
on the target's greedy path, counted over the target's greedy answers (128 tokens) to every
training-split (even id) Spec-Bench question. The tree goes to `--out` with what it was built
from; `--score-eval` also prints tokens per step at depth `--depth` on the evaluation split for
several sizes (reported, never used to choose: the choice is the training split's).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from drafters.tree_layout import SHIPPED_TREE
from eagle.chains import eagle_ranks
from eagle.training_data import continue_prompts
from models.eagle_head import SHIPPED_HEAD
from models.tokenizer import chat_prompt
from scripts.eagle_generalization import load_models, require_files
from simulator.draft_tree import build_tree, chain_shape, path_counts, save_tree
from spectune.record import walk
from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts

SIZES = (4, 6, 8, 10, 12, 16, 20, 24, 32)


def tokens_per_step(ranks: list[np.ndarray], shape, k: int) -> float:
    steps = emitted = 0
    for r in ranks:
        run = np.array([0, *(shape.run(row) for row in r[1:])])
        s, e = walk(run, k)
        steps, emitted = steps + s, emitted + e
    return emitted / steps


def split_ranks(head, target, tok, split: str, work: Path, depth: int, max_tokens: int):
    questions = [p for p in load_prompts(DEFAULT_PROMPTS) if in_split(p.key, split)]
    asked = [(p.key, tok.encode(chat_prompt(p.text))) for p in questions]
    answers = continue_prompts(target, asked, [0.0], max_tokens, work / split, eos_id=tok.eos_id)
    return [eagle_ranks(head, target, list(a.prompt), list(a.output[:max_tokens]), depth)
            for a in answers if len(a.output) > 1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=SHIPPED_HEAD)
    ap.add_argument("--nodes", type=int, default=16, help="the tree's size (draft tokens)")
    ap.add_argument("--depth", type=int, default=4, help="the tree's depth (the largest k)")
    ap.add_argument("--max-rank", type=int, default=8, help="candidates considered per node")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("runs/eagle-tree"))
    ap.add_argument("--out", type=Path, default=SHIPPED_TREE)
    ap.add_argument("--score-eval", action="store_true",
                    help="also print tokens per step on the evaluation split per tree size")
    args = ap.parse_args(argv)
    if min(args.nodes, args.depth, args.max_rank, args.max_tokens, args.threads) < 1:
        ap.error("--nodes, --depth, --max-rank, --max-tokens and --threads must be >= 1")
    require_files(ap, head=args.head)
    target, tok, head = load_models(ap, args.head, args.threads)
    started = time.time()
    train = split_ranks(head, target, tok, "train", args.work, args.depth, args.max_tokens)
    counts = path_counts(train, args.depth)
    print(f"training split: {len(train)} answers, {sum(len(r) - 1 for r in train)} positions "
          f"({time.time() - started:.0f} s)", flush=True)
    scored = {"train": train}
    if args.score_eval:
        scored["eval"] = split_ranks(head, target, tok, "eval", args.work, args.depth,
                                     args.max_tokens)
    sizes = sorted({*SIZES, args.nodes})
    print(f"{'nodes':>5} {'per depth':>14} " + " ".join(f"{f'tau {s} k={args.depth}':>16}"
                                                      for s in scored))
    table = {}
    for n in sizes:
        shape = chain_shape(args.depth) if n == args.depth else build_tree(
            counts, n, args.depth, args.max_rank)
        per_depth = [sum(len(p) == d for p in shape.paths) for d in range(1, args.depth + 1)]
        taus = {s: tokens_per_step(r, shape, args.depth) for s, r in scored.items()}
        table[n] = taus
        label = "chain" if n == args.depth else ""
        print(f"{n:>5} {per_depth!s:>14} " + " ".join(f"{taus[s]:>16.3f}" for s in scored)
              + f" {label}", flush=True)
    shape = build_tree(counts, args.nodes, args.depth, args.max_rank)
    digest = hashlib.sha256(args.head.read_bytes()).hexdigest()
    meta = {"head": args.head.name, "head_sha256": digest, "nodes": len(shape),
            "depth": shape.depth, "max_rank": args.max_rank,
            "built_from": f"the target's greedy answers ({args.max_tokens} tokens) to the "
                          f"{len(train)} training-split (even id) Spec-Bench questions",
            "tokens_per_step_train": table[args.nodes]["train"],
            "command": "python scripts/eagle_tree.py " + " ".join(argv or sys.argv[1:])}
    if "eval" in table[args.nodes]:
        meta["tokens_per_step_eval"] = table[args.nodes]["eval"]
    save_tree(shape, args.out, meta)
    print(f"wrote {args.out}: {len(shape)} nodes, depth {shape.depth}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

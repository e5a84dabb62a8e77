"""Where an EAGLE head's acceptance goes: seen vs unseen data of the same kind, per split.

    python scripts/eagle_gap.py [--head runs/eagle-train/head-c.npz] [--threads 1]

Greedy acceptance at k=1 and tokens per step at k=4 (128 tokens per answer) on four sets:
answers to self-written user turns the head was trained on, answers to new ones (another
sampling seed, never trained on), Spec-Bench training-split (even id) questions and evaluation-
split (odd id) ones, the first 3 per category each. Seen vs unseen of the same kind measures
over-fitting; self-written vs Spec-Bench measures the shift to the evaluation prompts. Needs the
training cache of scripts/train_eagle.py under --work (the new turns are cached there too).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle.chains import eagle_runs
from eagle.training_data import continue_prompts, self_prompts
from models.eagle_head import load_head
from models.gguf import load_smollm2
from models.tokenizer import chat_prompt, user_turn_frame
from spectune.record import acceptance_k1, tokens_per_step
from traces.prompts import DEFAULT_PROMPTS, first_per_category, in_split, load_prompts

TOKENS = 128


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=None, help="head .npz (default: the shipped one)")
    ap.add_argument("--work", type=Path, default=Path("runs/eagle-train"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sets", type=int, default=40, help="answers per self-written set")
    args = ap.parse_args(argv)
    for folder in ("self-prompts", "self-continuations", "continuations"):
        if not (args.work / folder).is_dir():
            ap.error(f"{args.work / folder} is missing: run scripts/train_eagle.py "
                     f"--self-prompts 4000 --work {args.work} first (its cache is what was seen)")
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2(torch.float32)
    head = load_head(target, args.head)
    pre, tail = user_turn_frame(tok)

    def turns(folder: str, seed: int, count: int) -> list[tuple[str, list[int]]]:
        asked = self_prompts(target, pre, count, args.work / f"{folder}-prompts", eos_id=tok.eos_id,
                             seed=seed)
        return [(f"{folder}{i}", [*pre, *body, *tail]) for i, body in enumerate(asked)]

    seen_turns = turns("self", 0, 4000)[:: max(1, 4000 // (10 * args.sets))][: args.sets]
    seen = [(p, json.loads((args.work / "self-continuations" / f"{key}-0.json").read_text()))
            for key, p in seen_turns]
    fresh_turns = turns("fresh", 7, int(args.sets * 1.5))[: args.sets]
    fresh = [(list(c.prompt), list(c.output)) for c in continue_prompts(
        target, fresh_turns, [0.0], TOKENS, args.work / "fresh-continuations", eos_id=tok.eos_id,
        seed=7, batch=20)]
    questions = load_prompts(DEFAULT_PROMPTS)

    def spec_bench(split: str, folder: str) -> list[tuple[list[int], list[int]]]:
        chosen = first_per_category([q for q in questions if in_split(q.key, split)], 3)
        keyed = [(q.key, tok.encode(chat_prompt(q.text))) for q in chosen]
        if split == "train":  # the greedy continuation trained on
            return [(p, json.loads((args.work / folder / f"{k}-0.json").read_text()))
                    for k, p in keyed]
        return [(list(c.prompt), list(c.output)) for c in continue_prompts(
            target, keyed, [0.0], TOKENS, args.work / folder, eos_id=tok.eos_id, batch=20)]

    sets = {"self-written, trained on": seen, "self-written, new": fresh,
            "Spec-Bench even ids, trained on": spec_bench("train", "continuations"),
            "Spec-Bench odd ids (evaluation)": spec_bench("eval", "eval")}
    print(f"{'set':34s} {'answers':>7s} {'acc k=1':>8s} {'tok/step k=4':>12s}")
    for name, rows in sets.items():
        runs = [eagle_runs(head, target, p, o[:TOKENS], 4)[0] for p, o in rows if len(o) > 1]
        print(f"{name:34s} {len(runs):>7d} {acceptance_k1(runs):>8.3f} "
              f"{tokens_per_step(runs, 4):>12.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where an EAGLE head loses its acceptance: on sequences it trained on, on new sequences of the
same kind, or on Spec-Bench's held-out questions (eagle/data/README.md).

    python scripts/eagle_generalization.py --head eagle/data/smollm2-135m-eagle.npz

Why: the shipped head matches the target's next token at 0.77 of its training positions but
0.59 of the held-out ones. If new self-written turns (sampled with another seed, so the head
never saw them) score like the training ones, the gap is the held-out questions being unlike
the training data, and more data of the same kind buys little; if they score like the held-out
questions, the head is short of data. Each set: acceptance at k=1 and tokens per step at k=4 of
the head's greedy chains over the target's greedy answers (128 tokens), as the training's
held-out check measures them. Fresh turns are generated (and cached under --work) on this
machine; the rest come from the packed training data.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle.training_data import (
    continue_prompts,
    document_prompts,
    self_prompts,
    unpack_continuations,
)
from models.eagle_head import SHIPPED_HEAD, load_head
from models.gguf import load_smollm2
from models.tokenizer import chat_prompt, user_turn_frame
from scripts.train_eagle import held_out
from traces.prompts import DEFAULT_PROMPTS, first_per_category, in_split, load_prompts

#: The packed data the shipped head's H100 training used.
DATA = Path("eagle/data/training/smollm2-135m-eagle-data-8000-doc.npz")


def held_out_documents(questions, per_category: int) -> list:
    """The first `per_category` held-out (odd-id) summarization and RAG questions each: the
    long real documents the head predicts worst."""
    held = [p for p in questions if in_split(p.key, "eval")
            and p.category in ("summarization", "rag")]
    return first_per_category(held, per_category)


def require_files(ap, **paths: Path) -> None:
    """Refuse (before the target loads) a --head or --data file that is not there."""
    wanted = {"head": "a scripts/train_eagle.py output",
              "data": "the packed file the head was trained on"}
    for name, path in paths.items():
        if not path.is_file():
            ap.error(f"--{name} {path}: no such file (give {wanted[name]})")


def load_models(ap, head: Path, threads: int):
    """(target, tokenizer, head) on `threads` torch threads; a head file that is not one is the
    parser's error, not a traceback."""
    torch.set_num_threads(threads)
    target, tok = load_smollm2(torch.float32)
    try:
        return target, tok, load_head(target, head)
    except ValueError as error:
        ap.error(str(error))


def document_sets(target, tok, fresh, greedy, questions, args) -> dict[str, list]:
    """Long-context turns three ways: documents made of the target's greedy answers (the
    training's kind), of its answers sampled at temperature 1 (text it would not have written
    greedily, as it did not write a news article), and Spec-Bench's own held-out ones."""
    turns = [tok.decode(b) for b in fresh]
    sampled = continue_prompts(target, [(f"fresh{i}", c.prompt) for i, c in enumerate(greedy)],
                               [1.0], args.max_tokens, args.work / "fresh-sampled",
                               eos_id=tok.eos_id, seed=args.fresh_seed)
    out = {}
    for kind, conts in (("greedy", greedy), ("sampled at T=1", sampled)):
        texts = [(q, tok.decode([t for t in c.output if t != tok.eos_id]))
                 for q, c in zip(turns, conts, strict=True) if len(c.output) > 32]
        docs = document_prompts(texts, args.documents, seed=args.fresh_seed)
        out[f"new document turns, {kind} answers"] = continue_prompts(
            target, [(key, tok.encode(chat_prompt(text))) for key, text in docs], [0.0],
            args.max_tokens, args.work / "documents", eos_id=tok.eos_id)
    held = held_out_documents(questions, (args.documents + 1) // 2)
    out["Spec-Bench held-out summarization + rag"] = continue_prompts(
        target, [(p.key, tok.encode(chat_prompt(p.text))) for p in held], [0.0],
        args.max_tokens, args.work / "eval", eos_id=tok.eos_id)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=SHIPPED_HEAD)
    ap.add_argument("--data", type=Path, default=DATA,
                    help="the packed data the head was trained on (its self-prompts count 8000)")
    ap.add_argument("--self-prompts", type=int, default=8000,
                    help="self-written turns sampled for that data (--self-prompts of training)")
    ap.add_argument("--count", type=int, default=40, help="sequences per set")
    ap.add_argument("--fresh-seed", type=int, default=1, help="seed of the new self-written turns")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--documents", type=int, default=0,
                    help="also N new document turns (summarize / RAG forms, as the training's) "
                         "made of greedy answers, N made of answers sampled at temperature 1, "
                         "and N Spec-Bench held-out summarization and RAG questions")
    ap.add_argument("--work", type=Path, default=Path("runs/eagle-generalization"))
    args = ap.parse_args(argv)
    if args.count < 2 or args.documents < 0:
        ap.error(f"--count {args.count}, --documents {args.documents}: give a count of at least "
                 f"2 and a number of documents of at least 0")
    require_files(ap, head=args.head, data=args.data)
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2(torch.float32)
    try:
        head = load_head(target, args.head)
        unpack_continuations(args.data, args.work / "trained")
    except ValueError as error:
        ap.error(str(error))
    pre_query, tail = user_turn_frame(tok)
    trained = self_prompts(target, pre_query, args.self_prompts,
                           args.work / "trained" / "self-prompts", eos_id=tok.eos_id, seed=0)
    answers = continue_prompts(target, [(f"self{i}", [*pre_query, *b, *tail])
                                        for i, b in enumerate(trained[: args.count])],
                               [0.0], 256, args.work / "trained" / "self-continuations",
                               eos_id=tok.eos_id)
    seen_bodies = {tuple(b) for b in trained}
    fresh = [b for b in self_prompts(target, pre_query, 3 * args.count, args.work / "fresh-prompts",
                                     eos_id=tok.eos_id, seed=args.fresh_seed)
             if tuple(b) not in seen_bodies][: args.count]
    fresh_answers = continue_prompts(target, [(f"fresh{i}", [*pre_query, *b, *tail])
                                              for i, b in enumerate(fresh)],
                                     [0.0], args.max_tokens, args.work / "fresh-continuations",
                                     eos_id=tok.eos_id)
    questions = load_prompts(DEFAULT_PROMPTS)
    train_qs = first_per_category([p for p in questions if in_split(p.key, "train")], 3)
    train_q_answers = continue_prompts(target, [(p.key, tok.encode(chat_prompt(p.text)))
                                                for p in train_qs], [0.0], 256,
                                       args.work / "trained" / "continuations", eos_id=tok.eos_id)
    eval_qs = first_per_category([p for p in questions if in_split(p.key, "eval")], 3)
    eval_answers = continue_prompts(target, [(p.key, tok.encode(chat_prompt(p.text)))
                                             for p in eval_qs], [0.0], args.max_tokens,
                                    args.work / "eval", eos_id=tok.eos_id)
    sets = {"self-written turns it trained on": answers,
            f"new self-written turns (seed {args.fresh_seed})": fresh_answers,
            "Spec-Bench even ids it trained on (3 per category)": train_q_answers,
            "Spec-Bench odd ids, held out (3 per category)": eval_answers}
    if args.documents:
        sets.update(document_sets(target, tok, fresh, fresh_answers, questions, args))
    print(f"head {args.head} ({head.meta.get('layers', 1)} layer(s), fused "
          f"{head.meta.get('fuse_layers', [])}); greedy answers cut at {args.max_tokens} tokens")
    print(f"{'set':<52} {'seqs':>5} {'tokens':>7} {'accept k=1':>11} {'tokens/step k=4':>16}")
    for name, conts in sets.items():
        pairs = [(c.prompt, c.output[: args.max_tokens]) for c in conts if len(c.output) > 1]
        figures = held_out(head, target, pairs)
        print(f"{name:<52} {len(pairs):>5} {sum(len(o) for _, o in pairs):>7} "
              f"{figures['acceptance_k1']:>11.3f} {figures['tokens_per_step']:>16.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

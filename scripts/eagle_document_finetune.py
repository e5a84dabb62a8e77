"""Does real document text help the EAGLE head? Fine-tune a head two ways with the same steps and
compare them on held-out questions (eagle/data/README.md).

    python scripts/eagle_document_finetune.py --head eagle/data/smollm2-135m-eagle.npz

Why: the head predicts the target's answers over documents made of the target's own answers far
better than over Spec-Bench's news articles and passages (`scripts/eagle_generalization.py
--documents`), and no corpus of real documents outside the evaluation split is at hand. The
training split's own articles, passages and sentences, recombined into new turns
(`eagle.training_data.recombined_documents`, ~400), are the nearest thing. Arm "control"
fine-tunes on 2 x --replay sequences of the head's own training data (its self-written turns and
Spec-Bench even-id answers, from the packed --data); arm "docs" on --replay of those plus the
target's greedy answers to the recombined turns: the same number of sequences and steps, so a
difference is the documents', not more training's. Each arm starts from --head, and each epoch
is measured on the training's 39 held-out questions (first 3 odd ids per category) and on the
first 20 held-out summarization and 20 RAG questions (128 greedy tokens). Answers and features
are cached under --work; the figures are written to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle.train_spec import TrainSpec
from eagle.training import train_head
from eagle.training_data import (
    Continuation,
    continue_prompts,
    recombined_documents,
    self_prompts,
    unpack_continuations,
)
from models.eagle_head import SHIPPED_HEAD, load_head, read_meta, save_head
from models.gguf import load_smollm2
from models.tokenizer import chat_prompt, user_turn_frame
from scripts.eagle_generalization import DATA, held_out_documents, require_files
from scripts.train_eagle import cached_features, held_out, training_items
from traces import atomic_write
from traces.prompts import DEFAULT_PROMPTS, first_per_category, in_split, load_prompts


def replay_pool(target, tok, work: Path, questions, self_count: int) -> list[Continuation]:
    """The head's own training sequences from the unpacked data: answers to the self-written
    turns and the Spec-Bench even-id continuations (prompts rebuilt from their caches)."""
    pre_query, tail = user_turn_frame(tok)
    asked = self_prompts(target, pre_query, self_count, work / "self-prompts",
                         eos_id=tok.eos_id, seed=0)
    prompts = {f"self{i}": [*pre_query, *body, *tail] for i, body in enumerate(asked)}
    prompts.update({p.key: tok.encode(chat_prompt(p.text)) for p in questions
                    if in_split(p.key, "train")})
    pool = []
    for folder in ("self-continuations", "continuations"):
        for path in sorted((work / folder).glob("*.json")):
            key = path.stem.rsplit("-", 1)[0]
            pool.append(Continuation(path.stem, tuple(prompts[key]),
                                     tuple(json.loads(path.read_text()))))
    return pool


def held_out_sets(target, tok, questions, work: Path) -> dict[str, list]:
    """(prompt, greedy answer) pairs: the training's 39 held-out questions, and the first 20
    held-out summarization and RAG questions each."""
    held = [p for p in questions if in_split(p.key, "eval")]
    sets = {"held-out, 3 per category": first_per_category(held, 3),
            "held-out summarization + rag": held_out_documents(questions, 20)}
    out = {}
    for name, chosen in sets.items():
        conts = continue_prompts(target, [(p.key, tok.encode(chat_prompt(p.text)))
                                          for p in chosen], [0.0], 128, work / "eval",
                                 eos_id=tok.eos_id, batch=16)
        out[name] = [(c.prompt, c.output) for c in conts]
    return out


def fine_tune(target, items, arm: str, args, measure, say) -> list[dict]:
    """One arm: --head trained further on `items`; its figures after each epoch (its weights
    are kept under --work)."""
    head = load_head(target, args.head)
    spec = TrainSpec(epochs=args.epochs, lr=args.lr, warmup_steps=10, seed=0)
    epochs: list[dict] = []

    def evaluate(epoch: int) -> str:
        epochs.append(measure(head, f"{arm} epoch {epoch}"))
        return json.dumps(epochs[-1])

    curve = train_head(head, items, spec, log=say, evaluate=evaluate)
    base = read_meta(args.head)
    save_head(head, args.work / f"head-{arm}.npz", {
        "fine_tuned_from": {"file": args.head.name, **base},
        "fine_tune": {"script": "scripts/eagle_document_finetune.py", "arm": arm,
                      "data": ("recombined training-split documents (greedy answers, 128 "
                               "tokens) and replay" if arm == "docs" else "replay only"),
                      "replay": args.replay if arm == "docs" else 2 * args.replay,
                      "documents": len(items) - args.replay if arm == "docs" else 0,
                      "train": dataclasses.asdict(spec), "curve": curve,
                      "threads": args.threads, "torch": torch.__version__, "device": "cpu"},
        "held_out_first3_per_category": epochs[-1]["held-out, 3 per category"],
        "command": f"python scripts/eagle_document_finetune.py --head {args.head} --replay "
                   f"{args.replay} --lr {args.lr} --epochs {args.epochs} --arms {arm} "
                   f"--threads {args.threads}"})
    return epochs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=SHIPPED_HEAD)
    ap.add_argument("--data", type=Path, default=DATA,
                    help="the packed data the head was trained on (replay comes from it)")
    ap.add_argument("--self-prompts", type=int, default=8000,
                    help="self-written turns sampled for that data (its --self-prompts)")
    ap.add_argument("--replay", type=int, default=400,
                    help="replayed sequences in arm docs (arm control: twice as many)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--arms", default="control,docs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("runs/eagle-document-finetune"))
    ap.add_argument("--out", type=Path, default=Path("runs/eagle-document-finetune/figures.json"))
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or set(arms) - {"control", "docs"}:
        ap.error(f"--arms {args.arms!r}: give control, docs or both, comma-separated")
    if args.replay < 1 or args.epochs < 1 or not args.lr > 0:
        ap.error(f"--replay {args.replay}, --epochs {args.epochs}, --lr {args.lr}: give "
                 f"positive numbers")
    require_files(ap, head=args.head, data=args.data)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {text}", flush=True)

    target, tok = load_smollm2(torch.float32)
    try:
        load_head(target, args.head)  # sets the target's fused layers before any feature
        unpack_continuations(args.data, args.work / "trained")
    except ValueError as error:
        ap.error(str(error))
    questions = load_prompts(DEFAULT_PROMPTS)
    split = [(p.key, p.category or "", p.text) for p in questions if in_split(p.key, "train")]
    turns = [(key, tok.encode(chat_prompt(text))) for key, text in recombined_documents(split)]
    documents = continue_prompts(target, turns, [0.0], 128, args.work / "doc-continuations",
                                 eos_id=tok.eos_id, batch=16,
                                 progress=lambda d, n: say(f"document answers {d}/{n}"))
    say(f"{len(documents)} recombined document turns, "
        f"{sum(len(c.output) for c in documents)} answer tokens")
    pool = replay_pool(target, tok, args.work / "trained", questions, args.self_prompts)
    if len(pool) < 2 * args.replay:
        ap.error(f"--replay {args.replay}: the data holds {len(pool)} replayable sequences; "
                 f"give at most {len(pool) // 2}")
    replay = [pool[i] for i in np.random.default_rng(7).permutation(len(pool))[: 2 * args.replay]]
    sets = held_out_sets(target, tok, questions, args.work)
    figures: dict = {"head": str(args.head), "replay": args.replay, "lr": args.lr,
                     "documents": len(documents), "threads": args.threads, "arms": {}}

    def measure(head, name: str) -> dict:
        row = {k: held_out(head, target, v) for k, v in sets.items()}
        say(f"{name}: " + "  ".join(f"{k} {v['acceptance_k1']:.4f} / {v['tokens_per_step']:.4f}"
                                    for k, v in row.items()))
        return row

    figures["start"] = measure(load_head(target, args.head), "start")
    data_of = {"control": replay, "docs": replay[: args.replay] + list(documents)}
    for arm in arms:
        conts = sorted(data_of[arm], key=lambda c: (c.prompt, c.key))
        items = training_items(conts, cached_features(target, conts, args.work / "features"),
                               set())
        figures["arms"][arm] = {"sequences": len(conts),
                                "epochs": fine_tune(target, items, arm, args, measure, say)}
        with atomic_write(args.out) as handle:  # each finished arm kept
            handle.write(json.dumps(figures, indent=1).encode())
    say(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

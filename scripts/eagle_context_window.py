"""Does the EAGLE head lose its long documents to distances it never trained on?

    python scripts/eagle_context_window.py --head eagle/data/smollm2-135m-eagle.npz

Why: training cuts every sequence to its last 512 positions (`TrainSpec.window`), so the head
never attends further back than that, while Spec-Bench's summarization and RAG prompts run to
1,400 tokens, where the head is weakest. Here the head drafts over the first 20 held-out
summarization and 20 RAG questions (the target's 128 greedy tokens) with its context cut to
the last W positions at the last output token (the target still reads everything: its features
are computed over the whole prompt), as training would show it. If the cut scored better, the
head should slide a window at inference; it does not (eagle/data/README.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle.chains import eagle_runs
from eagle.training_data import continue_prompts, target_features
from models.eagle_head import SHIPPED_HEAD
from models.tokenizer import chat_prompt
from scripts.eagle_generalization import held_out_documents, load_models, require_files
from spectune.record import acceptance_k1, tokens_per_step
from traces.prompts import DEFAULT_PROMPTS, load_prompts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=SHIPPED_HEAD)
    ap.add_argument("--windows", default="0,1024,512,384,256",
                    help="context windows in positions (0: the whole context)")
    ap.add_argument("--per-category", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("runs/eagle-generalization"),
                    help="where the greedy answers are cached (eval/)")
    args = ap.parse_args(argv)
    try:
        windows = [int(w) for w in args.windows.split(",") if w.strip()]
    except ValueError:
        windows = []
    if not windows or any(w < 0 or 0 < w <= 128 for w in windows):
        ap.error(f"--windows {args.windows!r}: give comma-separated positions, each 0 (the whole "
                 f"context) or more than the 128 answer tokens")
    require_files(ap, head=args.head)
    target, tok, head = load_models(ap, args.head, args.threads)
    held = held_out_documents(load_prompts(DEFAULT_PROMPTS), args.per_category)
    conts = continue_prompts(target, [(p.key, tok.encode(chat_prompt(p.text))) for p in held],
                             [0.0], 128, args.work / "eval", eos_id=tok.eos_id, batch=16)
    runs: dict[int, dict[str, list]] = {w: {} for w in windows}
    for p, c in zip(held, conts, strict=True):
        prompt, output = list(c.prompt), list(c.output[:128])
        features = target_features(target, prompt + output[:-1])
        for w in windows:
            cut = 0 if w == 0 else max(0, len(prompt) - (w - len(output)))
            run, _ = eagle_runs(head, target, prompt[cut:], output, 4, features=features[cut:])
            runs[w].setdefault(p.category, []).append(run)
    print(f"head {args.head}; {len(held)} held-out questions, prompts of "
          f"{min(len(c.prompt) for c in conts)}-{max(len(c.prompt) for c in conts)} tokens; "
          f"acceptance k=1 / tokens per step k=4")
    for w in windows:
        pooled = [r for rows in runs[w].values() for r in rows]
        cells = "  ".join(f"{cat} {acceptance_k1(r):.3f} / {tokens_per_step(r, 4):.3f}"
                          for cat, r in runs[w].items())
        print(f"window {w or 'all':>5}: all {acceptance_k1(pooled):.3f} / "
              f"{tokens_per_step(pooled, 4):.3f}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How much an EAGLE head and n-gram lookup could gain from each other: per-position analysis.

    python scripts/hybrid_gap.py [--head PATH] [--per-category 3] [--work runs/hybrid-gap]

For the greedy outputs of evaluation-split (odd id) Spec-Bench questions, every position's head
chain (from the true prefix, as recorded) and the n-gram lookup's next-token proposal at every
position; then acceptance at k=1 and tokens per step at k=4 for the head alone, the lookup alone,
the oracle that takes whichever is right, and choice rules a live drafter could apply (it knows
the head's distribution and whether the lookup proposes anything, never the target's token).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from drafters.ngram import NgramDrafter
from eagle.chains import chain_passes
from eagle.training_data import continue_prompts, target_features
from models.eagle_head import load_head
from models.gguf import load_smollm2
from models.tokenizer import chat_prompt
from traces.prompts import DEFAULT_PROMPTS, first_per_category, in_split, load_prompts

K = 4


@torch.no_grad()
def head_chains(head, target, prompt, output, k: int):
    """drafts [T, k], the head's top-1 prob [T, k] and its whole draft-vocabulary distribution
    [T, k, V_d] per chain start t and depth (teacher-forced chains, -1 where none)."""
    tokens = torch.tensor([*prompt, *output][:-1])
    features = target_features(target, tokens.tolist())
    n_prompt, n_out = len(prompt), len(output)
    drafts = np.full((n_out, k), -1, dtype=np.int64)
    top1 = np.zeros((n_out, k), dtype=np.float32)
    probs = torch.zeros(n_out, k, head.draft_vocab)
    for depth, rows, predicted in chain_passes(head, tokens, features, k, max(n_prompt - 1, 0)):
        q = torch.softmax(head.draft_logits(predicted).float(), dim=-1)
        t = torch.arange(rows.start, rows.stop) - n_prompt + 2
        keep = (t >= 1) & (t + depth - 1 < n_out)
        best = q.max(dim=-1)
        drafts[t[keep].numpy(), depth - 1] = head.vocab_ids[best.indices[keep]].numpy()
        top1[t[keep].numpy(), depth - 1] = best.values[keep].numpy()
        probs[t[keep], depth - 1] = q[keep]
    return drafts, top1, probs


def runs_of(right, n_out: int, k: int) -> np.ndarray:
    """run[t] over chain starts t >= 1: depths while right(t, d, s) holds (s = t + d)."""
    run = np.zeros(n_out, dtype=np.int32)
    for t in range(1, n_out):
        n = 0
        while n < k and t + n < n_out and right(t, n, t + n):
            n += 1
        run[t] = n
    return run


def rule_runs(choose, output, drafts, top1, probs, index, ngram, length, k: int) -> np.ndarray:
    """run[t] for a rule choose(head token, head top1, head prob of the lookup's token, lookup
    token, lookup's match length) -> token."""
    def right(t, d, s):
        if drafts[t, d] < 0:
            return False
        g = ngram[s]
        pg = float(probs[t, d, index[g]]) if g in index else 0.0
        return choose(drafts[t, d], top1[t, d], pg, g, length[s]) == output[s]
    return runs_of(right, len(output), k)


def oracle_runs(output, drafts, ngram, k: int) -> np.ndarray:
    """run[t] if each depth took whichever of the head and the lookup is right."""
    return runs_of(lambda t, d, s: output[s] in (drafts[t, d], ngram[s]), len(output), k)


def summary(runs: list[np.ndarray], k: int) -> tuple[float, float]:
    flat = np.concatenate([r[1:] for r in runs])
    acc = float(np.mean(flat >= 1))
    steps = emitted = 0
    for r in runs:  # walk: from t, emit min(run, k) + 1 tokens
        t = 1
        while t < len(r):
            e = min(int(r[t]), k) + 1
            steps, emitted, t = steps + 1, emitted + e, t + e
    return acc, emitted / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=Path("runs/hybrid-gap"))
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tok = load_smollm2(torch.float32)
    head = load_head(target, args.head)
    index = {int(v): i for i, v in enumerate(head.vocab_ids.tolist())}
    chosen = first_per_category([q for q in load_prompts(DEFAULT_PROMPTS)
                                 if in_split(q.key, "eval")], args.per_category)
    keyed = [(q.key, tok.encode(chat_prompt(q.text))) for q in chosen]
    conts = continue_prompts(target, keyed, [0.0], args.tokens, args.work / "outputs",
                             eos_id=tok.eos_id, batch=16)
    rules = {
        "head": lambda h, p, pg, g, n: h,
        "lookup": lambda h, p, pg, g, n: g,
        "oracle": None,
        "lookup if any": lambda h, p, pg, g, n: g if g >= 0 else h,
    }
    for theta in (0.3, 0.5, 0.7):
        rules[f"lookup if any, head top1<{theta}"] = (
            lambda h, p, pg, g, n, th=theta: g if g >= 0 and p < th else h)
    for beta in (0.05, 0.2):
        rules[f"lookup if head prob of it >= {beta} x top1"] = (
            lambda h, p, pg, g, n, b=beta: g if g >= 0 and pg >= b * p else h)
    for least in (2, 3):
        rules[f"lookup if match >= {least}"] = (
            lambda h, p, pg, g, n, m=least: g if n >= m else h)
        for theta in (0.3, 0.5, 0.7):
            rules[f"lookup if match >= {least} or head top1<{theta}"] = (
                lambda h, p, pg, g, n, m=least, th=theta: g if n >= m or (g >= 0 and p < th)
                else h)
        for theta in (0.7, 0.9):
            rules[f"lookup if match >= {least} and top1<{theta} or top1<0.3"] = (
                lambda h, p, pg, g, n, m=least, th=theta: g if (n >= m and p < th) or (
                    g >= 0 and p < 0.3) else h)
    per_rule: dict[str, dict[str, list]] = {name: {} for name in rules}
    for q, c in zip(chosen, conts):
        output = list(c.output)
        if len(output) < 2:
            continue
        drafts, top1, probs = head_chains(head, target, list(c.prompt), output, K)
        ngram, length = NgramDrafter().next_tokens(list(c.prompt), output)
        for name, rule in rules.items():
            if rule is None:  # right if either is right, at every depth
                run = oracle_runs(output, drafts, ngram, K)
            else:
                run = rule_runs(rule, output, drafts, top1, probs, index, ngram, length, K)
            per_rule[name].setdefault(str(q.category), []).append(run)
    cats = sorted(per_rule["head"])
    print(f"{len(conts)} evaluation prompts ({args.per_category} per category), "
          f"{args.tokens} greedy tokens; acceptance k=1 / tokens per step k={K}")
    print(f"{'rule':46s} {'all':>13s}  " + " ".join(f"{c[:9]:>11s}" for c in cats))
    for name, by_cat in per_rule.items():
        every = [r for rows in by_cat.values() for r in rows]
        acc, tau = summary(every, K)
        cells = " ".join("{:.2f}/{:.2f}".format(*summary(by_cat[c], K)).rjust(11) for c in cats)
        print(f"{name:46s} {acc:6.3f}/{tau:5.2f}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

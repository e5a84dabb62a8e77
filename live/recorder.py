"""Record speculation traces by teacher forcing (docs/design.md "Speculation traces").

Greedy decoding fixes the target's output, so per request the target writes its output once and
the drafter is run from the true prefix at every output position t: run[t] is how many of its
proposals match the output from t on (capped at `max_run`; run[0] = 0, the prefill's token), and
the signals come from the same pass. A model drafter needs one teacher-forced pass, the n-gram
lookup none, the EAGLE head every position's chain (it drafts from predicted features). At a
temperature > 0 the output is sampled, and the trace is still exact for that draw. Per drafter,
the signals and their guards, and why sampling stays exact: docs/recording.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from drafters.base import Drafter
from drafters.ngram import NgramDrafter
from models.generate import greedy_output, target_output
from models.llama import LlamaModel, greedy_tokens
from traces import RequestSpeculation, run_from_matches

__all__ = ["model_signals", "ngram_runs", "record_outputs", "record_request"]


def ngram_runs(
    drafter: NgramDrafter, prompt: Sequence[int], output: Sequence[int], max_run: int
) -> tuple[np.ndarray, np.ndarray]:
    """(run, proposable) for the n-gram lookup from the true prefix at every position t:
    the matching prefix of its proposals, and how many it could propose at all (it runs out
    of matching text; the simulator drafts no more than that)."""
    run, proposable, _ = _ngram_walk(drafter, prompt, output, max_run)
    return run, proposable


def _ngram_walk(
    drafter: NgramDrafter, prompt: Sequence[int], output: Sequence[int], max_run: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`ngram_runs` and, per position, the first proposed token (output[t] where the lookup
    proposes nothing): the one-hot draft a live step at t would verify first."""
    history = list(prompt) + list(output)
    run = np.zeros(len(output), dtype=np.int32)
    proposable = np.zeros(len(output), dtype=np.int32)
    first = np.asarray(output, dtype=np.int64).copy()
    for t in range(1, len(output)):
        proposal = drafter.lookup(history[: len(prompt) + t], max_run)
        proposable[t] = len(proposal)
        if proposal:
            first[t] = proposal[0]
        n = 0
        for a, b in zip(proposal, output[t:]):
            if a != b:
                break
            n += 1
        run[t] = n
    return run, proposable, first


@torch.no_grad()
def model_signals(
    draft: LlamaModel,
    prompt: Sequence[int],
    output: Sequence[int],
    target_logits: torch.Tensor,
    max_run: int,
) -> dict[str, np.ndarray]:
    """run and the four signals for a model drafter, from one teacher-forced draft pass."""
    device = draft.config.device
    sequence = torch.tensor(list(prompt) + list(output[:-1]), device=device)
    rows = draft([sequence], [draft.new_cache(len(sequence))], logits="all")[0]
    rows = rows[len(prompt) - 1 :].float().cpu()  # row t predicts output[t]
    match = greedy_tokens(rows).numpy() == np.asarray(output)
    run = run_from_matches(match, max_run).astype(np.int32)
    run[0] = 0  # the prefill emits position 0
    logp = torch.log_softmax(target_logits.float(), dim=-1)
    logq = torch.log_softmax(rows, dim=-1)
    p, q = logp.exp(), logq.exp()
    kl = (p * (logp - logq)).sum(dim=-1).clamp(min=1e-8)
    return {
        "run": run,
        "accept_prob": torch.minimum(p, q).sum(dim=-1).clamp(max=1.0).numpy(),
        "kl": kl.numpy(),
        "draft_top1": q.max(dim=-1).values.numpy(),
        "draft_entropy": torch.special.entr(q).sum(dim=-1).numpy(),
    }


def record_request(
    target: LlamaModel,
    drafter: Drafter,
    prompt: Sequence[int],
    max_tokens: int,
    eos_id: int | None = None,
    max_run: int = 16,
    key: str = "",
    category: str | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[RequestSpeculation, list[int]]:
    """One request's speculation record and the target's output tokens (greedy, or sampled at
    `temperature` > 0 from `generator`)."""
    if max_run < 1:
        raise ValueError(f"max_run must be >= 1, got {max_run}")
    if len(prompt) < 1:
        raise ValueError(f"request {key!r}: empty prompt")
    if temperature > 0 or drafter.needs_hidden:
        output, _ = target_output(target, prompt, max_tokens, eos_id, temperature=temperature,
                                  generator=generator)
        record = record_outputs(target, drafter, prompt, output, max_run,
                                want_kl=not drafter.model_free, key=key, category=category,
                                temperature=temperature)
        return record, output
    if isinstance(drafter, NgramDrafter):
        output, _ = greedy_output(target, prompt, max_tokens, eos_id)
        n = len(output)
        run, proposable = ngram_runs(drafter, prompt, output, max_run)
        record = RequestSpeculation(
            run=run, proposable=proposable,
            draft_top1=np.ones(n, dtype=np.float32),
            draft_entropy=np.zeros(n, dtype=np.float32),
            key=key, category=category)  # fmt: skip
        return record, output
    draft = drafter.model
    if not isinstance(draft, LlamaModel):
        raise ValueError(f"drafter {drafter.name!r}: cannot record (neither n-gram nor a model)")
    output, logits = greedy_output(target, prompt, max_tokens, eos_id, keep_logits=True)
    signals = model_signals(draft, prompt, output, logits, max_run)
    return RequestSpeculation(**signals, key=key, category=category), output


@torch.no_grad()
def record_outputs(
    target: LlamaModel,
    drafter: Drafter,
    prompt: Sequence[int],
    output: Sequence[int],
    max_run: int,
    want_kl: bool = False,
    key: str = "",
    category: str | None = None,
    temperature: float = 0.0,
) -> RequestSpeculation:
    """The record of an output that was already generated (by the live engine), with the
    signals computed exactly as the live engine computes them (`distribution_signals`: float32
    softmax, probabilities clamped inside the logs; the target's at `temperature` when the output
    was sampled), so a replay feeds a policy the same values.

    n-gram: run and proposable from the true prefix (`ngram_runs`), top-1 1.0, entropy 0.0, and
    with `want_kl` the KL against the one-hot proposal the live step at t would have made (its
    first token, or output[t] where the lookup proposes nothing). Model drafters: one
    teacher-forced draft pass (argmax, top-1, entropy) and, with `want_kl`, one target pass
    for KL and the acceptance probability sum min(p, q).
    """
    from live.verify import distribution_signals

    prompt, output = [int(t) for t in prompt], [int(t) for t in output]
    n, device = len(output), target.config.device
    sequence = torch.tensor(prompt + output[:-1], dtype=torch.int64, device=device)
    p = None
    if drafter.needs_hidden:
        return _eagle_record(target, drafter, prompt, output, sequence, max_run, key, category,
                             temperature)
    if want_kl:
        rows = target([sequence], [target.new_cache(len(sequence))], logits="all")[0]
        scale = temperature if temperature > 0 else 1.0
        p = torch.softmax(rows[len(prompt) - 1 :].float() / scale, dim=-1)
    if isinstance(drafter, NgramDrafter):
        run, proposable, first = _ngram_walk(drafter, prompt, output, max_run)
        top1, entropy = np.ones(n, np.float32), np.zeros(n, np.float32)
        q = None
        if p is not None:
            q = torch.nn.functional.one_hot(torch.as_tensor(first), p.shape[-1]).to(p)
    else:
        draft = drafter.model
        if not isinstance(draft, LlamaModel):
            raise ValueError(f"drafter {drafter.name!r}: cannot record (neither n-gram nor a "
                             "model)")
        proposable = None  # a model drafter can always propose
        rows = draft([sequence], [draft.new_cache(len(sequence))], logits="all")[0]
        q = torch.softmax(rows[len(prompt) - 1 :].float(), dim=-1)
        match = greedy_tokens(q).cpu().numpy() == np.asarray(output)
        run = run_from_matches(match, max_run).astype(np.int32)
        run[0] = 0
        top1 = q.max(dim=-1).values.float().cpu().numpy()
        entropy = (-(q * q.clamp_min(1e-30).log()).sum(dim=-1)).float().cpu().numpy()
    values: dict[str, np.ndarray] = {}
    if p is not None:  # a lookup's one-hot q makes accept_prob degenerate: KL only for n-gram
        names = frozenset({"kl"} if proposable is not None else {"kl", "accept_prob"})
        values = {k: v.astype(np.float32) for k, v in distribution_signals(p, q, names).items()}
    return RequestSpeculation(run=run, draft_top1=top1, draft_entropy=entropy, key=key,
                              category=category, proposable=proposable, **values)


def _eagle_record(target: LlamaModel, drafter, prompt: list[int], output: list[int],
                  sequence: torch.Tensor, max_run: int, key: str, category: str | None,
                  temperature: float) -> RequestSpeculation:
    """An EAGLE head's record: one target pass gives the features its chains start from and the
    target's distributions; every position's chain runs batched (`eagle.chains.eagle_runs`, equal
    to the live drafter's chains); signals from the first draft's distribution, as live."""
    from eagle.chains import eagle_runs
    from live.verify import distribution_signals

    hidden = target([sequence], [target.new_cache(len(sequence))], logits="hidden")[0]
    scale = temperature if temperature > 0 else 1.0
    rows = target.logits_of(hidden[len(prompt) - 1 :])
    p = torch.softmax(rows.float() / scale, dim=-1)
    head = drafter.head
    run, first = eagle_runs(head, target, prompt, output, max_run, features=hidden.float().clone(),
                            lookup=drafter.lookup, lookup_min_match=drafter.lookup_min_match,
                            tree=drafter.tree)
    q = torch.zeros_like(p)
    q[:, head.vocab_ids.to(q.device)] = first.float().to(q.device)
    top1 = q.max(dim=-1).values.float().cpu().numpy()
    entropy = torch.special.entr(q).sum(dim=-1).float().cpu().numpy()
    values = {k: v.astype(np.float32) for k, v in distribution_signals(p, q).items()}
    return RequestSpeculation(run=run, draft_top1=top1, draft_entropy=entropy, key=key,
                              category=category, **values)

"""What vLLM's n-gram drafter accepted, as a speculation trace the simulator replays.

Greedy decoding fixes each request's output, and vLLM's n-gram proposer is the lookup
drafters/ngram.py implements (longest suffix of 1-3 tokens, its earliest earlier occurrence), so
run[g] and proposable[g] follow from the prompt and the output vLLM wrote, exactly as
`spectune record` computes them (`live.recorder.ngram_runs`). `per_step_check` replays vLLM's
own schedule of proposals over that trace and compares it with the per-step counts vLLM reported
(`--per-request-spec-decode-metrics detailed`): agreement is what makes the replay exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from drafters.ngram import NgramDrafter
from live.recorder import ngram_runs
from traces import RequestSpeculation, SpeculationTrace


def ngram_trace(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                max_run: int, meta: dict, min_n: int = 1, max_n: int = 3,
                keys: Sequence[str] | None = None,
                categories: Sequence[str] | None = None) -> SpeculationTrace:
    """The n-gram lookup's run and proposable at every output position of every request
    (keyed by `keys`, else by position)."""
    drafter = NgramDrafter(min_n, max_n)
    records = []
    for i, (prompt, output) in enumerate(zip(prompts, outputs)):
        run, proposable = ngram_runs(drafter, [int(t) for t in prompt],
                                     [int(t) for t in output], max_run)
        n = len(output)
        records.append(RequestSpeculation(
            run=run, proposable=proposable, draft_top1=np.ones(n, dtype=np.float32),
            draft_entropy=np.zeros(n, dtype=np.float32),
            key=str(i) if keys is None else str(keys[i]),
            category=None if categories is None else str(categories[i])))
    return SpeculationTrace(records, {"drafter": f"ngram (vLLM, {min_n}-{max_n})",
                                      "max_run": max_run, **meta})


@dataclass(frozen=True)
class StepCheck:
    """Requests whose replayed steps equal vLLM's, those that differ only in their last step
    (vLLM counts drafts accepted past max_tokens there), those that equal it once some steps
    are read as vLLM's zero drafts (a request of the batch near max_model_len stops the
    proposer for everyone: docs/vllm-v1-scheduler.md 5.3), and the others."""

    identical: int
    last_step_only: int
    different: int
    zero_drafts: int = 0


def replayed_steps(run: np.ndarray, proposable: np.ndarray, k: int
                   ) -> tuple[list[int], list[int]]:
    """(drafted, accepted) per verify step that drafted anything, vLLM's order: the step after
    the prefill drafts at output position 1, each step accepts min(drafted, run) and emits one
    more token."""
    drafted, accepted = [], []
    g, n = 1, len(run)
    while g < n:
        d = min(k, int(proposable[g]))
        a = min(d, int(run[g]))
        if d:
            drafted.append(d)
            accepted.append(a)
        g += a + 1
    return drafted, accepted


def explained_by_zero_drafts(run: np.ndarray, proposable: np.ndarray, k: int, prompt: int,
                             max_model_len: int, drafted: Sequence[int],
                             accepted: Sequence[int]) -> bool:
    """Whether vLLM's arrays are the replay's steps with some of them zero-draft steps: K
    drafts, none accepted, one token emitted. Drafts of either kind are cut to
    max_model_len - N - 1 (the scheduler keeps the step's 1 + drafts tokens below
    max_model_len). A search over (output position, array index); the last step may count
    drafts accepted past the end."""
    n, steps = len(run), len(drafted)
    frontier, seen = [(1, 0)], set()
    while frontier:
        g, i = frontier.pop()
        if (g, i) in seen:
            continue
        seen.add((g, i))
        if g >= n:
            if i == steps:
                return True
            continue
        room = max_model_len - prompt - g - 1
        d = max(min(k, int(proposable[g]), room), 0)
        a = min(d, int(run[g]))
        if d == 0:
            frontier.append((g + 1, i))
        elif i < steps and drafted[i] == d and (accepted[i] == a or (
                i == steps - 1 and accepted[i] > a and g + a + 1 >= n)):
            frontier.append((g + a + 1, i + 1))
        if i < steps and drafted[i] == min(k, room) > 0 and accepted[i] == 0:
            frontier.append((g + 1, i + 1))
    return False


def per_step_check(trace: SpeculationTrace, k: int,
                   reported: Sequence[tuple[Sequence[int], Sequence[int]]],
                   prompt_tokens: Sequence[int] | None = None,
                   max_model_len: int | None = None) -> StepCheck:
    """Compare the trace's replay with vLLM's (drafted, accepted) arrays, request by request;
    given the prompts' lengths and max_model_len, a request that differs is tried against
    zero-draft steps too."""
    counts = [0, 0, 0, 0]
    for i, (record, (drafted, accepted)) in enumerate(zip(trace.requests, reported)):
        ours = replayed_steps(record.run, record.proposable, k)
        theirs = (list(drafted), list(accepted))
        if ours == theirs:
            counts[0] += 1
        elif ours[0][:-1] == theirs[0][:-1] and ours[1][:-1] == theirs[1][:-1]:
            counts[1] += 1
        elif max_model_len is not None and prompt_tokens is not None and \
                explained_by_zero_drafts(record.run, record.proposable, k,
                                         int(prompt_tokens[i]), max_model_len, *theirs):
            counts[3] += 1
        else:
            counts[2] += 1
    return StepCheck(*counts)

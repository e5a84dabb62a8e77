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
    (vLLM counts drafts accepted past max_tokens there), and the others."""

    identical: int
    last_step_only: int
    different: int


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


def per_step_check(trace: SpeculationTrace, k: int,
                   reported: Sequence[tuple[Sequence[int], Sequence[int]]]) -> StepCheck:
    """Compare the trace's replay with vLLM's (drafted, accepted) arrays, request by request."""
    counts = [0, 0, 0]
    for record, (drafted, accepted) in zip(trace.requests, reported):
        ours = replayed_steps(record.run, record.proposable, k)
        theirs = (list(drafted), list(accepted))
        if ours == theirs:
            counts[0] += 1
        elif ours[0][:-1] == theirs[0][:-1] and ours[1][:-1] == theirs[1][:-1]:
            counts[1] += 1
        else:
            counts[2] += 1
    return StepCheck(*counts)

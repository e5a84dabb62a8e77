"""Training data for the EAGLE head: the target's own continuations, and its features over them.

EAGLE's head learns to predict the target's next last-layer feature, so its data is the target
itself: prompts (outside the evaluation split) continued by the target, greedy and sampled, then
one teacher-forced target pass over prompt + continuation giving the feature (the last layer's
output before the final norm) at every position. Continuations are cached one file per (prompt,
sample) so an interrupted run resumes, and fixed by (seed, prompt key, sample index).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from profiler.model import LlamaModel
from profiler.record import output_generator, target_outputs
from traces import atomic_write


@dataclass(frozen=True)
class Continuation:
    """One training sequence: a prompt (token ids) and what the target wrote after it."""

    key: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt, *self.output]


def continue_prompts(
    target: LlamaModel,
    prompts: Sequence[tuple[str, Sequence[int]]],
    temperatures: Sequence[float],
    max_tokens: int,
    folder: Path,
    *,
    eos_id: int | None,
    seed: int = 0,
    batch: int = 16,
    progress=None,
) -> list[Continuation]:
    """Each (key, prompt) continued once per temperature (0: greedy), cached under `folder`.

    Sample j of prompt `key` draws from the stream fixed by (seed, f"{key}/{j}"), so a resumed or
    re-batched run writes the same files (up to batched near-ties, as any batched generation).
    """
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(f"{key}-{j}", list(prompt), t, f"{key}/{j}")
            for j, t in enumerate(temperatures) for key, prompt in prompts]
    out: dict[str, Continuation] = {}
    todo = []
    for name, prompt, t, stream in jobs:
        path = folder / f"{name}.json"
        if path.is_file():
            out[name] = Continuation(name, tuple(prompt), tuple(json.loads(path.read_text())))
        else:
            todo.append((name, prompt, t, stream))
    by_temperature: dict[float, list] = {}
    for job in todo:
        by_temperature.setdefault(job[2], []).append(job)
    done = len(out)
    for t, group in by_temperature.items():
        for start in range(0, len(group), batch):
            chunk = group[start : start + batch]
            streams = [output_generator(seed, stream) for *_, stream in chunk]
            outputs = target_outputs(target, [p for _, p, _, _ in chunk], max_tokens, eos_id, t,
                                     streams if t > 0 else None)
            for (name, prompt, _, _), output in zip(chunk, outputs):
                with atomic_write(folder / f"{name}.json") as handle:
                    handle.write(json.dumps(output).encode())
                out[name] = Continuation(name, tuple(prompt), tuple(output))
            done += len(chunk)
            if progress is not None:
                progress(done, len(jobs))
    return [out[name] for name, *_ in jobs]


@torch.no_grad()
def target_features(target: LlamaModel, tokens: Sequence[int]) -> torch.Tensor:
    """The target's last-layer output before the final norm at every position [N, hidden] in
    fp32: one teacher-forced pass, as the live engine's verify passes compute it."""
    sequence = torch.tensor(list(tokens), dtype=torch.int64, device=target.config.device)
    hidden = target([sequence], [target.new_cache(len(sequence))], logits="hidden")[0]
    return hidden.float().cpu().clone()  # a normal tensor (training saves it for backward)


def self_prompts(
    target: LlamaModel,
    pre_query: Sequence[int],
    count: int,
    folder: Path,
    *,
    eos_id: int,
    seed: int = 0,
    batch: int = 32,
    max_tokens: int = 96,
    min_tokens: int = 6,
    progress=None,
) -> list[list[int]]:
    """User turns the instruct model writes itself (Magpie: Xu et al. 2024, arXiv:2406.08464).

    Given only its chat template up to the start of a user turn (`pre_query`), an aligned model
    samples what a user would ask; at temperature 1 the questions are as varied as its chat
    training data. `count` are sampled (cached like any continuation); kept are those that end
    (EOS) within `max_tokens` with at least `min_tokens` tokens, without repeats. Returned without
    the EOS, in sampling order."""
    conts = continue_prompts(target, [(f"q{i}", pre_query) for i in range(count)], [1.0],
                             max_tokens, folder, eos_id=eos_id, seed=seed, batch=batch,
                             progress=progress)
    seen: set[tuple[int, ...]] = set()
    out = []
    for c in conts:
        body = c.output[:-1]
        if not c.output or c.output[-1] != eos_id or len(body) < min_tokens or body in seen:
            continue
        seen.add(body)
        out.append(list(body))
    return out

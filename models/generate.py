"""The target's own continuations of prompts: greedy, or sampled from per-request seeded streams.

What the recorder teacher-forces drafters over (live/recorder.py) and what EAGLE training learns
from (eagle/training_data.py): both need the output the target itself writes, one by one or batched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from models.llama import LlamaModel, greedy_tokens

__all__ = ["greedy_output", "greedy_outputs", "output_generator", "target_output",
           "target_outputs"]


def _choose(logits: torch.Tensor, temperature: float,
            generators: Sequence[torch.Generator | None]) -> list[int]:
    """The next token per row of `logits` [B, vocab]: argmax, or at a temperature > 0 a sample
    from softmax(logits / T) (float64, as the live engine samples) with that row's generator."""
    if temperature <= 0:
        return greedy_tokens(logits).tolist()
    # on the CPU: each row's stream is a CPU generator, so a sampled recording draws the same
    # tokens whichever device computed the logits (a GPU's own generators would draw others)
    p = torch.softmax(logits.double() / temperature, dim=-1).cpu()
    return [int(torch.multinomial(row, 1, generator=g)) for row, g in zip(p, generators)]


def output_generator(seed: int, key: str) -> torch.Generator:
    """The sampling stream of one request: fixed by (seed, key), so a sampled recording is the
    same whether its prompts run one by one or batched, and a resumed run continues it."""
    digest = hashlib.blake2b(f"{int(seed)}/{key}".encode(), digest_size=4).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))  # it keeps 32 bits


@torch.no_grad()
def target_output(
    target: LlamaModel,
    prompt: Sequence[int],
    max_tokens: int,
    eos_id: int | None = None,
    keep_logits: bool = False,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], torch.Tensor | None]:
    """The target's own output (prefill, then one token per pass): greedy, or sampled at
    `temperature` > 0 from `generator`; and, if asked, the fp32 logits that chose each output
    token [N, vocab] (untempered)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    device = target.config.device
    cache = target.new_cache(len(prompt) + max_tokens)
    logits = target([torch.tensor(list(prompt), device=device)], [cache], logits="last")[0][0]
    out: list[int] = []
    rows: list[torch.Tensor] = []
    while True:
        token = _choose(logits[None], temperature, [generator])[0]
        out.append(token)
        if keep_logits:
            rows.append(logits.float().cpu())
        if len(out) == max_tokens or token == eos_id:
            return out, (torch.stack(rows) if keep_logits else None)
        feed = torch.tensor([token], device=device)
        logits = target([feed], [cache], logits="last")[0][0]


def greedy_output(
    target: LlamaModel,
    prompt: Sequence[int],
    max_tokens: int,
    eos_id: int | None = None,
    keep_logits: bool = False,
) -> tuple[list[int], torch.Tensor | None]:
    """`target_output` at temperature 0."""
    return target_output(target, prompt, max_tokens, eos_id, keep_logits)


@torch.no_grad()
def target_outputs(
    target: LlamaModel,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    eos_id: int | None = None,
    temperature: float = 0.0,
    generators: Sequence[torch.Generator] | None = None,
) -> list[list[int]]:
    """`target_output` for many prompts at once: one ragged prefill, then one decode pass per
    step over the prompts still generating (several times faster on a CPU than one by one; a
    batched pass may round a near-tie of the logits the other way, as any batched engine does).
    Sampling draws each prompt's tokens from its own generator.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if temperature > 0 and (generators is None or len(generators) != len(prompts)):
        raise ValueError("sampling needs one generator per prompt")
    streams = list(generators) if generators is not None else [None] * len(prompts)
    device = target.config.device
    caches = [target.new_cache(len(p) + max_tokens) for p in prompts]
    feeds = [torch.tensor(list(p), dtype=torch.int64, device=device) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    while active:
        logits = target(feeds, [caches[i] for i in active], logits="last")
        chosen = _choose(torch.cat(logits), temperature, [streams[i] for i in active])
        still = []
        for i, token in zip(active, chosen):
            outs[i].append(token)
            if len(outs[i]) < max_tokens and token != eos_id:
                still.append(i)
        active = still
        feeds = [torch.tensor([outs[i][-1]], device=device) for i in active]
    return outs


def greedy_outputs(
    target: LlamaModel,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    eos_id: int | None = None,
) -> list[list[int]]:
    """`target_outputs` at temperature 0."""
    return target_outputs(target, prompts, max_tokens, eos_id)

"""One greedy verification pass over a batch of draft chains, and the signals a policy may see.

Each request feeds [last, d_1 .. d_n] into one ragged target pass; d_{i+1} is accepted while it
equals the target's argmax after d_i (Leviathan et al. 2023), and the next row gives the bonus
token or the correction. Every emitted token is the target's own greedy choice, so the output
equals target-only greedy decoding (up to rounding on exact near-ties). The signals (KL,
accept_prob, draft top-1 and entropy; docs/policies.md §7) are computed for observed positions
only: the accepted drafts and the first rejected one. The pass row by row, the formulas and
their guards: docs/live-engine.md "Verification and the signals a policy sees".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from drafters.base import DraftChain
from drafters.tree_layout import accepted_path, first_child, tree_layout
from models.kv_cache import KVCache, RowLayout
from models.llama import LlamaModel, greedy_tokens

CLAMP = 1e-8
PROB_SIGNALS = frozenset({"kl", "accept_prob"})  # need the draft's whole distribution


@dataclass
class Verified:
    """One request's result of a verify pass: the drafts kept and the tokens emitted."""

    drafted: int  # positions drafted: a chain's length, a tree's depth (not its node count)
    accepted: int  # drafts accepted and emitted (cut at the request's max tokens)
    emitted: list[int]
    signals: dict[str, np.ndarray] = field(default_factory=dict)
    #: the target's features of the tokens its cache kept (fed token + accepted drafts), when
    #: the verify pass was asked for them (an EAGLE drafter's input)
    hidden: torch.Tensor | None = None


#: a verify pass's result: cache lengths before it, per request the logits of every fed token
#: and (if asked for) their last-layer features
FedPass = tuple[list[int], list[torch.Tensor], "list[torch.Tensor] | None"]


def verify_tokens(lasts: Sequence[int], chains: Sequence[DraftChain], device) -> list[torch.Tensor]:
    """What a verify pass feeds per request: [last, d_1 .. d_n]."""
    return [torch.tensor([last, *chain.tokens], dtype=torch.int64, device=device)
            for last, chain in zip(lasts, chains)]


def verify_layouts(chains: Sequence[DraftChain], caches: Sequence[KVCache], device
                   ) -> list[RowLayout | None] | None:
    """Per request the layout of a draft tree's verify tokens (None for a chain); None when
    every request drafted a chain."""
    if all(chain.parents is None for chain in chains):
        return None
    return [None if chain.parents is None else tree_layout(chain.parents, cache.length, device)
            for chain, cache in zip(chains, caches)]


def _verify_pass(
    target: LlamaModel, caches: Sequence[KVCache], lasts: Sequence[int],
    chains: Sequence[DraftChain],
    want_hidden: bool = False,
) -> FedPass:
    """The one target pass over [last, d_1 .. d_n] per request (a tree's nodes laid out as
    one: `verify_layouts`)."""
    tokens = verify_tokens(lasts, chains, target.config.device)
    starts = [cache.length for cache in caches]
    layouts = verify_layouts(chains, caches, target.config.device)
    if not want_hidden:
        return starts, target(tokens, list(caches), logits="all", layouts=layouts), None
    logits, hidden = target(tokens, list(caches), logits="all", features=True, layouts=layouts)
    return starts, logits, hidden


def verify_greedy(
    target: LlamaModel,
    caches: Sequence[KVCache],
    lasts: Sequence[int],
    chains: Sequence[DraftChain],
    remaining: Sequence[int],
    signals: frozenset[str] = frozenset(),
    want_hidden: bool = False,
    fed: FedPass | None = None,
) -> list[Verified]:
    """Verify every chain in one target pass; roll each cache back past its rejected drafts.

    `remaining[r]` is how many tokens request r may still emit (>= 1): emission stops there.
    `fed`: the pass already run (a mixed iteration feeds prompt chunks in the same pass).
    """
    starts, logits, hidden = fed or _verify_pass(target, caches, lasts, chains, want_hidden)
    flat = torch.cat([greedy_tokens(rows) for rows in logits]).tolist()  # one device sync
    out, offset = [], 0
    for r, (cache, start, chain, rows, room) in enumerate(
            zip(caches, starts, chains, logits, remaining)):
        best, offset = flat[offset : offset + len(chain) + 1], offset + len(chain) + 1
        if chain.parents is not None:
            out.append(_verify_tree(cache, start, chain, rows, best, room, signals,
                                    None if hidden is None else hidden[r]))
            continue
        accepted = 0
        while accepted < len(chain) and chain.tokens[accepted] == best[accepted]:
            accepted += 1
        emitted = [*chain.tokens[:accepted], best[accepted]][:room]
        cache.truncate(start + 1 + accepted)  # last + accepted drafts; the bonus is fed next
        seen = min(len(emitted), len(chain))  # accepted + first rejected, cut at max tokens
        values = _signals(rows[:seen], chain, seen, signals) if signals else {}
        kept = hidden[r][: accepted + 1] if hidden is not None else None
        out.append(Verified(len(chain), len(emitted) - 1, emitted, values, kept))
    return out


def _verify_tree(cache: KVCache, start: int, chain: DraftChain, rows: torch.Tensor,
                 best: list[int], room: int, signals: frozenset[str],
                 hidden: torch.Tensor | None) -> Verified:
    """Greedy verification of one draft tree: the accepted path (`tree_layout.accepted_path`),
    its rows moved together in the cache, and the signals of the path read as a chain."""
    path = accepted_path(chain.parents, chain.tokens, best)
    fed_rows = [0, *(1 + j for j in path)]  # the root and the accepted nodes
    emitted = [*(chain.tokens[j] for j in path), best[fed_rows[-1]]][:room]
    cache.keep(start, fed_rows)
    values = {}
    if signals:
        line = DraftChain()
        rejected = first_child(chain.parents, path[-1] if path else -1)
        for j in [*path, *([] if rejected is None else [rejected])]:
            line.tokens.append(chain.tokens[j])
            line.top1.append(chain.top1[j])
            line.entropy.append(chain.entropy[j])
        if chain.probs is not None:
            line.probs = chain.probs[[*path, *([] if rejected is None else [rejected])]]
        seen = min(len(emitted), len(line))
        values = _signals(rows[fed_rows][:seen], line, seen, signals)
    kept = hidden[fed_rows] if hidden is not None else None
    return Verified(chain.depth, len(emitted) - 1, emitted, values, kept)


def verify_sampling(
    target: LlamaModel,
    caches: Sequence[KVCache],
    lasts: Sequence[int],
    chains: Sequence[DraftChain],
    remaining: Sequence[int],
    temperature: float,
    generator: torch.Generator,
    signals: frozenset[str] = frozenset(),
    want_hidden: bool = False,
    fed: FedPass | None = None,
) -> list[Verified]:
    """Rejection sampling (Leviathan et al. 2023; Chen et al. 2023) at `temperature` > 0.

    p_i = softmax(row i / T) of the verify pass. The drafters here propose deterministically (a
    greedy chain, a lookup), so each draft's proposal distribution q is one-hot on it: d_{i+1}
    is accepted with probability min(1, p_i(d)/q(d)) = p_i(d); at the first rejection the
    emitted token is drawn from norm(max(0, p_i - q)) = p_i without d, renormalised; if every
    draft is accepted the bonus token is drawn from p_n. Each emitted token is then distributed
    exactly as the target's own sample after the same prefix (the losslessness the statistical
    test checks). Signals are computed as in greedy verification, from the tempered p.
    """
    if not temperature > 0:
        raise ValueError(f"rejection sampling needs temperature > 0, got {temperature!r}")
    if any(chain.parents is not None for chain in chains):
        raise ValueError("a draft tree is verified greedily only (temperature 0): rejection "
                         "sampling here takes one chain per request")
    starts, logits, hidden = fed or _verify_pass(target, caches, lasts, chains, want_hidden)
    out = []
    for r, (cache, start, chain, rows, room) in enumerate(
            zip(caches, starts, chains, logits, remaining)):
        p = torch.softmax(rows.double() / temperature, dim=-1)
        n = len(chain)
        draws = torch.rand(n, generator=generator, dtype=torch.float64, device=p.device).tolist()
        accepted = n
        for i, (token, u) in enumerate(zip(chain.tokens, draws)):  # first u >= p_i(d_i) rejects
            if u >= float(p[i, token]):
                accepted = i
                break
        residual = p[accepted].clone()
        if accepted < n:
            residual[chain.tokens[accepted]] = 0.0
        token = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        emitted = [*chain.tokens[:accepted], token][:room]
        cache.truncate(start + 1 + accepted)
        seen = min(len(emitted), n)
        values = _signals(rows[:seen] / temperature, chain, seen, signals) if signals else {}
        kept = hidden[r][: accepted + 1] if hidden is not None else None
        out.append(Verified(n, len(emitted) - 1, emitted, values, kept))
    return out


def _signals(
    target_rows: torch.Tensor, chain: DraftChain, seen: int, names: frozenset[str]
) -> dict[str, np.ndarray]:
    """The declared per-position signals of the first `seen` drafted positions."""
    out: dict[str, np.ndarray] = {}
    if "draft_top1" in names:
        out["draft_top1"] = np.asarray(chain.top1[:seen], dtype=np.float64)
    if "draft_entropy" in names:
        out["draft_entropy"] = np.asarray(chain.entropy[:seen], dtype=np.float64)
    if names & PROB_SIGNALS:
        p = torch.softmax(target_rows.float(), dim=-1)
        out.update(distribution_signals(p, _draft_probs(chain, seen, p), names))
    return out


def distribution_signals(
    p: torch.Tensor, q: torch.Tensor, names: frozenset[str] = PROB_SIGNALS
) -> dict[str, np.ndarray]:
    """kl and/or accept_prob per row of target probabilities p and draft probabilities q, as the
    live engine computes them (the recorder uses this too, so replayed signals are the same).

    Both in float32, as the drafters' own softmaxes are: over SmolLM2's 49,152 tokens a float64
    softmax and KL cost a batch-16 verify step ~11 ms of host time (6x the float32 cost), and the
    signals are stored as float32 anyway."""
    out: dict[str, np.ndarray] = {}
    if "kl" in names:
        log_ratio = p.clamp_min(CLAMP).log_().sub_(q.clamp_min(CLAMP).log_())  # in place:
        out["kl"] = log_ratio.mul_(p).sum(dim=-1).clamp_min(0.0).cpu().numpy()  # 2 allocations
    if "accept_prob" in names:
        out["accept_prob"] = torch.minimum(p, q).sum(dim=-1).clamp_max(1.0).cpu().numpy()
    return out


def _draft_probs(chain: DraftChain, seen: int, like: torch.Tensor) -> torch.Tensor:
    """The draft's distributions at the first `seen` positions; one-hot for model-free drafts."""
    if chain.probs is not None:
        return chain.probs[:seen].to(like)
    q = torch.zeros_like(like)
    index = torch.tensor(chain.tokens[:seen], dtype=torch.int64, device=like.device)
    q[torch.arange(seen, device=like.device), index] = 1.0
    return q

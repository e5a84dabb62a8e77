"""What the EAGLE head is trained to minimise, per sequence or per packed batch of sequences.

Per chain depth d (`chains.chain_passes`, training-time test): smooth-L1 between predicted and
true features plus `cls_weight` x the cross-entropy against the target's own distribution, over
the draft vocabulary, weighted by `depth_decay`^(d-1) (eagle/training.py says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eagle.chains import chain_passes
from eagle.train_spec import TrainSpec
from models.eagle_head import EagleHead, unit_rms, unit_rms_blocks


def target_probs(head: EagleHead, features: torch.Tensor) -> torch.Tensor:
    """The target's distribution over the draft vocabulary at each feature (renormalised)."""
    with torch.no_grad():
        return torch.softmax(head.draft_logits(features).float(), dim=-1)


def noisy(features: torch.Tensor, width: float, generator: torch.Generator | None,
          block: int | None = None) -> torch.Tensor:
    """unit_rms(features) (per `block` columns: fused layers) + U(-width, width), drawn from
    `generator` (the features if width 0)."""
    if width <= 0:
        return features
    noise = torch.rand(features.shape, generator=generator, dtype=torch.float32)
    scaled = unit_rms_blocks(features, block or features.shape[-1])
    return scaled + ((2 * noise - 1) * width).to(features)


def sequence_loss(head: EagleHead, tokens: torch.Tensor, features: torch.Tensor,
                  spec: TrainSpec, first_base: int = 0, generator: torch.Generator | None = None
                  ) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted loss of one sequence's chains from base `first_base` on (the prompt before it
    is context only), and per depth the share of draft argmaxes equal to the target's (what
    greedy acceptance needs). The chains read the features with `spec.feature_noise` (from
    `generator`); the targets are the clean ones."""
    p = target_probs(head, features[first_base + 1 :])
    hidden = head.config.shape.hidden
    inputs = noisy(features, spec.feature_noise, generator, hidden)
    total, stats, weights = 0.0, {}, 0.0
    for depth, rows, predicted in chain_passes(head, tokens, inputs, spec.depths, first_base):
        if depth == 1:
            predicted = predicted[first_base:]
            rows = slice(first_base, rows.stop)
        lo, hi = rows.start + depth, rows.stop + depth  # predicted[j] ~ f at base + depth
        offset = first_base + 1  # p[0] is the target's at position first_base + 1
        want, want_p = unit_rms(features[lo:hi, -hidden:]), p[lo - offset : hi - offset]
        reg = F.smooth_l1_loss(predicted, want)
        logq = torch.log_softmax(head.draft_logits(predicted).float(), dim=-1)
        cls = -(want_p * logq).sum(dim=-1).mean()
        w = spec.depth_decay ** (depth - 1)
        total = total + w * (reg + spec.cls_weight * cls)
        weights += w
        stats[f"match{depth}"] = float((logq.argmax(-1) == want_p.argmax(-1)).float().mean())
        stats[f"reg{depth}"], stats[f"cls{depth}"] = float(reg.detach()), float(cls.detach())
    return total / weights, stats


def windowed(item: tuple, window: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(tokens, features, first base) of a (tokens, features[, start]) sequence cut to its last
    `window` positions: the loss covers bases from the first base on."""
    tokens, features, *prompt = item
    cut = max(tokens.shape[0] - window, 0)
    first_base = max(prompt[0] - cut - 1, 0) if prompt else 0
    return tokens[cut:], features[cut:], first_base


@dataclass
class PackedBatch:
    """Several sequences one after another, each followed by `pad` rows (token 0, feature 0),
    so that one set of chain passes (`chain_passes` with segments) covers them all.

    `segments`/`positions`: each row's sequence and position in it; `lengths` and
    `first_bases` per sequence (first bases relative to the sequence's start)."""

    tokens: torch.Tensor
    features: torch.Tensor
    segments: torch.Tensor
    positions: torch.Tensor
    lengths: torch.Tensor
    first_bases: torch.Tensor

    @classmethod
    def of(cls, sequences: Sequence[tuple[torch.Tensor, torch.Tensor, int]], pad: int
           ) -> PackedBatch:
        """Pack `windowed` sequences (all on one device)."""
        device = sequences[0][0].device
        tokens, features, segments, positions = [], [], [], []
        for index, (t, f, _) in enumerate(sequences):
            n = t.shape[0]
            tokens += [t, t.new_zeros(pad)]
            features += [f, f.new_zeros(pad, f.shape[1])]
            segments.append(torch.full((n + pad,), index, dtype=torch.int64, device=device))
            positions.append(torch.arange(n + pad, device=device))

        def ints(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(torch.cat(tokens), torch.cat(features), torch.cat(segments),
                   torch.cat(positions), ints([t.shape[0] for t, _, _ in sequences]),
                   ints([b for _, _, b in sequences]))


def packed_loss(head: EagleHead, batch: PackedBatch, spec: TrainSpec,
                generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The mean over the packed sequences of `sequence_loss`, in one set of chain passes (on a
    GPU, ~1/len(sequences) of the kernel launches), and per sequence its `sequence_loss` stats
    and loss as tensors [sequences] (a depth a sequence is too short for: NaN, as it is absent
    from `sequence_loss`'s stats). The same function up to rounding (tests/eagle/
    test_eagle_packed.py); the noise, if any, is drawn in another order."""
    hidden = head.config.shape.hidden
    features, segments = batch.features, batch.segments
    count = batch.lengths.shape[0]
    p = target_probs(head, features[1:])  # p[i]: the target's at position i + 1
    inputs = noisy(features, spec.feature_noise, generator, hidden)
    local = batch.positions
    first = batch.first_bases[segments]
    length = batch.lengths[segments]
    total = torch.zeros(count, dtype=torch.float32, device=features.device)
    weights = torch.zeros_like(total)
    stats: dict[str, torch.Tensor] = {}
    for depth, rows, predicted in chain_passes(head, batch.tokens, inputs, spec.depths,
                                               segments=segments, positions=local):
        bases = torch.arange(rows.start, rows.stop, device=features.device)
        valid = (local[bases] >= first[bases]) & (local[bases] + depth <= length[bases] - 1)
        seg = segments[bases][valid]
        predicted, bases = predicted[valid], bases[valid]
        want, want_p = unit_rms(features[bases + depth, -hidden:]), p[bases + depth - 1]
        reg_rows = F.smooth_l1_loss(predicted, want, reduction="none").mean(dim=-1)
        logq = torch.log_softmax(head.draft_logits(predicted).float(), dim=-1)
        cls_rows = -(want_p * logq).sum(dim=-1)
        match_rows = (logq.argmax(-1) == want_p.argmax(-1)).float()
        rows_per = torch.zeros_like(total).index_add_(0, seg, torch.ones_like(reg_rows))
        present = rows_per > 0
        reg, cls, match = (_segment_mean(v, seg, rows_per) for v in (reg_rows, cls_rows,
                                                                     match_rows))
        w = spec.depth_decay ** (depth - 1)
        total = total + w * (reg + spec.cls_weight * cls)  # 0 where the depth is absent
        weights = weights + present * w
        for name, value in (("match", match), ("reg", reg), ("cls", cls)):
            stats[f"{name}{depth}"] = torch.where(present, value.detach(), torch.nan)
    per_sequence = total / weights
    stats["loss"] = per_sequence.detach()
    return per_sequence.mean(), stats


def _segment_mean(values: torch.Tensor, segments: torch.Tensor, counts: torch.Tensor
                  ) -> torch.Tensor:
    """Per segment the mean of its rows' `values` (0 for a segment without rows)."""
    sums = torch.zeros_like(counts).index_add(0, segments, values)
    return sums / counts.clamp_min(1)

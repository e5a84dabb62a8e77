"""Random-weight models for tests whose greedy output must vary (torch needed)."""

from __future__ import annotations

from simulator.catalog import ModelShape

#: The tiny Llama shape the profiler's tests build random models of.
TINY = ModelShape(
    name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=97,
    tied_embeddings=False, source="test",
)  # fmt: skip


def sharpened(model):
    """Weights of std 1/sqrt(fan_in) (embedding 1) instead of 0.02: logits of order 1, so greedy
    output varies (std 0.02 gives tiny logits and outputs that soon loop on a token or two)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm"):
                p.mul_((1.0 if name == "embed" else p.shape[0] ** -0.5) / 0.02)
    return model


def one_by_one_greedy(target, prompt, n) -> list[int]:
    """The reference a lossless engine must match: `n` greedy tokens after `prompt`, one target
    pass per token (no batching, no speculation)."""
    import torch

    cache = target.new_cache(len(prompt) + n)
    logits = target([torch.tensor(prompt)], [cache], logits="last")[0][0]
    out = []
    while len(out) < n:
        out.append(int(logits.argmax()))
        logits = target([torch.tensor([out[-1]])], [cache], logits="last")[0][0]
    return out


def random_head(target, seed=1, vocab=None):
    """An EAGLE head over `target` whose layer does something (init leaves it near identity):
    the output and down projections drawn at full scale from `seed` + 1."""
    import torch

    from eagle.training import init_head
    from models.eagle_head import EagleHead

    ids = torch.arange(target.config.shape.vocab) if vocab is None else vocab
    head = init_head(EagleHead(target, ids), seed)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for p in (head.layer.o, head.layer.down):
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[0] ** -0.5)
    return head

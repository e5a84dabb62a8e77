"""What a draft model feeds in a chain's first pass: its catch-up on what the target committed.

A drafter with a model keeps its own KV cache, so a chain's later passes feed one token each; the
first brings the cache up to the history the target just committed, and how much that is depends
on the drafter's `catch_up`: "bonus" (a draft model or early exit, whose cache still holds the
drafts it fed: drafters/model.py), "committed" (an EAGLE head, which re-feeds every committed
token with true features: drafters/eagle.py), or "one" (one token per request, the simulator's
old charge, kept to measure the difference: benchmarks/validate_ablation.py). Each rule token by
token, and what modelling the catch-up changed in validation: docs/step-cost.md.
"""

from __future__ import annotations

CATCH_UPS = ("bonus", "committed", "one")
#: before a request's first chain: the first output token, committed by its prefill
FIRST_FEED = 1


def check_catch_up(value: object, where: str) -> str:
    """`value` if it names a catch-up rule, else a ValueError that says where it came from."""
    if value not in CATCH_UPS:
        raise ValueError(f"{where}: draft_catch_up must be one of {', '.join(CATCH_UPS)}, "
                         f"got {value!r}")
    return str(value)


def next_feed(catch_up: str, feed: int, drafted: int, emitted: int) -> int:
    """Tokens the next chain's first pass feeds, after a step that drafted `drafted` tokens and
    committed `emitted` (its accepted drafts and the bonus token); `feed` is what it would have
    fed at this step. Plain Python: the engine calls it per request and step."""
    if catch_up == "one":
        return 1
    if drafted == 0:
        return feed + emitted
    return chain_feed(catch_up, drafted, emitted)


def chain_feed(catch_up: str, drafted, emitted):
    """`next_feed` after a step that drafted (drafted > 0); elementwise on numpy arrays too (the
    fast path's many steps at once). "bonus": a draft model fed drafted - 1 of its drafts, so it
    feeds the bonus token, and the last draft too when all were accepted (emitted = drafted + 1).
    """
    if catch_up == "committed":
        return emitted
    if catch_up == "one":
        return emitted * 0 + 1
    return (emitted > drafted) + 1

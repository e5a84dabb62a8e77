"""What a draft model feeds in a chain's first pass: its catch-up on what the target committed.

A drafter with a model keeps its own KV cache, so each chain's later passes feed one token (the
draft before). The first pass is different: it has to bring the cache up to the history the
target just committed, and how much that is depends on the drafter (`catch_up`):

  "bonus"      a draft model (or early exit) whose cache still holds the drafts it fed: of a
               chain of m drafts it fed m - 1 of them, so after a accepted it feeds only the
               bonus token, or the last draft and the bonus token when all m were accepted
               (drafters/model.py).
  "committed"  an EAGLE head: its entries fed with predicted features are not trusted, so it
               re-feeds every token committed since its last chain, with the target's true
               features: the accepted drafts and the bonus token (drafters/eagle.py).

Either way a step that drafts nothing (k = 0) leaves its committed token for the next chain, and
right after the prefill the first chain feeds the first output token. A third rule, "one",
charges one token per request whatever was committed: what the simulator did before it modelled
the catch-up, kept to measure what that is worth (benchmarks/validate_ablation.py).

On the 2-core CPU the EAGLE head's first pass at batch 5 took 12.2 ms against 9.2 ms for its
one-token passes. Charged one token per request, the same live EAGLE runs under fixed k=4,
kld_variance and gammatune simulated 0.3-0.9 points faster than with the catch-up
(benchmarks/results/validate-cpu-smollm2-eagle-catchup-ablation.txt).
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

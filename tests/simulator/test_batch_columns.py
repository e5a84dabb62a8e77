"""`BatchColumns`: the batch's per-step sums kept across segments equal the sums of the
requests' walks stacked afresh, through joins, commits, new walks, finishes and the arrays
moving or growing (a draft model's passes and catch-up too); and steps priced from them give
`chain_segment_s`'s floats to the bit, and with a draft model `iteration_s`'s."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.batch_columns import BatchColumns
from simulator.catalog import get_gpu, get_model
from simulator.request import RequestState, walk_chain
from simulator.roofline import RooflineLatency
from simulator.step_cost import StepCostModel


def _request(rng, index: int, capped: bool) -> RequestState:
    output = int(rng.integers(2, 60))
    request = RequestState(index, index, 0.0, int(rng.integers(1, 3000)), output)
    request.run = rng.integers(0, 9, output)
    request.cap = rng.integers(0, 9, output) if capped else None
    request.generated = 1
    return request


def _matrices(batch: list[RequestState], steps: int):
    """What a segment would stack: tokens generated before each step (and after the last),
    drafts, cached tokens, and (with a draft model) the draft feeds, requests x steps."""
    gen = np.array([r.chain[r.chain_at: r.chain_at + steps + 1] for r in batch])
    d = np.array([r.chain_ks[r.chain_at: r.chain_at + steps] if r.chain_ks is not None
                  else np.full(steps, r.chain_k) for r in batch])
    c = gen + np.array([r.prompt_tokens - 1 for r in batch])[:, None]
    feeds = (np.array([r.chain_feeds[r.chain_at: r.chain_at + steps] for r in batch])
             if batch[0].chain_feeds is not None else None)
    return gen, d, c, feeds


def _stacked(batch: list[RequestState], steps: int):
    """What a segment would stack and sum: cached tokens, drafts, causal pairs, rejections."""
    gen, d, c, _ = _matrices(batch, steps)
    pairs = (d + 1) * c[:, :-1] + (d + 1) * (d + 2) // 2
    return (c.sum(axis=0), d.sum(axis=0), pairs.sum(axis=0),
            (gen[:, 1:] - gen[:, :-1] <= d).sum(axis=0))


def _walk(request: RequestState, k: int, rng, draft: bool) -> None:
    """walk_chain, and with a draft model some draft feed before each step of the walk (the
    sums take it as given: the replica's `_walk_feeds` computes it)."""
    walk_chain(request, k)
    if draft:
        request.chain_feeds = rng.integers(1, 6, len(request.chain))


@pytest.mark.parametrize("draft", [False, True])
@pytest.mark.parametrize("capped", [False, True])
def test_kept_sums_equal_the_stacked_walks_through_a_run(capped, draft):
    rng = np.random.default_rng(7 + capped + 2 * draft)
    # small: the arrays move and grow
    columns = BatchColumns(capacity=8, k_max=8, draft=draft)
    running: list[RequestState] = []
    joined = 0
    for _ in range(300):
        if len(running) < 6 and rng.random() < 0.5:  # a request joins, walking at some k
            request = _request(rng, joined, capped)
            joined += 1
            _walk(request, int(rng.integers(0, 9)), rng, draft)
            columns.add(request, request.chain_k)
            running.append(request)
        if not running:
            continue
        if rng.random() < 0.1:  # one request walks anew at another k
            request = running[int(rng.integers(len(running)))]
            columns.remove(request)
            _walk(request, (request.chain_k + 1) % 9, rng, draft)
            columns.add(request, request.chain_k)
        steps = min(len(r.chain) - r.chain_at for r in running) - 1
        cached, drafted, pairs, rejected, by_drafts = columns.window(steps)
        want = _stacked(running, steps)
        _, d, c, feeds = _matrices(running, steps)
        # how many requests draft d = 0..k_max at each step
        assert by_drafts.tolist() == [(d == n).sum(axis=0).tolist() for n in range(9)]
        assert cached.tolist() == want[0].tolist()
        assert drafted.tolist() == want[1].tolist()
        assert pairs.tolist() == want[2].tolist()
        assert rejected.tolist() == want[3].tolist()
        passes = columns.draft_passes(steps) if draft else None
        if passes is not None:  # pass j: the requests drafting j or more, their KV; the
            # first pass's catch-up, where a step drafts
            seqs, held, feed_tokens, feed_pairs = passes
            depth = int(d.max())
            assert seqs.tolist() == [(d >= j).sum(axis=0).tolist() for j in range(1, depth + 1)]
            assert held.tolist() == [np.where(d >= j, c[:, :-1], 0).sum(axis=0).tolist()
                                     for j in range(1, depth + 1)]
            extra = np.where(d > 0, feeds - 1, 0)
            assert feed_tokens.tolist() == extra.sum(axis=0).tolist()
            assert feed_pairs.tolist() == (extra * (c[:, :-1] + 1)
                                           - extra * (extra + 1) // 2).sum(axis=0).tolist()
        elif draft:
            assert not d.any()  # nothing drafts in the window
        n = int(rng.integers(1, steps + 1))  # commit n steps: every request takes them
        columns.now += n
        for r in running:
            r.chain_at += n
            r.generated = r.chain_g = int(r.chain[r.chain_at])
        for r in [r for r in running if r.generated >= r.output_tokens]:
            columns.remove(r)  # its last entry
            running.remove(r)
    assert joined > 30
    for r in running:
        columns.remove(r)
    # from the steps to come, everything added was taken out again (what the walks added
    # for steps already taken stays behind, never read)
    assert not columns._sums[:, columns.now - columns._origin:].any()


@pytest.mark.parametrize("capped", [False, True])
def test_steps_priced_from_kept_sums_equal_the_segment_price(capped):
    rng = np.random.default_rng(3)
    cost = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), None, get_gpu("h100")))
    assert cost.prices_chain_sums
    columns = BatchColumns()
    batch = [_request(rng, i, capped) for i in range(12)]
    for request in batch:
        walk_chain(request, int(rng.integers(0, 9)))
        columns.add(request, request.chain_k)
    steps = min(len(r.chain) for r in batch) - 1
    cached, drafted, pairs, _, _ = columns.window(steps)
    prompts = np.array([r.prompt_tokens for r in batch])
    gen = np.array([r.chain[: steps + 1] for r in batch])
    # capped: each step's drafts (requests x steps); else each request's k, every step
    drafts = (np.array([r.chain_ks[:steps] for r in batch]) if capped
              else np.array([r.chain_k for r in batch]))
    want = cost.chain_segment_s(drafts, prompts, gen[:, :-1])
    got = cost.chain_steps_s(len(batch), drafted, cached[:-1], pairs)
    assert got.tolist() == want.tolist()
    drafting = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"),
                                             get_gpu("h100")))
    assert not drafting.prices_chain_sums


@pytest.mark.parametrize("in_step_order", [False, True])
@pytest.mark.parametrize("capped", [False, True])
def test_a_draft_models_steps_priced_from_kept_sums_equal_iteration_s(capped, in_step_order):
    """Verify pass, overhead and draft passes from the sums: `iteration_s`'s floats of the
    matrices, in either order of adding the passes, with requests at k = 0 among them."""
    rng = np.random.default_rng(5 + capped)
    cost = StepCostModel(RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"),
                                         get_gpu("h100")))
    columns = BatchColumns(k_max=8, draft=True)
    batch = [_request(rng, i, capped) for i in range(12)]
    for i, request in enumerate(batch):
        _walk(request, 0 if i % 4 == 0 else int(rng.integers(1, 9)), rng, True)
        columns.add(request, request.chain_k)
    steps = min(len(r.chain) for r in batch) - 1
    cached, drafted, pairs, _, _ = columns.window(steps)
    got = (cost.chain_steps_s(len(batch), drafted, cached[:-1], pairs)
           + cost.chain_passes_s(*columns.draft_passes(steps), in_step_order=in_step_order))
    _, d, c, feeds = _matrices(batch, steps)
    want = cost.iteration_s(d if capped else d[:, 0], c[:, :-1], feeds=feeds,
                            in_step_order=in_step_order)
    assert got.tolist() == want.tolist()


def test_a_walk_past_the_kept_levels_is_refused():
    """A k beyond k_max would land in another column's rows: refused, not summed."""
    rng = np.random.default_rng(1)
    columns = BatchColumns(k_max=4, draft=True)
    request = _request(rng, 0, False)
    _walk(request, 6, rng, True)
    with pytest.raises(ValueError, match="k=6"):
        columns.add(request, 6)

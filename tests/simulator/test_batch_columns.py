"""`BatchColumns`: the batch's per-step sums kept across segments equal the sums of the
requests' walks stacked afresh, through joins, commits, new walks, finishes and the arrays
moving or growing; and steps priced from them give `chain_segment_s`'s floats to the bit."""

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


def _stacked(batch: list[RequestState], steps: int):
    """What a segment would stack and sum: cached tokens, drafts, causal pairs, rejections."""
    gen = np.array([r.chain[r.chain_at: r.chain_at + steps + 1] for r in batch])
    d = np.array([r.chain_ks[r.chain_at: r.chain_at + steps] if r.chain_ks is not None
                  else np.full(steps, r.chain_k) for r in batch])
    c = gen + np.array([r.prompt_tokens - 1 for r in batch])[:, None]
    pairs = (d + 1) * c[:, :-1] + (d + 1) * (d + 2) // 2
    return (c.sum(axis=0), d.sum(axis=0), pairs.sum(axis=0),
            (gen[:, 1:] - gen[:, :-1] <= d).sum(axis=0))


@pytest.mark.parametrize("capped", [False, True])
def test_kept_sums_equal_the_stacked_walks_through_a_run(capped):
    rng = np.random.default_rng(7 + capped)
    columns = BatchColumns(capacity=8, k_max=8)  # small: the arrays move and grow
    running: list[RequestState] = []
    joined = 0
    for _ in range(300):
        if len(running) < 6 and rng.random() < 0.5:  # a request joins, walking at some k
            request = _request(rng, joined, capped)
            joined += 1
            walk_chain(request, int(rng.integers(0, 9)))
            columns.add(request, request.chain_k)
            running.append(request)
        if not running:
            continue
        if rng.random() < 0.1:  # one request walks anew at another k
            request = running[int(rng.integers(len(running)))]
            columns.remove(request)
            walk_chain(request, (request.chain_k + 1) % 9)
            columns.add(request, request.chain_k)
        steps = min(len(r.chain) - r.chain_at for r in running) - 1
        cached, drafted, pairs, rejected, reached = columns.window(steps)
        want = _stacked(running, steps)
        most = np.array([r.chain_ks[r.chain_at: r.chain_at + steps] if capped
                         else np.full(steps, r.chain_k) for r in running]).max(axis=0)
        if capped:  # the most drafts of each step: the levels some request reaches
            assert (reached > 0).sum(axis=0).tolist() == most.tolist()
        assert cached.tolist() == want[0].tolist()
        assert drafted.tolist() == want[1].tolist()
        assert pairs.tolist() == want[2].tolist()
        assert rejected.tolist() == want[3].tolist()
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

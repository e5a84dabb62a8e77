"""Drafters: literal n-gram lookups, a model drafter's chain equals the draft model's own greedy
continuation, its KV cache stays in sync through accepted, rejected and skipped steps, batching
does not change chains, stop rules cut chains, and the early exit shares the target's weights."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from support.tiny_models import TINY  # noqa: E402

from drafters import make_drafter  # noqa: E402
from drafters.early_exit import EarlyExitDrafter  # noqa: E402
from drafters.model import ModelDrafter  # noqa: E402
from drafters.ngram import NgramDrafter  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return LlamaModel.random(config_for(TINY), seed=0)


@pytest.fixture(scope="module")
def draft() -> LlamaModel:
    shape = dataclasses.replace(TINY, name="tiny-draft", layers=1)
    return LlamaModel.random(config_for(shape), seed=3)


def greedy(model: LlamaModel, history: list[int], n: int) -> tuple[list[int], list[float]]:
    """The model's own greedy continuation (prefill, then one token per pass) and its top-1s."""
    cache = model.new_cache(len(history) + n + 1)
    logits = model([torch.tensor(history)], [cache], logits="last")[0]
    out, top1 = [], []
    for _ in range(n):
        p = torch.softmax(logits[0], dim=-1)
        out.append(int(p.argmax()))
        top1.append(float(p.max()))
        logits = model([torch.tensor([out[-1]])], [cache], logits="last")[0]
    return out, top1


# -- n-gram lookup -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "k", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], 2, [3, 4]),
        ([1, 2, 3, 4, 1, 2], 4, [3, 4, 1, 2]),  # the continuation may run into the suffix itself
        ([1, 2, 3, 4, 1, 2], 9, [3, 4, 1, 2]),  # no further than the history goes
        ([1, 5, 1, 6, 1], 2, [5, 1]),  # the earliest occurrence
        ([2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 1, [9]),  # the longest suffix first: [1, 2, 3], not [2, 3]
        ([1, 2, 3, 4], 3, []),  # nothing recurs
        ([7], 3, []),
        ([1, 2, 1], 0, []),
    ],
)
def test_ngram_lookup_literal_cases(history, k, expected):
    assert NgramDrafter(1, 3).lookup(history, k) == expected


def test_ngram_min_and_max_n_bound_the_suffix():
    history = [2, 3, 8, 1, 2, 3, 9, 1, 2, 3]
    assert NgramDrafter(1, 2).lookup(history, 1) == [8]  # [2, 3] first occurs at 0
    assert NgramDrafter(4, 4).lookup(history, 1) == []  # [3, 1, 2, 3] never occurred before
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(3, 2)


def test_ngram_match_length_and_per_position_next_tokens():
    """`match` reports the suffix length the proposal came from (what eagle+ngram's rule reads);
    `next_tokens` is the 1-token lookup from each output position's true history."""
    lookup = NgramDrafter(1, 3)
    assert lookup.match([2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 1) == ([9], 3)
    assert lookup.match([1, 5, 7, 5], 2) == ([7, 5], 1)
    assert lookup.match([1, 2, 3, 4], 2) == ([], 0)
    prompt, output = [4, 1, 2, 3], [1, 2, 9, 1, 2]
    token, length = lookup.next_tokens(prompt, output)
    history = prompt + output
    for s in range(1, len(output)):
        proposal, n = lookup.match(history[: len(prompt) + s], 1)
        assert (token[s], length[s]) == ((proposal[0], n) if proposal else (-1, 0))
    assert token.tolist() == [-1, 2, 3, -1, 2] and length.tolist() == [0, 1, 2, 0, 1]


def test_ngram_propose_reports_certainty_and_obeys_the_stop_rule():
    calls = []

    def stop(row, depth, top1, entropy):
        calls.append((row, depth, top1, entropy))
        return row == 0 and depth == 1

    drafter = NgramDrafter()
    chains = drafter.propose([10, 11], [[1, 2, 3, 4, 1, 2], [5, 6, 5]], [4, 3], stop)
    assert [c.tokens for c in chains] == [[3, 4], [6, 5]]
    assert chains[0].top1 == [1.0, 1.0] and chains[0].entropy == [0.0, 0.0]
    assert chains[0].probs is None and drafter.model_free
    assert calls == [(0, 0, 1.0, 0.0), (0, 1, 1.0, 0.0), (1, 0, 1.0, 0.0), (1, 1, 1.0, 0.0)]


# -- model drafter -------------------------------------------------------------------------------


def test_model_chain_is_the_draft_models_greedy_continuation(draft):
    drafter = ModelDrafter(draft)
    prompt = [5, 17, 33, 2, 90, 41, 8]
    drafter.start([0], [prompt])
    history = [*prompt, 60]
    chain = drafter.propose([0], [history], [6], keep_probs=True)[0]
    expected, top1 = greedy(draft, history, 6)
    assert chain.tokens == expected
    assert chain.top1 == pytest.approx(top1, abs=1e-6)
    assert chain.probs.shape == (6, TINY.vocab)
    assert chain.probs.sum(dim=-1).tolist() == pytest.approx([1.0] * 6, abs=1e-5)
    entropy = -(chain.probs * chain.probs.log()).sum(dim=-1)
    assert chain.entropy == pytest.approx(entropy.tolist(), abs=1e-5)
    assert drafter.cache_length(0) == len(history) + 5  # the last draft is proposed, not fed


def test_model_drafter_stays_in_sync_through_accepts_rejections_and_skips(draft):
    """Steps as an engine makes them; each chain must equal a fresh greedy run on the history."""
    drafter = ModelDrafter(draft)
    history = [3, 14, 15, 92, 65, 35, 89, 79]
    drafter.start([7], [history[:-1]])
    # (k, how many drafts the "target" accepts, then the correction or bonus token)
    script = [(4, 4, 11), (3, 1, 12), (5, 0, 13), (0, 0, 14), (2, 2, 15), (4, 2, 16), (1, 1, 17)]
    for k, accept, extra in script:
        chain = drafter.propose([7], [history], [k])[0]
        assert chain.tokens == greedy(draft, history, k)[0]
        if k:
            assert drafter.cache_length(7) == len(history) + k - 1
        history = [*history, *chain.tokens[:accept], extra]


def test_batched_chains_equal_single_request_chains(draft):
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45, 46], [9, 8]]
    ks = [3, 5, 0]
    together = ModelDrafter(draft)
    together.start([0, 1, 2], prompts)
    histories = [[*p, 50 + i] for i, p in enumerate(prompts)]
    chains = together.propose([0, 1, 2], histories, ks)
    for i, (history, k) in enumerate(zip(histories, ks)):
        assert chains[i].tokens == greedy(draft, history, k)[0]
    assert chains[2].tokens == [] and len(chains[2].top1) == 0


def test_model_stop_rule_cuts_one_chain_and_lets_others_run(draft):
    drafter = ModelDrafter(draft)
    drafter.start([0, 1], [[1, 2, 3], [4, 5, 6]])
    seen = []

    def stop(row, depth, top1, entropy):
        seen.append((row, depth))
        return row == 0 and depth == 1

    chains = drafter.propose([0, 1], [[1, 2, 3, 7], [4, 5, 6, 8]], [5, 4], stop)
    assert [len(c) for c in chains] == [2, 4]
    assert seen == [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2), (1, 3)]


def test_finish_drops_the_request(draft):
    drafter = ModelDrafter(draft)
    drafter.start([3], [[1, 2]])
    drafter.finish(3)
    with pytest.raises(KeyError):
        drafter.cache_length(3)


# -- early exit and the registry -----------------------------------------------------------------


def test_early_exit_shares_the_targets_weights(target):
    drafter = EarlyExitDrafter(target, 1)
    model = drafter.model
    assert model.config.shape.layers == 1 and len(model.layers) == 1
    assert model.layers[0] is target.layers[0]
    assert model.embed is target.embed and model.lm_head is target.lm_head
    assert model.norm is target.norm
    with pytest.raises(ValueError, match=r"1\.\.2"):
        EarlyExitDrafter(target, 3)


def test_early_exit_of_every_layer_drafts_the_targets_own_output(target):
    drafter = make_drafter("early-exit:2", target)
    history = [11, 22, 33, 44, 55]
    drafter.start([0], [history[:-1]])
    assert drafter.propose([0], [history], [5])[0].tokens == greedy(target, history, 5)[0]


def test_make_drafter_names(target, draft):
    assert isinstance(make_drafter("ngram", target), NgramDrafter)
    ngram = make_drafter("ngram:2-4", target)
    assert (ngram.min_n, ngram.max_n, ngram.name) == (2, 4, "ngram:2-4")
    assert make_drafter("early-exit:1", target).name == "early-exit:1"
    given = make_drafter("model:mine", target, draft_model=draft)
    assert given.model is draft and given.name == "model:mine"
    built = make_drafter("model:tiny", target, shapes={"tiny": TINY}, seed=0)
    assert torch.equal(built.model.embed, target.embed)  # same shape and seed: same weights
    for bad in ("beam", "ngram:x", "early-exit:", "model:"):
        with pytest.raises(ValueError):
            make_drafter(bad, target)


def test_a_draft_model_must_share_the_targets_vocabulary(target):
    other = LlamaModel.random(config_for(dataclasses.replace(TINY, name="other", vocab=50)))
    with pytest.raises(ValueError, match="vocabulary 50"):
        make_drafter("model:other", target, draft_model=other)

"""An EAGLE head that also reads the token at each feature's own position (`previous_token`):
its batched chains equal its live chains, it trains, round-trips through its file (which says it
reads that token), refuses entries without it, and the live engine with it stays lossless and
accepts exactly what `eagle_runs` records."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.engine import LinearLatency  # noqa: E402
from support.tiny_models import TINY, one_by_one_greedy, sharpened  # noqa: E402

from policies import make_policy  # noqa: E402
from profiler.eagle import EagleHead, load_head, read_meta, save_head  # noqa: E402
from profiler.eagle_chain import chain_passes  # noqa: E402
from profiler.eagle_data import target_features  # noqa: E402
from profiler.eagle_drafter import EagleDrafter  # noqa: E402
from profiler.eagle_train import (  # noqa: E402
    TrainSpec,
    draft_vocabulary,
    eagle_runs,
    init_head,
    train_head,
)
from profiler.live_engine import LiveEngine  # noqa: E402
from profiler.model import LlamaModel, config_for  # noqa: E402
from profiler.record import target_outputs  # noqa: E402
from simulator import SchedulerConfig, StepCostModel  # noqa: E402
from traces import Workload  # noqa: E402


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return sharpened(LlamaModel.random(config_for(TINY), seed=0))


def test_the_previous_token_changes_the_entries_and_is_required(target):
    vocab = torch.arange(TINY.vocab)
    head = init_head(EagleHead(target, vocab, previous_token=True), seed=4)
    plain = init_head(EagleHead(target, vocab), seed=4)
    assert head.fc.shape == (3 * TINY.hidden, TINY.hidden)
    assert plain.fc.shape == (2 * TINY.hidden, TINY.hidden)
    tokens = [5, 9, 2, 7, 7, 1, 30, 4]
    features = target_features(target, tokens)
    ids = torch.tensor(tokens[1:])
    a = head.entries(ids, features[:-1], torch.tensor(tokens[:-1]))
    b = head.entries(ids, features[:-1], torch.tensor([0] * (len(tokens) - 1)))
    assert not torch.allclose(a, b)
    with pytest.raises(ValueError, match="pass `previous`"):
        head.entries(ids, features[:-1])
    with pytest.raises(ValueError, match="pass `previous`"):
        head.entries(ids, features[:-1], ids[:-1])  # one short


def random_head(target, seed=1) -> EagleHead:
    head = init_head(EagleHead(target, torch.arange(TINY.vocab), previous_token=True), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a layer that does something (init leaves it near identity)
        for p in (head.layer.o, head.layer.down):
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[0] ** -0.5)
    return head


def test_batched_chains_equal_the_live_heads_chains(target):
    head = random_head(target)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, TINY.vocab, 9).tolist()
    tokens = torch.tensor(prompt + target_outputs(target, [prompt], 20)[0])
    features = target_features(target, tokens.tolist())
    checked = 0
    for depth, rows, predicted in chain_passes(head, tokens, features, 4, first_base=3):
        for j, base in enumerate(range(rows.start, rows.stop)):
            cache = head.new_cache(64)
            live, _ = head([tokens[1 : base + 2]], [features[: base + 1]], [cache],
                           [tokens[: base + 1]])
            for d in range(2, depth + 1):
                live, _ = head([tokens[base + d : base + d + 1]], [live], [cache],
                               [tokens[base + d - 1 : base + d]])
            torch.testing.assert_close(predicted[j], live[0], rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked > 60


@pytest.fixture(scope="module")
def trained(target):
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, TINY.vocab, int(rng.integers(3, 12))).tolist() for _ in range(40)]
    outs = target_outputs(target, prompts, 40)
    head = init_head(EagleHead(target, draft_vocabulary(outs, TINY.vocab), previous_token=True),
                     seed=0)
    data = [(torch.tensor(p + o), target_features(target, p + o))
            for p, o in zip(prompts[:32], outs[:32])]

    def acceptance() -> float:
        runs = [eagle_runs(head, target, p, o, 4)[0][1:] for p, o in zip(prompts[32:], outs[32:])]
        return float(np.mean(np.concatenate(runs) >= 1))

    before = acceptance()
    third_before = head.fc[2 * TINY.hidden :].detach().clone()
    spec = TrainSpec(epochs=20, lr=3e-3, warmup_steps=5, sequences_per_step=4, depths=2)
    curve = train_head(head, data, spec, log=lambda _: None)
    return head, before, acceptance(), curve, third_before


def test_a_previous_token_head_trains_and_uses_the_token(trained):
    head, before, after, curve, third_before = trained
    assert curve[-1]["loss"] < 0.85 * curve[0]["loss"]
    assert after > before + 0.15, (before, after)
    moved = (head.fc[2 * TINY.hidden :] - third_before).abs().max()
    assert float(moved) > 0.01


def test_a_previous_token_head_round_trips(target, trained, tmp_path):
    head, *_ = trained
    path = tmp_path / "previous.npz"
    save_head(head, path, {"trained_on": "test"})
    assert read_meta(path)["previous_token"] is True
    loaded = load_head(target, path)
    assert loaded.previous_token
    torch.testing.assert_close(loaded.fc, head.fc.half().float())


ARRIVALS = [0.0, 0.0, 0.0, 0.001, 0.002]
OUTPUTS = [30, 1, 25, 12, 40]


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_live_previous_token_eagle_is_lossless_and_accepts_what_eagle_runs_records(
        target, trained, chunked):
    head, *_ = trained
    sched = SchedulerConfig(max_num_seqs=3, kv_capacity_tokens=100_000, k_max=6,
                            chunked_prefill=chunked, max_batched_tokens=9 if chunked else None)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, TINY.vocab, int(rng.integers(4, 20))).tolist() for _ in OUTPUTS]
    workload = Workload(arrival_s=np.asarray(ARRIVALS),
                        prompt_tokens=np.asarray([len(p) for p in prompts]),
                        output_tokens=np.asarray(OUTPUTS), request_ids=np.arange(len(prompts)),
                        source="test")
    engine = LiveEngine(target, EagleDrafter(head), make_policy("fixed", {"k": 4}), sched,
                        cost=StepCostModel(LinearLatency()))
    res = engine.run(workload, prompts, realtime=False)
    accepted = 0
    for rid, steps in res.decode_log.groupby("request_id"):
        assert list(res.outputs[rid]) == one_by_one_greedy(target, prompts[rid], OUTPUTS[rid])
        run, _ = eagle_runs(head, target, prompts[rid], res.outputs[rid], sched.k_max)
        expected = [min(4, int(run[g]), OUTPUTS[rid] - g - 1) for g in steps.position]
        assert steps.accepted.tolist() == expected, f"request {rid}"
        accepted += sum(expected)
    assert accepted > 0

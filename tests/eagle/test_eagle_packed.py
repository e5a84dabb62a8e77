"""Packed training (several sequences in one set of chain passes, for a GPU) computes the same
loss, gradients and statistics as one `sequence_loss` per sequence, and trains to the same
weights up to rounding; a packed sequence never sees another's rows."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.tiny_models import TINY, random_head, sharpened  # noqa: E402

from eagle.losses import PackedBatch, packed_loss, sequence_loss, windowed  # noqa: E402
from eagle.train_spec import TrainSpec  # noqa: E402
from eagle.training import init_head, train_head  # noqa: E402
from eagle.training_data import target_features  # noqa: E402
from models.eagle_head import EagleHead, head_state  # noqa: E402
from models.generate import target_outputs  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return sharpened(LlamaModel.random(config_for(TINY), seed=0))


@pytest.fixture(scope="module")
def data(target):
    """Sequences of several lengths, with prompts (context only in the loss) of several
    lengths; the last is too short for a depth-3 chain (n - 3 - first base <= 0)."""
    rng = np.random.default_rng(7)
    shapes = [(9, 20), (3, 11), (14, 6), (4, 2)]  # (prompt, output) lengths
    out = []
    for n_prompt, n_out in shapes:
        prompt = rng.integers(0, TINY.vocab, n_prompt).tolist()
        tokens = prompt + target_outputs(target, [prompt], n_out)[0]
        out.append((torch.tensor(tokens), target_features(target, tokens), n_prompt))
    return out


def fresh_head(target) -> EagleHead:
    head = random_head(target, seed=3)
    for p in head_state(head).values():
        p.requires_grad_(True)
    return head


def grads(head) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in head_state(head).items()}
    for p in head_state(head).values():
        p.grad = None
    return out


def test_packed_loss_equals_the_mean_of_the_sequence_losses(target, data):
    spec = TrainSpec(depths=3, window=16)  # the window cuts the first sequence
    head = fresh_head(target)
    sequences = [windowed(item, spec.window) for item in data]
    assert sequences[0][0].shape[0] == 16 and sequences[0][2] == 0  # its prompt was cut off
    singles = [sequence_loss(head, t, f, spec, b) for t, f, b in sequences]
    (sum(loss for loss, _ in singles) / len(singles)).backward()
    want = grads(head)
    loss, stats = packed_loss(head, PackedBatch.of(sequences, spec.depths), spec)
    loss.backward()
    got = grads(head)
    torch.testing.assert_close(loss, sum(x for x, _ in singles) / len(singles))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6)
    for i, (single_loss, single_stats) in enumerate(singles):
        torch.testing.assert_close(stats["loss"][i], single_loss.detach())
        for key in ("match1", "reg1", "cls1", "match2", "reg2", "cls2", "match3", "reg3", "cls3"):
            if key in single_stats:
                assert stats[key][i].item() == pytest.approx(single_stats[key], rel=1e-5), key
            else:  # the short sequence has no depth-3 chain
                assert i == 3 and key.endswith("3") and torch.isnan(stats[key][i]), key
    assert "match3" not in singles[3][1] and "match2" in singles[3][1]


def test_a_packed_sequence_is_blind_to_the_others(target, data):
    """Changing another sequence's tokens and features leaves a sequence's loss unchanged."""
    spec = TrainSpec(depths=3)
    head = fresh_head(target)
    sequences = [windowed(item, spec.window) for item in data]
    before = packed_loss(head, PackedBatch.of(sequences, spec.depths), spec)[1]["loss"]
    t, f, b = sequences[1]
    sequences[1] = ((t + 1) % TINY.vocab, f.flip(0), b)
    after = packed_loss(head, PackedBatch.of(sequences, spec.depths), spec)[1]["loss"]
    assert after[1] != before[1]  # the changed sequence's loss moved (the check can fail)
    torch.testing.assert_close(after[[0, 2, 3]], before[[0, 2, 3]])


def test_packed_training_ends_where_unpacked_training_does(target, data):
    spec = TrainSpec(epochs=2, warmup_steps=2, sequences_per_step=3, depths=3, seed=5)
    weights, curves = [], []
    for packed in (False, True):
        head = init_head(EagleHead(target, torch.arange(TINY.vocab)), 5)
        curves.append(train_head(head, data, spec, log=lambda _: None, packed=packed))
        weights.append({n: p.detach().clone() for n, p in head_state(head).items()})
    for name in weights[0]:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=1e-4, atol=1e-5)
    for key in ("loss", "match1", "cls2", "reg3"):
        assert curves[1][-1][key] == pytest.approx(curves[0][-1][key], rel=1e-4), key
    assert curves[0][-1]["loss"] < curves[0][0]["loss"]  # it trained (so the weights moved)


def test_training_reports_each_finished_epoch_to_its_evaluation(target, data):
    """`evaluate(epoch)` runs after every epoch with that epoch's number (train_eagle names the
    --epoch-heads files by it), and its note lands in that epoch's row of the curve."""
    seen = []

    def evaluate(epoch: int) -> str:
        seen.append(epoch)
        return f"after {epoch}"

    head = init_head(EagleHead(target, torch.arange(TINY.vocab)), 5)
    spec = TrainSpec(epochs=3, warmup_steps=1, sequences_per_step=2, depths=2)
    curve = train_head(head, data, spec, log=lambda _: None, evaluate=evaluate, packed=True)
    assert seen == [1, 2, 3]
    assert [row["evaluation"] for row in curve] == ["after 1", "after 2", "after 3"]

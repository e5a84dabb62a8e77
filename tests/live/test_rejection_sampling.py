"""Rejection sampling in the live engine is lossless in distribution: over thousands of
requests from one prompt, the speculative engine's output sequences follow the target's own
distribution (enumerated exactly on a 6-token vocabulary), by a chi-square test; the same test
rejects the distribution at another temperature (it has the power to see a wrong sampler)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stats = pytest.importorskip("scipy.stats")

from support.engine import LinearLatency  # noqa: E402

from drafters import make_drafter  # noqa: E402
from live.engine import LiveEngine  # noqa: E402
from live.verify import verify_sampling  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from policies import make_policy  # noqa: E402
from simulator import ConfigError, SchedulerConfig, StepCostModel  # noqa: E402
from simulator.catalog import ModelShape  # noqa: E402
from traces import Workload  # noqa: E402

VOCAB, OUT, N = 6, 3, 4000
SHAPE = ModelShape(name="tiny-rs", layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, ffn=64,
                   vocab=VOCAB, tied_embeddings=False, source="test")
PROMPT = [1, 4, 2]


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    model = LlamaModel.random(config_for(SHAPE), seed=11)
    with torch.no_grad():  # spread the logits: a flat distribution would hide a bias
        model.lm_head.mul_(60.0)
    return model


def exact_distribution(target: LlamaModel, temperature: float) -> dict[tuple[int, ...], float]:
    """P(output sequence) by enumerating every sequence of OUT tokens after PROMPT."""
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=OUT):
        tokens = torch.tensor(PROMPT + list(seq[:-1]))
        rows = target([tokens], [target.new_cache(16)], logits="all")[0][len(PROMPT) - 1:]
        p = torch.softmax(rows.double() / temperature, dim=-1)
        probs[seq] = float(np.prod([p[i, t] for i, t in enumerate(seq)]))
    return probs


def chi_square_p(counts: dict, expected: dict[tuple[int, ...], float], n: int) -> float:
    """Chi-square p-value; cells expected below 5 are pooled into one."""
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for seq, p in expected.items():
        if n * p < 5:
            pool_o, pool_e = pool_o + counts.get(seq, 0), pool_e + n * p
        else:
            obs.append(counts.get(seq, 0))
            exp.append(n * p)
    obs.append(pool_o)
    exp.append(pool_e)
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.fixture(scope="module")
def samples(target):
    """N requests of PROMPT at temperature 1, drafted k=2 by a different random model."""
    draft = LlamaModel.random(config_for(dataclasses.replace(SHAPE, name="draft-rs")), seed=3)
    with torch.no_grad():
        draft.lm_head.mul_(60.0)
    drafter = make_drafter("model:draft-rs", target, draft_model=draft)
    wl = Workload(arrival_s=np.zeros(N), prompt_tokens=np.full(N, len(PROMPT)),
                  output_tokens=np.full(N, OUT), request_ids=np.arange(N), source="test")
    sched = SchedulerConfig(max_num_seqs=512, k_max=2, kv_capacity_tokens=10**7)
    engine = LiveEngine(target, drafter, make_policy("fixed", {"k": 2}), sched,
                        cost=StepCostModel(LinearLatency()), temperature=1.0, seed=5)
    result = engine.run(wl, [PROMPT] * N, realtime=False)
    counts: dict[tuple[int, ...], int] = {}
    for out in result.outputs:
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts, result


def test_speculative_samples_follow_the_target_distribution(target, samples):
    counts, result = samples
    assert sum(counts.values()) == N
    drafted, accepted = result.requests.drafted.sum(), result.requests.accepted.sum()
    assert drafted > 0 and 0 < accepted < drafted  # both acceptances and rejections happened
    assert chi_square_p(counts, exact_distribution(target, 1.0), N) > 1e-3


def test_the_test_rejects_another_distribution(target, samples):
    counts, _ = samples
    assert chi_square_p(counts, exact_distribution(target, 0.7), N) < 1e-6


def test_sampling_needs_a_positive_temperature(target):
    with pytest.raises(ValueError, match="temperature"):
        verify_sampling(target, [], [], [], [], 0.0, torch.Generator())
    with pytest.raises(ConfigError, match="temperature"):
        LiveEngine(target, make_drafter("ngram", target), make_policy("fixed", {"k": 1}),
                   SchedulerConfig(kv_capacity_tokens=100), temperature=-1.0)

"""The oracle: never drafts a token that will be rejected, and picks the goodput-best cap."""

from __future__ import annotations

import numpy as np
import pytest
from support.policy_fakes import FakeRequest, LinearCost, context

from policies import make_policy
from policies.oracle import cap_sums


def _ctx(runs, cost=None, k_max=10, generated=1, output=200):
    reqs = [FakeRequest(i, generated=generated, output_tokens=output) for i in range(len(runs))]
    table = {i: np.full(output, run) for i, run in enumerate(runs)}
    return context(reqs, k_max=k_max, cost=cost, lookahead=lambda rid: table[rid])


def test_drafts_exactly_what_will_be_accepted_when_drafting_is_cheap():
    oracle = make_policy("oracle")
    assert list(oracle.choose(_ctx([3, 0, 7], LinearCost(draft_s=1e-5)))) == [3, 0, 7]


def test_caps_the_chain_when_draft_passes_are_dear():
    cost = LinearCost(target_s=1e-2, draft_s=5e-3)
    ks = list(make_policy("oracle").choose(_ctx([1, 1, 9], cost)))
    # tokens / seconds: cap 0 -> 3 / 0.010 = 300; cap 1 -> 6 / 0.015 = 400;
    # cap 2 -> 7 / 0.020 = 350; cap 9 -> 14 / 0.055 = 255
    assert ks == [1, 1, 1]


def test_never_drafts_past_the_end_or_the_caps():
    ks = make_policy("oracle", {"k_max": 4}).choose(
        _ctx([9, 9], LinearCost(draft_s=1e-6), k_max=3, generated=197, output=200))
    assert list(ks) == [2, 2]  # 3 tokens left: at most 2 drafts + the bonus token


def test_refuses_to_run_without_lookahead():
    with pytest.raises(RuntimeError, match="lookahead"):
        make_policy("oracle").choose(context([FakeRequest(0)]))


class _Chances:
    """A lookahead that knows each position's chance of acceptance (knows=probabilities)."""

    def __init__(self, chances: dict[int, np.ndarray]) -> None:
        self.chances = chances

    def __call__(self, request_id: int) -> np.ndarray:
        raise AssertionError("knows=probabilities must not read the draws")

    def probabilities(self, request_id: int) -> np.ndarray:
        return self.chances[request_id]


def _calibrated(chances, cost, k_max=10, output=200):
    reqs = [FakeRequest(i, generated=1, output_tokens=output) for i in range(len(chances))]
    table = {i: np.full(output, p) for i, p in enumerate(chances)}
    ctx = context(reqs, k_max=k_max, cost=cost, lookahead=_Chances(table))
    return list(make_policy("oracle", {"knows": "probabilities"}).choose(ctx)), ctx


def test_knowing_probabilities_drafts_for_the_most_expected_tokens_per_second():
    # one request at p = 0.8, 10 ms a step + 2 ms a draft pass: k drafts give
    # 1 + 0.8 + ... + 0.8^k tokens; k = 3, 4, 5: 184.5, 186.7, 184.4 tokens/s
    ks, _ = _calibrated([0.8], LinearCost(target_s=10e-3, draft_s=2e-3))
    assert ks == [4]


@pytest.mark.parametrize("chances", [(0.95, 0.3), (0.6, 0.6), (0.9, 0.05), (0.99, 0.7)])
def test_knowing_probabilities_finds_the_best_pair_of_ks(chances):
    """Against every (k0, k1): with draft passes run in lockstep, a request's drafts are
    nearly free up to the depth another one drafts to, which ranking drafts by their chance
    alone would miss."""
    cost = LinearCost(target_s=10e-3, draft_s=3e-3)
    ks, ctx = _calibrated(list(chances), cost)

    def rate(pair):
        tokens = sum(1 + sum(p ** (j + 1) for j in range(k)) for p, k in zip(chances, pair))
        return tokens / cost.step_s(pair, [r.context_tokens for r in ctx.requests])

    best = max(((a, b) for a in range(11) for b in range(11)), key=rate)
    assert rate(ks) == pytest.approx(rate(best), rel=1e-12)


def test_knowing_probabilities_needs_them_in_the_trace():
    from simulator.acceptance import AcceptanceReplay, Lookahead
    from simulator.errors import ConfigError
    from traces import SpeculationTrace

    trace = SpeculationTrace.from_concatenated(np.array([2, 1, 0, 0]), np.array([0, 4]),
                                               {"source": "test"})
    lookahead = Lookahead([FakeRequest(0)], AcceptanceReplay(trace, np.array([4])))
    with pytest.raises(ConfigError, match="accept_prob"):
        lookahead.probabilities(0)


@pytest.mark.parametrize("idle_s", [0.0, 2e-4])
def test_caps_priced_from_the_verify_sums_choose_as_the_step_by_step_prices(idle_s):
    """On a cost model that prices a step from its verify pass's sums (the roofline, a
    model-free drafter) the oracle prices each cap from those sums: the same cap as pricing
    every cap's ks with step_s, on random batches (ties included: equal floats)."""
    from dataclasses import replace

    from simulator import SchedulerConfig
    from simulator.step_cost import StepCostModel
    from spectune.simulate import SimulationSpec, build_latency

    latency, _ = build_latency(SimulationSpec(draft="none"), SchedulerConfig())
    cost = StepCostModel(latency)
    cost.idle_s = idle_s  # the idle proposer's time on steps that draft nothing
    assert cost.chain_sums_s(1, [0], 0, [0]) is not None
    rng = np.random.default_rng(7)
    for _ in range(200):
        b = int(rng.integers(1, 40))
        runs = rng.integers(0, 12, size=b).tolist()
        prompts = rng.integers(1, 3000, size=b).tolist()
        reqs = [replace(FakeRequest(i, generated=1, output_tokens=400), prompt_tokens=p)
                for i, p in enumerate(prompts)]
        table = {i: np.full(400, run) for i, run in enumerate(runs)}
        ctx = context(reqs, k_max=10, cost=cost, lookahead=table.__getitem__)
        contexts = [r.context_tokens for r in reqs]
        rates = [(b + sum(min(run, cap) for run in runs))
                 / cost.step_s([min(run, cap) for run in runs], contexts)
                 for cap in range(max(min(max(runs), 10), 0) + 1)]
        cap = int(np.argmax(rates))  # the first of equal rates, as the oracle keeps
        cached = sum(contexts) - b
        for k, (drafted, pairs) in enumerate(cap_sums(runs, contexts, len(rates) - 1)):
            ks = [min(run, k) for run in runs]
            assert cost.chain_sums_s(b, [drafted], cached, [pairs])[0] == cost.step_s(
                ks, contexts)
        assert list(make_policy("oracle").choose(ctx)) == [min(run, cap, 10) for run in runs]

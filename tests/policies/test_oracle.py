"""The oracle: never drafts a token that will be rejected, and picks the goodput-best cap."""

from __future__ import annotations

import numpy as np
import pytest
from support.policy_fakes import FakeRequest, LinearCost, context

from policies import make_policy


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

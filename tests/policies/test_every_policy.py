"""Properties every registered policy must have, whatever it observes (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.policy_fakes import FakeRequest, LinearCost, context

from policies import DraftOutcome, make_policy, policy_class, policy_names

SIGNAL_VALUES = st.one_of(st.floats(0.0, 1.0), st.floats(0.0, 50.0),
                          st.sampled_from([0.0, 1.0, math.inf, 1e-9]))


@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_k_stays_within_bounds_whatever_is_observed(name, data):
    policy = make_policy(name)
    cls = policy_class(name)
    # a fixed k above the engine's cap is a configuration error the engine reports, not a clamp
    floor = policy.k if name == "fixed" else 0
    k_max = data.draw(st.integers(floor, 12), label="engine k_max")
    runs = {}
    live: dict[int, FakeRequest] = {}
    next_id = 0
    for step in range(data.draw(st.integers(1, 25), label="steps")):
        # requests come and go
        for _ in range(data.draw(st.integers(0, 3))):
            live[next_id] = FakeRequest(next_id, prompt_tokens=data.draw(st.integers(1, 4000)),
                                        output_tokens=400)
            seed = data.draw(st.integers(0, 2**32 - 1))
            runs[next_id] = np.random.default_rng(seed).integers(0, 13, 400)
            next_id += 1
        for rid in data.draw(st.lists(st.sampled_from(sorted(live)), unique=True)) if live else []:
            del live[rid]
            policy.finish(rid)
        if not live:
            continue
        batch = list(live.values())
        ctx = context(batch, k_max=k_max, cost=LinearCost(), step_index=step,
                      lookahead=(lambda rid: runs[rid]) if cls.simulation_only else None)
        ks = [int(k) for k in policy.choose(ctx)]
        assert len(ks) == len(batch)
        assert all(0 <= k <= k_max for k in ks), (ks, k_max)
        if cls.uses_draft_stop:
            for req, k in zip(batch, ks):
                for depth in range(k):
                    stop = policy.stop_drafting(req, depth, data.draw(st.floats(0.0, 1.0)),
                                                data.draw(st.floats(0.0, 12.0)))
                    if stop:  # the engine keeps the draft it stops at
                        ks[batch.index(req)] = depth + 1
                        break
        outcomes = []
        for req, k in zip(batch, ks):
            acc = data.draw(st.integers(0, k))
            seen = min(acc + 1, k)
            signals = {s: np.asarray([data.draw(SIGNAL_VALUES) for _ in range(seen)],
                                     dtype=np.float32) for s in cls.signals}
            outcomes.append(DraftOutcome(req.request_id, k, acc, acc + 1, req.generated, signals))
            req.generated = min(req.generated + acc + 1, req.output_tokens - 1)
        policy.observe(ctx, outcomes)


@pytest.mark.parametrize("name", policy_names())
def test_every_parameter_is_documented_and_defaults_build(name):
    from policies import parameters

    make_policy(name)  # the defaults are a valid policy
    cls = policy_class(name)
    assert cls.description, f"{name} has no description"
    for p in parameters(name):
        assert p.help, f"{name}.{p.name} has no help text"

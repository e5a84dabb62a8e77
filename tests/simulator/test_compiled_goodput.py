"""goodput's per-request plan, compiled (simulator/compiled_goodput.py), against its Python
(`Goodput._plan_per_request`): the same ks on many batches, on the roofline with a model-free
chain (each alternative priced from its verify pass's sums) and with a draft model's (its ks
priced as `steps_s` prices them), KV caches that leave some plans out, estimates of 0 and 1
among them, and requests whose estimates and contexts tie (ranked by their ids, in no order).
The engine steps that run it are checked in test_compiled_walked.py."""

from __future__ import annotations

import numpy as np
import pytest
from support.policy_fakes import FakeRequest

from policies.base import StepContext
from policies.goodput import Goodput
from simulator import SchedulerConfig, stepped
from simulator.step_cost import StepCostModel
from spectune.simulate import SimulationSpec, build_inputs

pytest.importorskip("numba")


@pytest.mark.parametrize("draft,hardware", [("none", "H100"), ("none", "A100"),
                                            ("Llama-68M", "H100")])
def test_per_request_plans_are_the_pythons(loops, draft, hardware):
    loops(True)
    from simulator.compiled_goodput import per_request_plan

    spec = SimulationSpec(workload="poisson", rate=8.0, requests=3, lengths="azure-conv",
                          acceptance="smollm2-ngram", seed=1, draft=draft, hardware=hardware)
    cost = StepCostModel(build_inputs(spec, {}, SchedulerConfig()).latency, speculating=True)
    rng = np.random.default_rng(5)
    kinds = set()
    for _ in range(150):
        b = int(rng.choice([1, 2, 3, 5, 8, 16, 33]))
        k_cap = int(rng.choice([0, 1, 3, 8]))
        policy = Goodput(per_request=True, k_max=k_cap,
                         k0_bonus=float(rng.choice([1.0, 1.1, 1.3])),
                         kv_headroom=float(rng.choice([1.0, 1.1, 2.0])))
        ids = rng.choice(10 * b + 10, b, replace=False)  # (in no order: ties go by id)
        ties = int(rng.integers(0, 2))  # (contexts and estimates that tie, half the time)
        requests = [FakeRequest(int(i), prompt_tokens=int(rng.choice([100, 300]) if ties
                                                          else rng.integers(5, 4000)),
                                generated=int(rng.choice([1, 2]) if ties
                                              else rng.integers(1, 500))) for i in ids]
        for request in requests:
            policy._alpha_r[request.request_id] = float(rng.choice(
                [0.0, 1.0, 0.5, 0.7] if ties else [0.0, 1.0, 0.5, rng.uniform(), rng.uniform()]))
        held = sum(request.context_tokens for request in requests)
        kv = int(rng.choice([10**7, 2 * held + 50, held + 3 * b]))
        ctx = StepContext(0.0, 0, 0, requests, 10, cost, kv, kv, 0)
        want = policy._plan_per_request(ctx, k_cap)
        draft_model, numbers, _, _ = stepped._draft_model(cost, requests)
        plan = np.empty(b, dtype=np.int64)
        per_request_plan(
            np.array([request.prompt_tokens for request in requests]),
            np.array([request.generated for request in requests]),
            np.array([request.request_id for request in requests]),
            np.array([policy.request_alpha(request.request_id) for request in requests]),
            k_cap, policy.k0_bonus, policy.kv_headroom, kv, *stepped._pricing(cost, b),
            draft_model, numbers, plan)
        assert plan.tolist() == list(want)
        kinds.add("mixed" if len(set(want)) > 1 else "uniform" if max(want) else "zero")
    assert kinds == {"mixed", "uniform", "zero"}  # (plans of every kind were compared)

"""The oracle that knows probabilities, its `choose` compiled (simulator/compiled_oracle.py),
against its Python (`Oracle._calibrated`): the same ks on many batches, model-free (each count
priced from its verify pass's sums) and with a draft model (its ks priced as `steps_s` prices
them), chances of 0 and 1 and ties among them, the drafter's caps binding or not. The engine
steps that run it are checked in test_compiled_walked.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from policies.base import StepContext
from policies.oracle import Oracle
from simulator import SchedulerConfig, stepped
from simulator.step_cost import StepCostModel
from spectune.simulate import SimulationSpec, build_inputs

pytest.importorskip("numba")


class _Request(SimpleNamespace):
    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def draftable(self) -> int | None:
        return None if self.caps is None else int(self.caps[self.generated])


class _Chances:
    def __init__(self, chances: dict) -> None:
        self.chances = chances

    def probabilities(self, request_id: int) -> np.ndarray:
        return self.chances[request_id]


@pytest.mark.parametrize("draft", ["none", "Llama-68M"])
def test_calibrated_choices_are_the_pythons(loops, draft):
    loops(True)
    from simulator.compiled_oracle import calibrated_ks

    spec = SimulationSpec(workload="poisson", rate=8.0, requests=3, lengths="azure-conv",
                          acceptance="beta:7,3~20", seed=1, draft=draft)
    cost = StepCostModel(build_inputs(spec, {}, SchedulerConfig()).latency, speculating=True)
    rng = np.random.default_rng(2)
    kinds = set()
    for _ in range(120):
        b = int(rng.choice([1, 2, 3, 5, 8, 16, 33]))
        bound = int(rng.choice([0, 1, 3, 6, 10]))
        capped = bool(rng.integers(0, 2))
        policy = Oracle(k_max=bound, knows="probabilities")
        requests, chances = [], {}
        for i in range(b):
            n = int(rng.integers(2, 300))
            chances[i] = [rng.uniform(0, 1, n), np.round(rng.uniform(0, 1, n), 1),
                          np.zeros(n), np.ones(n)][int(rng.integers(0, 4))]
            requests.append(_Request(request_id=i, prompt_tokens=int(rng.integers(5, 4000)),
                                     output_tokens=n, generated=int(rng.integers(0, n)),
                                     caps=rng.integers(0, 6, n) if capped else None,
                                     draft_feed=1))
        ctx = StepContext(0.0, 0, 0, requests, 10, cost, 10**7, 10**7, 0, _Chances(chances))
        want = policy._calibrated(ctx, bound)
        draft_model, numbers, _, _ = stepped._draft_model(cost, requests)
        ks = np.zeros(b, dtype=np.int64)
        calibrated_ks(
            ks, np.array([r.prompt_tokens for r in requests]),
            np.array([r.generated for r in requests]),
            np.array([r.output_tokens for r in requests]),
            np.cumsum([0] + [r.output_tokens for r in requests])[:-1],
            np.concatenate([chances[i] for i in range(b)]),
            np.concatenate([r.caps for r in requests]) if capped else np.zeros(0, np.int64),
            capped, policy.request_states(list(range(b)), 10).knobs,
            *stepped._pricing(cost, b), draft_model, numbers)
        assert ks.tolist() == list(want)
        kinds.add("mixed" if len(set(want)) > 1 else "uniform" if max(want) else "zero")
    assert kinds == {"mixed", "uniform", "zero"}  # (choices of every kind were compared)

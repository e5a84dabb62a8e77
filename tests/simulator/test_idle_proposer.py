"""A speculating engine's step that verifies no drafts pays the latency model's
`idle_proposer_s` (vLLM runs its proposer every step, found or not: docs/vllm.md): on every
costing path alike, fast or step by step, and never on an engine that does not speculate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.engine import LinearLatency, workload

from policies import make_policy
from simulator import SchedulerConfig, simulate
from simulator.builtin_profiles import resolve_profile
from simulator.errors import ConfigError
from simulator.latency_table import LatencyTable
from simulator.profiled import ProfiledLatency
from simulator.step_cost import StepCostModel
from traces import RequestSpeculation, SpeculationTrace

IDLE = 2e-3


class IdleLatency(LinearLatency):
    idle_proposer_s = IDLE

    def __init__(self) -> None:
        super().__init__(draft=False)


def test_a_step_without_drafts_pays_the_idle_proposer_only_when_speculating():
    plain, spec = StepCostModel(IdleLatency()), StepCostModel(IdleLatency(), speculating=True)
    cached = [100, 200]
    assert spec.iteration_s([0, 0], cached) == pytest.approx(
        plain.iteration_s([0, 0], cached) + IDLE, abs=1e-15)
    assert spec.iteration_s([2, 0], cached) == plain.iteration_s([2, 0], cached)
    # a step of prompt chunks only decodes nothing: no proposer to charge
    assert spec.iteration_s([], [], prefill_seqs=1, prefill_tokens=50, prefill_pairs=1275) == \
        plain.iteration_s([], [], prefill_seqs=1, prefill_tokens=50, prefill_pairs=1275)


def test_the_array_paths_charge_the_same_steps():
    spec = StepCostModel(IdleLatency(), speculating=True)
    plain = StepCostModel(IdleLatency())
    ks = np.array([[0, 2, 0], [0, 0, 0]])  # requests x steps: step 2 drafts
    gen = np.array([[0, 1, 2], [0, 1, 2]])
    prompts = np.array([10, 20])
    extra = spec.chain_segment_s(ks, prompts, gen) - plain.chain_segment_s(ks, prompts, gen)
    np.testing.assert_allclose(extra, [IDLE, 0.0, IDLE], atol=1e-15)
    one_by_one = [spec.iteration_s(ks[:, s].tolist(), (prompts + gen[:, s] - 1).tolist())
                  for s in range(3)]
    np.testing.assert_array_equal(spec.chain_segment_s(ks, prompts, gen), one_by_one)
    # what a policy prices: the same floats
    assert spec.chain_sums_s(2, [0, 3], 300, [302, 310]) == [
        spec.chain_steps_s(2, 0, 300, 302), spec.chain_steps_s(2, 3, 300, 310)]
    assert spec.chain_sums_s(2, [0], 300, [302])[0] == pytest.approx(
        plain.chain_sums_s(2, [0], 300, [302])[0] + IDLE, abs=1e-15)


def _capped_trace(n: int) -> SpeculationTrace:
    """Every draft accepted, but the lookup proposes nothing past position 5."""
    proposable = np.where(np.arange(24) < 6, 4, 0).astype(np.int32)
    reqs = tuple(RequestSpeculation(run=(24 - np.arange(24)).astype(np.int32),
                                    proposable=proposable) for _ in range(n))
    return SpeculationTrace(requests=reqs, meta={"source": "test", "parametric": False})


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_engine_charges_speculating_policies_only(fast_path):
    wl = workload([0.0, 0.0, 0.01], [32, 48, 40], [24, 24, 24])
    kv = 10_000
    runs = {}
    for name, params in (("fixed", {"k": 0}), ("fixed", {"k": 4}),
                         ("batch_adaptive", {"schedule": [[1, 128, 0]]}),
                         ("batch_adaptive", {"schedule": [[1, 128, 2]]})):
        key = f"{name}{params}"
        for latency in (LinearLatency(draft=False), IdleLatency()):
            runs[key, type(latency).__name__] = simulate(
                wl, latency, _capped_trace(3), make_policy(name, params), kv,
                SchedulerConfig(k_max=4), fast_path=fast_path).steps
    for key in ("fixed{'k': 0}", "batch_adaptive{'schedule': [[1, 128, 0]]}"):
        pd.testing.assert_frame_equal(runs[key, "LinearLatency"], runs[key, "IdleLatency"],
                                      check_exact=True)
    for key in ("fixed{'k': 4}", "batch_adaptive{'schedule': [[1, 128, 2]]}"):
        base, idle = runs[key, "LinearLatency"], runs[key, "IdleLatency"]
        decoding = (idle.decode_seqs > 0).to_numpy()
        empty = decoding & (idle.drafted == 0).to_numpy()
        assert empty.any() and (decoding & ~empty).any()
        extra = (idle.duration_s - base.duration_s).to_numpy()
        np.testing.assert_allclose(extra[empty], IDLE, atol=1e-12)
        np.testing.assert_allclose(extra[~empty], 0.0, atol=1e-12)


def test_a_profile_meta_gives_it_and_a_bad_one_is_refused():
    table = LatencyTable.load(resolve_profile("vllm-cpu-smollm2"))
    meta = {k: v for k, v in table.meta.items() if k != "idle_proposer_s"}
    assert ProfiledLatency(LatencyTable(table.rows, meta)).idle_proposer_s == 0.0
    timed = ProfiledLatency(LatencyTable(table.rows, {**meta, "idle_proposer_s": 1e-3}))
    assert timed.idle_proposer_s == 1e-3 and timed.describe()["idle_proposer_s"] == 1e-3
    with pytest.raises(ConfigError, match=r"idle_proposer_s.*finite"):
        ProfiledLatency(LatencyTable(table.rows, {**meta, "idle_proposer_s": "fast"}))

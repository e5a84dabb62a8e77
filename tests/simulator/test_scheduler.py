"""The scheduler's rule book: one registry, selected by name, used by every replica."""

from __future__ import annotations

import numpy as np
import pytest

from policies import make_policy
from simulator import ConfigError, SchedulerConfig, simulate
from simulator.catalog import get_gpu, get_model
from simulator.roofline import RooflineLatency
from simulator.scheduler import Scheduler, register_scheduler, scheduler_names
from traces import parametric_trace, synthetic_workload
from traces.synthetic import FixedLengths


def _run(config: SchedulerConfig):
    workload = synthetic_workload("poisson", 50.0, 40, FixedLengths(100, 20),
                                  np.random.default_rng(0))
    latency = RooflineLatency(get_model("Llama-3.1-8B"), None, get_gpu("H100-SXM"))
    acceptance = parametric_trace("iid:0.7", workload.output_tokens, np.random.default_rng(1))
    return simulate(workload, latency, acceptance, make_policy("fixed", {"k": 2}), 100_000,
                    config)


def test_the_default_rules_are_registered_and_an_unknown_name_is_refused():
    assert SchedulerConfig().scheduler == "fcfs-reserve" and "fcfs-reserve" in scheduler_names()
    with pytest.raises(ConfigError, match="unknown scheduler 'nope'; known: fcfs-reserve"):
        SchedulerConfig(scheduler="nope")


def test_a_registered_scheduler_is_the_one_a_replica_runs(monkeypatch):
    import simulator.scheduler as registry

    monkeypatch.setattr(registry, "_SCHEDULERS", dict(registry._SCHEDULERS))  # left as it was

    @register_scheduler
    class OneAtATime(Scheduler):
        """Admits one prompt per iteration: other rules, other records."""

        name = "test-one-at-a-time"

        def admit_whole(self, now: float) -> list:
            return self._one(now)

        def _one(self, now: float) -> list:
            if self.waiting and self._fits(self.waiting[0]):
                return [self._admit(now)]
            return []

    default = _run(SchedulerConfig())
    single = _run(SchedulerConfig(scheduler="test-one-at-a-time"))
    assert single.steps["prefill_seqs"].max() == 1 < default.steps["prefill_seqs"].max()
    assert len(single.requests) == len(default.requests) == 40

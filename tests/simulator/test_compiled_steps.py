"""`auto`'s decode steps run many at a time in one compiled loop (simulator/stepped.py): the
same records, to the bit, as stepping them one at a time through `Replica._mixed_iteration`
with the same compiled loops (and so, tests/policies/test_auto_compiled.py, as numpy), on
every acceptance source, with the drafter's caps, several replicas, admission held by the batch
size, chunked prefill, step records kept or not, auto's parameters moved; runs that end at
every window or after a step or two; and the step path where the compiled loop does not stand
for it."""

from __future__ import annotations

import pandas as pd
import pytest

from policies import make_policy
from policies.auto import Auto
from simulator import ClusterConfig, SchedulerConfig, simulate, stepped
from simulator import replica as replica_module
from simulator.replica import Replica
from spectune.simulate import SimulationSpec, build_inputs

pytest.importorskip("numba")


def _run(spec: SimulationSpec, scheduler: SchedulerConfig, params: dict, replicas: int,
         keep_steps: bool = True, latency=None):
    inputs = build_inputs(spec, {}, scheduler)
    return simulate(inputs.workload, latency or inputs.latency, inputs.acceptance,
                    make_policy("auto", params), inputs.kv_capacity_tokens, scheduler,
                    ClusterConfig(replicas), keep_steps=keep_steps)


def _both(monkeypatch, loops, spec, scheduler=None, params=None, replicas=1, keep_steps=True,
          latency=None):
    """The run through compiled runs of steps, and stepped one at a time; how many runs of
    steps the first took, and how many steps it took one at a time."""
    loops(True)
    scheduler = scheduler or SchedulerConfig(max_num_seqs=24)
    runs, mixed = [], []
    compiled_steps, mixed_iteration = Replica._compiled_steps, Replica._mixed_iteration

    def counted(self):
        runs.append(len(self.scheduler.running))
        return (yield from compiled_steps(self))

    def one(self, *args, **kwargs):
        mixed.append(1)
        return (yield from mixed_iteration(self, *args, **kwargs))
    policies = []
    init = Replica.__init__

    def kept(self, *args, **kwargs):
        init(self, *args, **kwargs)
        policies.append(self.policy)
    monkeypatch.setattr(Replica, "_compiled_steps", counted)
    monkeypatch.setattr(Replica, "_mixed_iteration", one)
    monkeypatch.setattr(Replica, "__init__", kept)
    fast = _run(spec, scheduler, params or {}, replicas, keep_steps, latency)
    taken, one_at_a_time = len(runs), len(mixed)
    monkeypatch.setattr(replica_module, "steps_at_once", lambda *args: False)
    slow = _run(spec, scheduler, params or {}, replicas, keep_steps, latency)
    # each replica's policy learnt the same, to the bit
    for at_once, one_by_one in zip(policies[:replicas], policies[replicas:], strict=True):
        assert _learnt(at_once) == _learnt(one_by_one)
    return fast, slow, taken, one_at_a_time


def _learnt(policy: Auto) -> tuple:
    """A policy's fit: its counts as bits, and its running requests' states."""
    return (tuple(count.tobytes() for count in policy.counts()), policy._streak,
            policy._observed, policy._expected)


def _same(fast, slow) -> None:
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)
    assert fast.totals == slow.totals


CASES = [("smollm2-ngram", "H100-SXM", 1, {}), ("smollm2-eagle-ngram", "A100-80GB", 3, {}),
         ("beta:7,3~20", "H100-SXM", 1, {}), ("beta:3.5,6.5~20", "A100-80GB", 2, {}),
         ("iid:0.7", "H100-SXM", 1, {"k_max": "4", "prior_alpha": "0.3"}),
         ("iid:0.9", "H100-SXM", 1, {}),  # few requests new or cold: the least state fresh
         ("smollm2-ngram", "A100-80GB", 1, {"k0_bonus": "1.3", "stop_slack": "1.0",
                                            "prior_weight": "2"})]


@pytest.mark.parametrize("acceptance,gpu,replicas,params", CASES,
                         ids=[f"{a}-{g}-{r}-" + (",".join(p) or "default")
                              for a, g, r, p in CASES])
def test_compiled_runs_of_steps_give_the_step_paths_records(monkeypatch, loops, acceptance, gpu,
                                                           replicas, params):
    spec = SimulationSpec(workload="poisson", rate=12.0, requests=160, lengths="azure-conv",
                          acceptance=acceptance, draft="none", hardware=gpu, seed=4)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, params=params,
                                            replicas=replicas)
    decode_steps = int((fast.steps["decode_seqs"] > 0).sum())
    assert one_at_a_time == 0 and 0 < runs < decode_steps  # every decode step in runs
    _same(fast, slow)


def test_compute_bound_steps(monkeypatch, loops):
    """A roofline whose verify passes are compute-bound: the causal pairs price each step and
    each draft total."""
    spec = SimulationSpec(workload="poisson", rate=6.0, requests=120, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=7)
    latency = _roofline(flops_efficiency=0.001)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, latency=latency)
    assert runs
    _same(fast, slow)


def test_the_same_totals_where_no_step_records_are_kept(monkeypatch, loops):
    spec = SimulationSpec(workload="poisson", rate=16.0, requests=160, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=6)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, keep_steps=False)
    assert runs and fast.steps.empty
    _same(fast, slow)


@pytest.mark.parametrize("window_steps,max_steps", [(1, stepped.MAX_STEPS), (16, 1), (2, 3)])
def test_runs_cut_by_their_windows_or_their_length_go_on_in_the_next(monkeypatch, loops,
                                                                    window_steps, max_steps):
    """A window of one step's positions beyond the deepest draft, or runs of a step or
    three: every run ends early, and the next goes on from there."""
    monkeypatch.setattr(stepped, "WINDOW_STEPS", window_steps)
    monkeypatch.setattr(stepped, "MAX_STEPS", max_steps)
    spec = SimulationSpec(workload="poisson", rate=2.0, requests=60, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=8)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, params={"k_max": "8"})
    decode_steps = int((fast.steps["decode_seqs"] > 0).sum())
    if max_steps == 1:
        assert runs == decode_steps
    else:  # at light load most runs end at a window or their length, not an event
        assert runs > decode_steps / (max_steps + 1)
    _same(fast, slow)


def test_admission_held_by_the_batch_size_and_the_kv_cache(monkeypatch, loops):
    """Requests wait past arrivals (a full batch, a tight KV cache): runs end at finishes."""
    spec = SimulationSpec(workload="poisson", rate=30.0, requests=150, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=3)
    scheduler = SchedulerConfig(max_num_seqs=12, kv_capacity_tokens=9000)
    fast, slow, runs, _ = _both(monkeypatch, loops, spec, scheduler=scheduler)
    assert runs and fast.steps["waiting"].max() > 0
    _same(fast, slow)


class _Subclass(Auto):
    name = "auto-subclass-for-a-test"


@pytest.mark.parametrize("budget,replicas", [(2048, 1), (256, 2)])
def test_chunked_prefills_steps_with_no_prompt_to_chunk(monkeypatch, loops, budget, replicas):
    """Under chunked prefill the steps with no prompt to chunk run at once, the others one at
    a time: the same records, with either budget (a small one chunks a prompt over several
    steps)."""
    spec = SimulationSpec(workload="poisson", rate=14.0, requests=160, lengths="azure-conv",
                          acceptance="smollm2-ngram", draft="none", seed=5)
    scheduler = SchedulerConfig(max_num_seqs=24, chunked_prefill=True, max_batched_tokens=budget)
    fast, slow, runs, one_at_a_time = _both(monkeypatch, loops, spec, scheduler=scheduler,
                                            replicas=replicas)
    with_chunks = int((fast.steps["prefill_seqs"] > 0).sum())
    assert runs and one_at_a_time >= with_chunks > 0
    _same(fast, slow)


@pytest.mark.parametrize("case", ["draft model", "vllm", "subclass", "numpy",
                                  "policy cost", "k_max 0", "profile", "no fast path"])
def test_the_step_path_where_the_compiled_loop_does_not_stand_for_it(monkeypatch, loops, case):
    loops(case != "numpy")
    spec = SimulationSpec(workload="poisson", rate=8.0, requests=3, lengths="azure-conv",
                          acceptance="smollm2-ngram", seed=1,
                          draft=("Llama-68M" if case == "draft model"
                                 else None if case == "profile" else "none"),
                          profile="cpu-smollm2-135m" if case == "profile" else None)
    scheduler = SchedulerConfig(scheduler="vllm-v1" if case == "vllm" else "fcfs-reserve")
    inputs = build_inputs(spec, {}, scheduler)
    from simulator.step_cost import StepCostModel

    cost = StepCostModel(inputs.latency)
    policy = (_Subclass() if case == "subclass"
              else Auto(k_max=0) if case == "k_max 0" else Auto())
    args = (policy, cost, cost if case == "policy cost" else None, case == "vllm",
            case != "no fast path")
    assert not stepped.steps_at_once(*args)
    if case in ("numpy", "vllm", "draft model", "profile"):  # the others: above
        assert stepped.steps_at_once(Auto(), StepCostModel(build_inputs(
            SimulationSpec(workload="poisson", rate=8.0, requests=3, lengths="azure-conv",
                           acceptance="smollm2-ngram", seed=1, draft="none"), {},
            SchedulerConfig()).latency), None, False, True) == (case != "numpy")


def _roofline(gpu: str = "H100-SXM", tp: int = 1, flops_efficiency: float = 0.7):
    """Llama-3.1-8B on `gpu`'s roofline; a low `flops_efficiency` makes its steps
    compute-bound (where a verify pass's causal pairs price it)."""
    from simulator.catalog import get_gpu, get_model
    from simulator.roofline import RooflineLatency, RooflineParams

    return RooflineLatency(get_model("Llama-3.1-8B"), None, get_gpu(gpu), tp=tp,
                           params=RooflineParams(flops_efficiency=flops_efficiency))


@pytest.mark.parametrize("gpu,tp,flops", [("H100-SXM", 1, 0.7), ("A100-80GB", 4, 0.7),
                                          ("H100-SXM", 1, 0.0005), ("A100-80GB", 2, 0.001)])
def test_a_drafts_price_is_autos_to_the_bit(loops, gpu, tp, flops):
    """`draft_price` (what accepting a first draft outside a streak is weighed against, rarely
    flipping a decision in a run's records) against `Auto._draft_price`, memory- and
    compute-bound."""
    import numpy as np
    from support.policy_fakes import FakeRequest, context

    from simulator.compiled_steps import draft_price
    from simulator.step_cost import StepCostModel

    loops(True)
    cost = StepCostModel(_roofline(gpu, tp, flops))
    rng = np.random.default_rng(5)
    for _ in range(200):
        b = int(rng.integers(1, 40))
        contexts = rng.integers(2, 30000, size=b)
        batch = [FakeRequest(i, prompt_tokens=int(c) - 1, output_tokens=int(c) + 5,
                             generated=1) for i, c in enumerate(contexts)]
        expected = Auto()._draft_price(context(batch, cost=cost), contexts.tolist())
        got = draft_price(contexts.astype(np.int64), int(contexts.sum()) - b,
                          cost._roofline["target"], float(cost.latency.step_overhead_s(b)))
        assert np.float64(got).tobytes() == np.float64(expected).tobytes()

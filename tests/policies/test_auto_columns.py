"""A step's outcomes as columns (`StepOutcomes`, `Policy.observe_columns`): the columns give back
their outcomes; auto's fit of them, compiled and in Python, is the same to the bit; the states it
reads from its plan are its dicts'; the simulator hands auto and goodput columns (auto's draft
stop's signal rows reused) and any policy that overrides `observe` objects, with the same
records either way."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.policy_fakes import FakeRequest, context, outcome

from policies import DraftOutcome, StepOutcomes, make_policy
from policies.auto import _BIN_TABLE, COLD, FRESH, MAX_STREAK, NEW


def test_columns_give_back_their_outcomes():
    outcomes = [outcome(7, 4, 2, 30, draft_top1=[0.9, np.nan, 0.2, 0.5]),
                outcome(3, 0, 0, 12, draft_top1=[]),
                DraftOutcome(5, 2, 2, 3, 8, {"draft_top1": [0.5, 1.0], "kl": np.ones(2)}),
                DraftOutcome(9, 1, 0, 1, 4)]  # no signal at all
    columns = StepOutcomes.of(outcomes)
    assert columns.request_ids == [7, 3, 5, 9]
    assert columns.k.dtype == np.int64 and columns.k.tolist() == [4, 0, 2, 1]
    assert columns.lengths["draft_top1"].tolist() == [3, 0, 2, 0]
    assert columns.lengths["kl"].tolist() == [0, 0, 2, 0]
    back = columns.outcomes()
    for got, want in zip(back, outcomes):
        assert (got.request_id, got.k, got.accepted, got.emitted, got.position) == (
            want.request_id, want.k, want.accepted, want.emitted, want.position)
        for name in ("draft_top1", "kl"):
            assert np.array_equal(got.signals[name], np.asarray(want.signals.get(name, []),
                                                                dtype=np.float64),
                                  equal_nan=True)


def _fit_inputs(rng, n: int):
    """Random counts and outcomes for auto's fit: every state (streaks past MAX_STREAK too),
    undrafted rows, confidences missing, NaN or partly read."""
    ks = rng.integers(0, 9, n)
    hits = np.array([int(rng.integers(0, k + 1)) for k in ks], dtype=np.int64)
    states = rng.integers(NEW, MAX_STREAK + 5, n)
    top1 = rng.random((n, 9))
    top1[rng.random(top1.shape) < 0.1] = np.nan
    known = rng.integers(0, 10, n)
    a_pop, lift = rng.random(MAX_STREAK + 3), rng.random(10) * 2
    counts = (rng.random(MAX_STREAK + 3) * 50, rng.random(MAX_STREAK + 3) * 30,
              rng.random(10) * 9, rng.random(10) * 9)
    return counts, a_pop, lift, states, rng.random(n) * 2, ks, hits, top1, known


def test_auto_fits_the_same_counts_compiled_and_in_python(loops):
    module = loops(True)
    from policies import compiled

    assert module is not None
    policy = make_policy("auto")
    rng = np.random.default_rng(3)
    for _ in range(200):
        counts, a_pop, lift, states, ratios, ks, hits, top1, known = _fit_inputs(
            rng, int(rng.integers(0, 20)))
        fast = tuple(c.copy() for c in counts)
        expected, after = compiled.observe_step(*fast, a_pop, lift, _BIN_TABLE, states, ratios,
                                                ks, hits, top1, known, NEW, FRESH, COLD,
                                                MAX_STREAK)
        policy._seen, policy._accepted, policy._top1_observed, policy._top1_expected = counts
        slow, slow_expected, slow_after = policy._fit(
            a_pop.tolist(), lift.tolist(), states.tolist(), ratios.tolist(), ks.tolist(),
            hits.tolist(), top1.tolist(), known.tolist())
        for got, want in zip(fast, slow):
            assert got.view(np.int64).tolist() == want.view(np.int64).tolist()
        assert expected.view(np.int64).tolist() == np.array(slow_expected).view(np.int64).tolist()
        assert after.tolist() == slow_after


def _run(policy, reuse_plan: bool, seed: int = 5, steps: int = 160):
    """Random steps of `policy` (choose, draft stop, observe of its columns; now and then a
    request finished between its choice and its outcome, or a step observed that it was not
    asked to choose); with `reuse_plan` False the plan is made stale before each observe, so
    the states are read from the dicts. Returns its states after each step and its counts
    after the last."""
    rng = np.random.default_rng(seed)
    requests = [FakeRequest(i, prompt_tokens=int(rng.integers(5, 3000)),
                            output_tokens=int(rng.integers(2, 80))) for i in range(24)]
    history, batch = [], []
    for step in range(steps):
        live = [r for r in requests if r.generated < r.output_tokens]
        if not live:
            break
        asked = rng.random() < 0.85 or not batch or any(r not in live for r in batch)
        if asked:
            batch = [live[i] for i in sorted(rng.choice(
                len(live), min(len(live), int(rng.integers(1, 17))), replace=False))]
        ctx = context(batch, k_max=int(rng.integers(1, 11)), step_index=step)
        if asked:
            ks = list(policy.choose(ctx))
            top1 = rng.random((len(batch), max(ks, default=0)))
            stops = list(policy.stop_chains(batch, ks, top1, np.zeros_like(top1)))
        else:  # the last step's requests again, without asking
            stops = [int(rng.integers(0, 5)) for _ in batch]
        outcomes = []
        for request, k in zip(batch, stops):
            accepted = int(rng.integers(0, k + 1)) if k else 0
            outcomes.append(outcome(request.request_id, k, accepted, request.generated,
                                    draft_top1=rng.random(k)))
            request.generated = min(request.output_tokens, request.generated + accepted + 1)
        if rng.random() < 0.1:  # its state dropped before its outcome arrives
            policy.finish(batch[0].request_id)
        if not reuse_plan:
            policy._plan_at = -1
        policy.observe_columns(ctx, StepOutcomes.of(outcomes))
        for request in batch:
            if request.generated >= request.output_tokens:
                policy.finish(request.request_id)
        history.append((dict(policy._streak), dict(policy._observed), dict(policy._expected)))
    return (history, [a.view(np.int64).tolist() for a in (policy._seen, policy._accepted,
                                                 policy._top1_observed, policy._top1_expected)])


@pytest.mark.parametrize("compiled", [True, False])
def test_the_states_auto_takes_from_its_plan_are_its_dicts(loops, compiled):
    loops(compiled)
    reused, read = (_run(make_policy("auto"), reuse) for reuse in (True, False))
    assert reused == read
    assert any(state > 0 for streaks, *_ in reused[0] for state in streaks.values())


def _simulate(policy, fast_path: bool = True, **spec):
    from simulator import ClusterConfig, SchedulerConfig
    from simulator.engine import simulate
    from spectune.simulate import SimulationSpec, build_inputs

    scheduler = SchedulerConfig(**spec.pop("scheduler", {}))
    inputs = build_inputs(SimulationSpec(workload="poisson", rate=10.0, requests=100,
                                         lengths="azure-conv", seed=2, **spec), {}, scheduler)
    return simulate(inputs.workload, inputs.latency, inputs.acceptance, policy,
                    inputs.kv_capacity_tokens, scheduler, ClusterConfig(1, "least-loaded"),
                    fast_path=fast_path)


SPECS = [dict(acceptance="smollm2-ngram", draft="none"),
         dict(acceptance="beta:7,3~20", draft="Llama-68M"),
         dict(acceptance="smollm2-ngram", draft="none", scheduler={"scheduler": "vllm-v1"})]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("spec", SPECS, ids=["ngram", "draft-model", "vllm-v1"])
def test_a_run_told_in_columns_is_a_run_told_in_objects(loops, monkeypatch, compiled, spec):
    """A policy that overrides `observe` (here the report's recording wrapper) is told in
    objects: auto's own runs are told in columns, with the same records."""
    _told_both_ways(loops, monkeypatch, compiled, spec, "auto", {})


@pytest.mark.parametrize("params", [{}, {"per_request": "true"}, {"ema_input": "inverted"},
                                    {"per_request": "true", "ema_input": "step"}])
def test_goodput_told_in_columns_is_goodput_told_in_objects(loops, monkeypatch, params):
    spec = dict(acceptance="beta:5,3~20", draft="none", fast_path=False)  # (else it holds)
    _told_both_ways(loops, monkeypatch, False, spec, "goodput", params)


def _told_both_ways(loops, monkeypatch, compiled: bool, spec: dict, name: str,
                    params: dict) -> None:
    from simulator.replica import Replica
    from spectune.samples import recording

    loops(compiled)
    told = {"columns": 0, "objects": 0}
    for form, method in (("columns", "_outcome_columns"), ("objects", "_outcomes")):
        original = getattr(Replica, method)

        def counted(self, steps, _original=original, _form=form):
            told[_form] += 1
            return _original(self, steps)
        monkeypatch.setattr(Replica, method, counted)
    plain = _simulate(make_policy(name, params), **dict(spec))
    assert told["columns"] > 0 and told["objects"] == 0
    wrapped = _simulate(recording(make_policy(name, params), [], []), **dict(spec))
    assert told["objects"] > 0
    pd.testing.assert_frame_equal(plain.requests, wrapped.requests, check_exact=True)
    pd.testing.assert_frame_equal(plain.steps, wrapped.steps, check_exact=True)


def test_the_draft_stops_signal_rows_are_the_revealed_positions(monkeypatch):
    """Where the step's draft stop read the batch's signals, the columns reuse its rows: the
    entries they reveal are those gathered from each request's trace."""
    from simulator.replica import Replica

    original = Replica._outcome_columns
    reused = []

    def both(self, steps):
        cut = self._stop_rows
        got = original(self, steps)
        self._stop_rows = None
        gathered = original(self, steps)
        # rows cut at other positions of the same requests are not theirs: gathered instead
        ids, positions = [r.request_id for r, *_ in steps], [g + 1 for _, g, *_ in steps]
        self._stop_rows = ids, positions, {"draft_top1": np.full((len(ids), 64), -1.0)}
        stale = original(self, steps)
        assert np.array_equal(stale.signals["draft_top1"], gathered.signals["draft_top1"],
                              equal_nan=True)
        # ... and rows narrower than the chains verified (a stop that cut fewer drafts)
        self._stop_rows = ids, [g for _, g, *_ in steps], {"draft_top1": np.zeros((len(ids), 0))}
        narrow = original(self, steps)
        assert narrow.signals["draft_top1"].shape == gathered.signals["draft_top1"].shape
        self._stop_rows = cut
        for column, obj in zip(got.outcomes(), self._outcomes(steps)):  # as told in objects
            assert (column.request_id, column.k, column.accepted, column.emitted,
                    column.position) == (obj.request_id, obj.k, obj.accepted, obj.emitted,
                                         obj.position)
            assert np.array_equal(column.signals["draft_top1"], obj.signals["draft_top1"],
                                  equal_nan=True)
        reused.append(got.signals["draft_top1"] is not gathered.signals["draft_top1"]
                      and cut is not None
                      and got.signals["draft_top1"] is cut[2]["draft_top1"])
        lengths = got.lengths["draft_top1"].tolist()
        assert lengths == gathered.lengths["draft_top1"].tolist()
        for r, n in enumerate(lengths):
            assert np.array_equal(got.signals["draft_top1"][r, :n],
                                  gathered.signals["draft_top1"][r, :n], equal_nan=True)
        for request, g, *_ in steps:  # the trace's values at those positions
            r = got.request_ids.index(request.request_id)
            n = lengths[r]
            assert np.array_equal(got.signals["draft_top1"][r, :n],
                                  request.signals["draft_top1"][g:g + n], equal_nan=True)
        return got

    monkeypatch.setattr(Replica, "_outcome_columns", both)
    _simulate(make_policy("auto"), acceptance="smollm2-eagle-ngram", draft="Llama-68M")
    assert any(reused) and len(reused) > 50


def test_auto_refuses_columns_of_other_lengths(loops):
    loops(True)
    from policies import compiled

    counts, a_pop, lift, states, ratios, ks, hits, top1, known = _fit_inputs(
        np.random.default_rng(1), 4)
    with pytest.raises(IndexError, match="columns of other lengths"):
        compiled.observe_step(*counts, a_pop, lift, _BIN_TABLE, states[:3], ratios, ks, hits,
                              top1, known, NEW, FRESH, COLD, MAX_STREAK)
    with pytest.raises(IndexError, match="a state outside the bins"):
        compiled.observe_step(*counts, a_pop, lift, _BIN_TABLE, np.full(4, NEW - 1), ratios,
                              np.ones(4, dtype=np.int64), hits * 0, top1, known, NEW, FRESH,
                              COLD, MAX_STREAK)
    with pytest.raises(IndexError, match="past the bins or its signals"):
        compiled.observe_step(*counts, a_pop, lift, _BIN_TABLE, states, ratios,
                              np.full(4, 8), np.full(4, 8), top1[:, :2], np.full(4, 8), NEW,
                              FRESH, COLD, MAX_STREAK)
    policy = make_policy("auto")  # and the same fit from the policy's own columns
    ctx = context([FakeRequest(i) for i in range(2)])
    policy.observe_columns(ctx, StepOutcomes([0, 1], np.array([2, 0]), np.array([1, 0]),
                                             np.array([2, 1]), np.array([1, 1])))
    assert policy._streak == {0: FRESH}

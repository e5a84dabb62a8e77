"""A step's outcomes as columns (`StepOutcomes`, `Policy.observe_columns`): the columns give back
their outcomes; auto's fit of them, compiled and in Python, is the same to the bit; the states it
reads from its plan are its dicts'; the simulator hands auto and goodput columns (auto's draft
stop's signal rows reused) and any policy that overrides `observe` objects, with the same
records either way."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support.policy_fakes import FakeRequest, context, outcome, verified

from policies import DraftOutcome, StepOutcomes, make_policy
from policies.auto import _BIN_ROWS, BIN_TABLE, COLD, FRESH, MAX_STREAK, NEW, _top1_bin


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
        expected, after = compiled.observe_step(*fast, a_pop, lift, BIN_TABLE, states, ratios,
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
        outcomes = verified(rng, batch, stops)
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
def test_the_states_auto_takes_from_its_plan_are_its_dicts(loops, monkeypatch, compiled):
    from policies.auto import Auto

    loops(compiled)
    reads = []
    states_ratios = Auto._states_ratios

    def counted(policy, ids):
        reads.append(len(ids))
        return states_ratios(policy, ids)
    monkeypatch.setattr(Auto, "_states_ratios", counted)
    runs = {}
    for reuse in (True, False):
        reads.clear()
        runs[reuse] = _run(make_policy("auto"), reuse), len(reads)
    (reused, reused_reads), (read, read_reads) = runs[True], runs[False]
    assert reused == read
    assert reused_reads < read_reads * 0.7  # most steps' states came from their plan
    assert any(state > 0 for streaks, *_ in reused[0] for state in streaks.values())


def _observe_as_before(policy, outcomes) -> None:
    """auto's observe as 53e9926 wrote it (an object loop in Python): the reference the
    columns' fit must match to the bit."""
    a_pop = (policy._accepted / policy._seen).tolist()
    lift = policy._lift().tolist()
    seen_by_bin, accepted_by_bin = policy._seen.tolist(), policy._accepted.tolist()
    top1_observed, top1_expected = (policy._top1_observed.tolist(),
                                    policy._top1_expected.tolist())
    streak, observed, expected_of = policy._streak, policy._observed, policy._expected
    w = policy.prior_weight
    for o in outcomes:
        k = o.k
        if k == 0:
            continue
        rid, hits = o.request_id, o.accepted
        state = streak.get(rid, NEW)
        ratio = (observed.get(rid, 0.0) + w) / (expected_of.get(rid, 0.0) + w)
        seen = hits + 1 if hits < k else k
        top1 = o.signals.get("draft_top1")
        top1 = ([] if top1 is None else top1[:seen].tolist() if isinstance(top1, np.ndarray)
                else [float(v) for v in top1[:seen]])
        bins = _BIN_ROWS[(state if state < MAX_STREAK else MAX_STREAK) - NEW]
        expected = 0.0
        for i in range(seen):
            b, hit = bins[i], i < hits
            if i >= len(top1):
                seen_by_bin[b] += ratio
                accepted_by_bin[b] += hit
                expected += a_pop[b]
                continue
            t = _top1_bin(top1[i])
            seen_by_bin[b] += ratio * lift[t]
            accepted_by_bin[b] += hit
            expected += a_pop[b] * lift[t]
            top1_observed[t] += hit
            top1_expected[t] += a_pop[b] * ratio
        observed[rid] = observed.get(rid, 0.0) + hits
        expected_of[rid] = expected_of.get(rid, 0.0) + expected
        streak[rid] = max(state, 0) + hits if hits == k else FRESH if hits else COLD
    policy._seen, policy._accepted = np.array(seen_by_bin), np.array(accepted_by_bin)
    policy._top1_observed = np.array(top1_observed)
    policy._top1_expected = np.array(top1_expected)


def _state(policy) -> tuple:
    """auto's learnt state, floats as bits, with their types."""
    def bits(values):
        return [(type(v).__name__, float(v).hex()) for v in values]
    return (sorted(policy._streak.items()),
            sorted((rid, bits([v])) for rid, v in policy._observed.items()),
            sorted((rid, bits([v])) for rid, v in policy._expected.items()),
            [(a.dtype.str, bits(a.tolist())) for a in (policy._seen, policy._accepted,
                                                       policy._top1_observed,
                                                       policy._top1_expected)])


@pytest.mark.parametrize("compiled", [True, False])
def test_auto_learns_what_it_learnt_from_objects_before(loops, compiled):
    """The columns' fit against 53e9926's object loop, on outcomes as the live engine or a
    caller may give them: confidences as float32 arrays, lists or None, NaN among them, more
    than the revealed positions, none; k = 0; accepted = k; an integer prior weight."""
    from policies.auto import Auto

    loops(compiled)
    rng = np.random.default_rng(17)
    for params in ({}, {"prior_weight": 4, "prior_alpha": 0.3}, {"k_max": 3}):
        new, old = Auto(**params), Auto(**params)
        requests = [FakeRequest(i, prompt_tokens=int(rng.integers(5, 900)),
                                output_tokens=200) for i in range(12)]
        for step in range(150):
            batch = [requests[i] for i in sorted(rng.choice(12, int(rng.integers(1, 9)),
                                                            replace=False))]
            ctx = context(batch, k_max=int(rng.integers(1, 11)), step_index=step)
            ks = list(new.choose(ctx))
            assert ks == list(old.choose(ctx))
            outcomes = []
            for request, k in zip(batch, ks):
                k = k if rng.random() < 0.9 else int(rng.integers(0, 6))
                accepted = int(rng.integers(0, k + 1)) if k else 0
                top1 = rng.random(int(rng.integers(0, k + 3)))
                top1[rng.random(len(top1)) < 0.1] = np.nan
                form = rng.integers(0, 4)
                signals = ({"draft_top1": top1.astype(np.float32)} if form == 0
                           else {"draft_top1": top1.tolist()} if form == 1
                           else {"draft_top1": None} if form == 2 else {})
                outcomes.append(DraftOutcome(request.request_id, k, accepted, accepted + 1,
                                             request.generated, signals))
                request.generated += accepted + 1
            new.observe(ctx, outcomes)
            _observe_as_before(old, outcomes)
            assert _state(new) == _state(old), f"step {step}, {params}"
            if rng.random() < 0.05:
                new.finish(batch[0].request_id)
                old.finish(batch[0].request_id)


def test_columns_refuse_what_no_verification_gives():
    with pytest.raises(ValueError, match=r"request 3: accepted must be a non-negative integer"):
        StepOutcomes.of([DraftOutcome(3, 4, 1.5, 2, 10)])
    with pytest.raises(ValueError, match=r"request 3: k must be a non-negative integer"):
        StepOutcomes.of([DraftOutcome(3, -1, 0, 1, 10)])
    with pytest.raises(ValueError, match=r"signal 'draft_top1' must be a vector"):
        StepOutcomes.of([DraftOutcome(3, 2, 1, 2, 10, {"draft_top1": [[0.5, 0.2]]})])
    with pytest.raises(ValueError, match=r"signal 'draft_top1' must be a vector"):
        StepOutcomes.of([DraftOutcome(3, 2, 1, 2, 10, {"draft_top1": "high"})])
    # a signal the policy does not read is not read
    columns = StepOutcomes.of([DraftOutcome(3, 2, 1, 2, 10, {"note": "x", "kl": [1.0]})],
                              names=("kl",))
    assert list(columns.signals) == ["kl"] and columns.lengths["kl"].tolist() == [1]
    policy = make_policy("auto")  # ... and a request told twice in a step is refused
    with pytest.raises(ValueError, match="told of a request twice"):
        policy.observe(context([FakeRequest(1)]), [DraftOutcome(1, 2, 1, 2, 5),
                                                   DraftOutcome(1, 2, 2, 3, 5)])


def test_a_policy_that_reads_columns_alone_is_told_by_either_engine():
    """One that overrides only `observe_columns` learns through `observe` too (the live
    engine's form), and one that overrides only `observe` through `observe_columns`."""
    from policies import Policy

    class Columns(Policy):
        name = "columns-only"
        signals = frozenset({"kl"})

        def __init__(self):
            self.told = []

        def observe_columns(self, ctx, outcomes):
            self.told.append((list(outcomes.request_ids), outcomes.k.tolist(),
                              outcomes.lengths["kl"].tolist()))

    class Objects(Policy):
        name = "objects-only"

        def __init__(self):
            self.told = []

        def observe(self, ctx, outcomes):
            self.told.append([(o.request_id, o.k, o.accepted) for o in outcomes])

    ctx = context([FakeRequest(1), FakeRequest(2)])
    outcomes = [outcome(1, 3, 1, draft_top1=[0.5, 0.5], kl=[0.1, 0.2]), outcome(2, 0, 0)]
    columns = Columns()
    assert Columns.observes() and Columns.replaces("observe_columns", "observe")
    columns.observe(ctx, outcomes)
    assert columns.told == [([1, 2], [3, 0], [2, 0])]
    objects = Objects()
    assert Objects.observes() and not Objects.replaces("observe_columns", "observe")
    objects.observe_columns(ctx, StepOutcomes.of(outcomes))
    assert objects.told == [[(1, 3, 1), (2, 0, 0)]]
    assert not Policy.observes()


def test_both_engines_tell_a_policy_in_the_form_it_reads():
    """`Policy.tell` (the live engine's) and the simulator choose the same method: a
    subclass that adds `observe_columns` to a policy that reads objects is told in columns;
    one that overrides both forms and calls up from each is told once, not sent round."""
    from policies import Policy
    from policies.fixed import Fixed
    from policies.gammatune import GammaTune

    calls = []

    class Columns(GammaTune):
        def observe_columns(self, ctx, outcomes):
            calls.append(("columns", list(outcomes.request_ids)))

    class Both(Fixed):
        def observe(self, ctx, outcomes):
            calls.append(("objects", [o.request_id for o in outcomes]))
            super().observe(ctx, outcomes)

        def observe_columns(self, ctx, outcomes):
            calls.append(("columns", list(outcomes.request_ids)))
            super().observe_columns(ctx, outcomes)

    ctx = context([FakeRequest(4)])
    told = [outcome(4, 2, 1, draft_top1=[0.3, 0.4])]
    assert Columns.reads_columns() and not GammaTune.reads_columns()
    Columns().tell(ctx, told)
    assert calls == [("columns", [4])]
    calls.clear()
    Both().observe(ctx, told)
    assert calls == [("objects", [4]), ("columns", [4])]
    calls.clear()
    Both().observe_columns(ctx, StepOutcomes.of(told))
    assert calls == [("columns", [4]), ("objects", [4])]
    calls.clear()
    Both().tell(ctx, told)  # it reads columns (its own, as far down as its observe)
    assert calls == [("columns", [4]), ("objects", [4])]
    assert not Policy.reads_columns()


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
    objects: auto's own runs are told in columns, with the same records (or, with the compiled
    loops, observe inside them, under vLLM's scheduler too: simulator/stepped.py)."""
    at_once = compiled
    _told_both_ways(loops, monkeypatch, compiled, spec, "auto", {}, at_once)


@pytest.mark.parametrize("params", [{}, {"per_request": "true"}, {"ema_input": "inverted"},
                                    {"per_request": "true", "ema_input": "step"}])
def test_goodput_told_in_columns_is_goodput_told_in_objects(loops, monkeypatch, params):
    spec = dict(acceptance="beta:5,3~20", draft="none", fast_path=False)  # (else it holds)
    _told_both_ways(loops, monkeypatch, False, spec, "goodput", params)


def _told_both_ways(loops, monkeypatch, compiled: bool, spec: dict, name: str,
                    params: dict, at_once: bool = False) -> None:
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
    assert (told["columns"] == 0 if at_once else told["columns"] > 0) and told["objects"] == 0
    told.update(columns=0, objects=0)
    wrapped = _simulate(recording(make_policy(name, params), [], []), **dict(spec))
    assert told["objects"] > 0 and told["columns"] == 0
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
        compiled.observe_step(*counts, a_pop, lift, BIN_TABLE, states[:3], ratios, ks, hits,
                              top1, known, NEW, FRESH, COLD, MAX_STREAK)
    with pytest.raises(IndexError, match="a state outside the bins"):
        compiled.observe_step(*counts, a_pop, lift, BIN_TABLE, np.full(4, NEW - 1), ratios,
                              np.ones(4, dtype=np.int64), hits * 0, top1, known, NEW, FRESH,
                              COLD, MAX_STREAK)
    with pytest.raises(IndexError, match="past the bins or its signals"):
        compiled.observe_step(*counts, a_pop, lift, BIN_TABLE, states, ratios,
                              np.full(4, 8), np.full(4, 8), top1[:, :2], np.full(4, 8), NEW,
                              FRESH, COLD, MAX_STREAK)
    policy = make_policy("auto")  # and the same fit from the policy's own columns
    ctx = context([FakeRequest(i) for i in range(2)])
    policy.observe_columns(ctx, StepOutcomes([0, 1], np.array([2, 0]), np.array([1, 0]),
                                             np.array([2, 1]), np.array([1, 1])))
    assert policy._streak == {0: FRESH}

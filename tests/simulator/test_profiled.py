"""Profiled latency model: fit, interpolation, extrapolation, and its error-report helpers.

Tables are synthetic: times from a known function of the pass's aggregates, so every prediction
has an exact answer to compare against.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.catalog import get_gpu, get_model
from simulator.errors import ConfigError
from simulator.fit import AXES, COEFFICIENTS, linear_form, uniform_aggregates
from simulator.latency import attention_pairs
from simulator.latency_table import COLUMNS, LatencyTable, new_meta
from simulator.profiled import (
    FEW_PASSES,
    ProfiledLatency,
    error_summary,
    heldout_split,
    prediction_errors,
    ragged_errors,
)
from simulator.roofline import RooflineLatency
from simulator.step_cost import StepCostModel

BATCH = (1, 2, 4, 8, 16, 32)
CACHED = (64, 256, 1024, 4096)
VERIFY_Q = (2, 3, 5, 9)
PREFILL_B = (1, 2, 4, 8)
PREFILL_Q = (16, 32, 64, 128, 256, 512)
LINEAR = dict(zip(COEFFICIENTS, (1e-3, 2e-5, 3e-6, 1e-8, 2e-10)))


def linear_truth(role, b, q, c, p):
    """Exactly the fitted form: the draft is the target scaled by 1/10."""
    t = sum(k * x for k, x in zip(LINEAR.values(), (1.0, b, q, c, p)))
    return t / 10 if role == "draft" else t


def knee_truth(role, b, q, c, p):
    """Memory-bound until ~250 query tokens, then compute-bound; a smooth (p-norm) knee."""
    memory = 4e-3 + 2e-8 * (c + q)
    compute = 1.6e-5 * q + 4e-10 * p
    t = 2e-4 + (memory**4 + compute**4) ** 0.25
    return t / 10 if role == "draft" else t


def grid_points(draft: bool = True, verify: bool = True):
    pts = [("target", "prefill", b, q, 0) for b, q in itertools.product(PREFILL_B, PREFILL_Q)]
    pts += [("target", "decode", b, 1, c) for b, c in itertools.product(BATCH, CACHED)]
    if verify:
        pts += [("target", "verify", b, q, c)
                for b, q, c in itertools.product(BATCH, VERIFY_Q, CACHED)]
    if draft:
        pts += [("draft", "prefill", b, q, 0) for b, q in itertools.product(PREFILL_B, PREFILL_Q)]
        pts += [("draft", "draft", b, 1, c) for b, c in itertools.product(BATCH, CACHED)]
    return pts


def make_table(truth=knee_truth, draft=True, verify=True, points=None) -> LatencyTable:
    rows = []
    for role, phase, b, q, c in points or grid_points(draft, verify):
        t = float(truth(role, *uniform_aggregates(b, q, c)))
        rows.append((role, phase, b, q, c, t, t * 0.97, t * 1.03, 20))
    meta = new_meta(
        device="cpu: Intel Xeon Test", driver="none", torch_version="2.13.0", dtype="fp32",
        target=get_model("SmolLM2-135M"), draft=get_model("SmolLM2-135M-EE4") if draft else None,
        grid={"num_seqs": list(BATCH), "cached_tokens_per_seq": list(CACHED)}, repeats=20,
        warmup=2, notes="synthetic",
    )
    return LatencyTable(pd.DataFrame(rows, columns=list(COLUMNS)), meta)


def ragged_batch(rng, max_seqs=32, max_k=8, cached=(64, 4096)):
    """Aggregates of a random verify batch: each request its own k and context."""
    n = int(rng.integers(1, max_seqs + 1))
    q = rng.integers(1, max_k + 2, size=n)
    c = rng.integers(cached[0], cached[1] + 1, size=n)
    return n, int(q.sum()), int(c.sum()), int(np.sum(attention_pairs(q, c)))


@pytest.fixture(scope="module")
def knee_model() -> ProfiledLatency:
    return ProfiledLatency(make_table())


def test_grid_points_come_back_exactly(knee_model):
    errors = prediction_errors(knee_model, make_table().rows)
    assert np.abs(errors).max() < 1e-9


def smooth_truth(role, b, q, c, p):
    """Sublinear in query tokens, cached cost growing with queries per request: not linear."""
    t = 5e-4 + 2e-5 * q**0.9 + 3e-8 * c * (1 + 0.2 * np.log1p(q / b)) + 2e-10 * p
    return t / 10 if role == "draft" else t


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interpolation_at_heldout_interior_points_is_close(seed):
    table = make_table(smooth_truth)
    train, held = heldout_split(table, fraction=0.3, seed=seed)
    assert len(held) >= 10 and set(held["phase"]) == {"prefill", "verify", "decode", "draft"}
    model = ProfiledLatency(train)
    errors = prediction_errors(model, held)
    assert np.abs(errors).max() < 0.02
    # the grid correction earns its keep: the fitted form alone is clearly worse there
    target = held[held["role"] == "target"]
    coef = np.array(list(model.describe()["roles"]["target"]["coefficients"].values()))
    aggregates = uniform_aggregates(*(target[a] for a in AXES))
    fit_alone = linear_form(coef, *aggregates) / target["median_s"] - 1
    target_errors = errors[(held["role"] == "target").to_numpy()]
    assert np.median(np.abs(fit_alone)) > 3 * np.median(np.abs(target_errors))


def test_fit_recovers_known_linear_coefficients():
    model = ProfiledLatency(make_table(linear_truth))
    report = model.describe()["roles"]
    for name, value in LINEAR.items():
        assert report["target"]["coefficients"][name] == pytest.approx(value, rel=1e-6)
        assert report["draft"]["coefficients"][name] == pytest.approx(value / 10, rel=1e-6)
    assert report["target"]["fit_abs_pct"]["max"] < 1e-6


def test_ragged_batches_of_a_linear_truth_are_predicted():
    model = ProfiledLatency(make_table(linear_truth))
    rng = np.random.default_rng(0)
    # inside the grids, beyond them (more requests, longer contexts, more drafts), mixed batches
    shapes = [{}, {"max_seqs": 128, "max_k": 15, "cached": (8, 20000)}]
    batches = [ragged_batch(rng, **s) for s in shapes for _ in range(100)]
    frame = pd.DataFrame(batches, columns=["num_seqs", "query_tokens", "cached_tokens",
                                           "attn_pairs"]).assign(role="target")
    frame["median_s"] = linear_truth("target", *(frame[c] for c in frame.columns[:4]))
    assert np.abs(ragged_errors(model, frame)).max() < 0.01


def test_ragged_batches_of_a_knee_are_close_inside_the_grid(knee_model):
    rng = np.random.default_rng(1)
    errors = []
    for _ in range(200):
        agg = ragged_batch(rng)
        errors.append(knee_model.pass_s("target", *agg) / knee_truth("target", *agg) - 1)
    assert np.max(np.abs(errors)) < 0.03


def test_scalars_give_floats_and_arrays_broadcast(knee_model):
    t = knee_model.pass_s("target", 4, 20, 4000, 20 * 1000 + 30)
    assert type(t) is float and t > 0
    assert type(knee_model.forward_s("target", np.int64(4), 4.0, np.float64(8), 10)) is float
    assert type(knee_model.forward_s("target", np.array(4), 4, 8, 10)) is float
    b = np.array([1, 2, 4])[:, None]
    c = np.array([0, 100, 1000, 5000])[None, :]
    out = knee_model.forward_s("draft", b, b, c * b, (c + 1) * b)
    assert out.shape == (3, 4)
    for i, j in itertools.product(range(3), range(4)):
        bb, cc = int(b[i, 0]), int(c[0, j])
        assert out[i, j] == pytest.approx(knee_model.forward_s("draft", bb, bb, cc * bb,
                                                              (cc + 1) * bb), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    role=st.sampled_from(["target", "draft"]),
    b=st.integers(0, 300),
    per_q=st.integers(0, 40),
    extra_q=st.integers(0, 3000),
    c=st.integers(0, 50_000),
    pairs=st.integers(0, 10**8),
    extrapolation=st.sampled_from(["clamp", "fit"]),
    prefill=st.booleans(),
)
def test_the_scalar_path_matches_the_array_path(role, b, per_q, extra_q, c, pairs,
                                                extrapolation, prefill):
    """To the bit: the fast path prices arrays of the passes the step path prices one by one."""
    model = _models()[extrapolation]
    q = b * per_q + (extra_q if per_q > 1 else 0)
    phase = "prefill" if prefill and role == "target" else None
    scalar = model.forward_s(role, b, q, c, pairs, phase=phase)
    # past FEW_PASSES passes, so that the array form is the one that prices it
    many = FEW_PASSES + 1
    array = model.forward_s(role, np.array([b] + [1] * many), np.array([q] + [1] * many),
                            np.array([c] + [0] * many), np.array([pairs] + [1] * many),
                            phase=phase)
    assert model.arrays_match_scalars and scalar == array[0]
    assert model.step_overhead_s(b, per_q) == model.step_overhead_s(np.array([b]),
                                                                    np.array([per_q]))[0]
    assert scalar >= 0 and np.isfinite(scalar)
    assert (scalar == 0) == (b == 0 or q == 0)


_MODELS: dict = {}


def _models() -> dict:
    if not _MODELS:
        table = make_table()
        _MODELS.update({e: ProfiledLatency(table, extrapolation=e) for e in ("clamp", "fit")})
    return _MODELS


def test_empty_passes_cost_nothing(knee_model):
    assert knee_model.pass_s("target", 0, 0, 0, 0) == 0.0
    assert knee_model.forward_s("target", 3, 0, 100, 0) == 0.0
    assert knee_model.forward_s("draft", 0, 5, 100, 5) == 0.0
    out = knee_model.forward_s("target", np.array([0, 2, 2]), np.array([0, 0, 4]), 100, 250)
    assert out[0] == 0.0 and out[1] == 0.0 and out[2] > 0


def test_draft_role_and_has_draft_model(knee_model):
    assert knee_model.has_draft_model
    draft_rows = make_table().rows.query("role == 'draft'")
    assert np.abs(prediction_errors(knee_model, draft_rows)).max() < 1e-9
    target_only = ProfiledLatency(make_table(draft=False))
    assert not target_only.has_draft_model
    assert target_only.forward_s("draft", 8, 8, 8000, 8008) == 0.0
    assert "(no draft model timed)" in target_only.source
    # the engine's cost composition runs on it, per step and per column of a step matrix
    cost = StepCostModel(knee_model)
    ks, cached = [3, 3, 1, 0], np.array([[500, 501], [900, 904], [70, 72], [3000, 3001]])
    per_step = cost.iteration_s(ks, cached)
    for s in range(2):
        assert per_step[s] == pytest.approx(cost.iteration_s(ks, cached[:, s]), rel=1e-9)
    assert cost.iteration_s(ks, cached[:, 0]) > StepCostModel(target_only).iteration_s(
        ks, cached[:, 0])


def test_step_overhead_is_a_documented_constant():
    model = ProfiledLatency(make_table(), step_overhead_s=3e-4)
    assert model.step_overhead_s(5) == 3e-4 and model.step_overhead_s(0) == 0.0
    assert list(model.step_overhead_s(np.array([0, 1, 9]))) == [0.0, 3e-4, 3e-4]
    assert ProfiledLatency(make_table()).step_overhead_s(5) == 0.0
    with pytest.raises(ConfigError, match="step_overhead_s"):
        ProfiledLatency(make_table(), step_overhead_s=-1e-3)


def test_host_terms_and_pass_scale_enter_an_iteration_as_documented():
    table = make_table()
    base = ProfiledLatency(table)
    host = ProfiledLatency(table, step_overhead_s=1e-3, per_seq_overhead_s=2e-4,
                           per_draft_token_s=5e-5, pass_scale=1.25)
    assert host.step_overhead_s(4, 6) == pytest.approx(1e-3 + 4 * 2e-4 + 6 * 5e-5)
    assert host.step_overhead_s(0, 6) == 0.0
    np.testing.assert_allclose(host.step_overhead_s(np.array([0, 2]), np.array([3, 3])),
                               [0.0, 1e-3 + 2 * 2e-4 + 3 * 5e-5])
    args = ("target", 4, 12, 400, 1300)
    assert host.forward_s(*args) == pytest.approx(1.25 * base.forward_s(*args), rel=1e-12)
    vector = host.forward_s("target", np.array([4, 8]), np.array([12, 8]), 400, 1300)
    np.testing.assert_allclose(vector, 1.25 * base.forward_s("target", np.array([4, 8]),
                                                              np.array([12, 8]), 400, 1300))
    ks, cached = [3, 0, 2], [100, 200, 300]  # 5 drafts, 3 requests
    expected = 1.25 * (StepCostModel(base).iteration_s(ks, cached)) + 1e-3 + 3 * 2e-4 + 5 * 5e-5
    assert StepCostModel(host).iteration_s(ks, cached) == pytest.approx(expected, rel=1e-9)
    for bad in (dict(pass_scale=0.0), dict(per_seq_overhead_s=-1.0),
                dict(per_draft_token_s=float("nan"))):
        with pytest.raises(ConfigError):
            ProfiledLatency(table, **bad)


def test_phase_scales_multiply_the_targets_passes_of_their_phase_only():
    table = make_table()
    base = ProfiledLatency(table)
    scaled = ProfiledLatency(table, pass_scale=1.25, phase_scales={"verify": 0.8,
                                                                   "prefill": 1.5})
    shapes = {"decode": (4, 4, 400, 1300), "verify": (4, 12, 400, 1300),
              "prefill": (2, 200, 0, 20100)}
    factor = {"decode": 1.25, "verify": 1.25 * 0.8, "prefill": 1.25 * 1.5}
    for phase, shape in shapes.items():
        assert scaled.forward_s("target", *shape) == pytest.approx(
            factor[phase] * base.forward_s("target", *shape), rel=1e-12)
    # arrays: each element by its own phase, as the scalars
    b, q, c, p = (np.array(x) for x in zip(*shapes.values()))
    np.testing.assert_allclose(scaled.forward_s("target", b, q, c, p),
                               [scaled.forward_s("target", *s) for s in shapes.values()],
                               rtol=1e-12)
    # a phase named by the caller (a continuing prompt chunk priced as a prefill)
    assert scaled.forward_s("target", 1, 50, 100, 6275, phase="prefill") == pytest.approx(
        1.25 * 1.5 * base.forward_s("target", 1, 50, 100, 6275, phase="prefill"), rel=1e-12)
    # a mixed step priced in parts takes the prefill pass's fixed cost out, at its scale
    assert scaled.fixed_pass_s == pytest.approx(1.25 * 1.5 * base.fixed_pass_s)
    assert scaled.describe()["phase_scales"] == {"prefill": 1.5, "decode": 1.0,
                                                 "verify": 0.8}
    assert "phase_scales" not in base.describe()
    with pytest.raises(ConfigError, match="'draft' is not a target phase"):
        ProfiledLatency(table, phase_scales={"draft": 1.1})
    with pytest.raises(ConfigError, match=r"phase_scales\['decode'\] must be"):
        ProfiledLatency(table, phase_scales={"decode": 0.0})


def test_a_calibrated_profile_applies_its_scales_as_given_ones():
    """A profile whose meta carries a calibration (the engine's speed measured on windows it
    served since) prices as the plain profile given those scales; scales given on top
    multiply them."""
    table = make_table()
    table.meta["iteration_gap_s"] = 2e-3
    calibration = {"phase_scales": {"decode": 1.1, "verify": 0.9}, "host_scale": 1.2,
                   "source": "a test"}
    calibrated = LatencyTable(table.rows, {**table.meta, "calibration": calibration})
    got = ProfiledLatency.with_host_time(calibrated, host_scale=0.5,
                                         phase_scales={"verify": 2.0})
    want = ProfiledLatency.with_host_time(table, host_scale=0.6,
                                          phase_scales={"decode": 1.1, "verify": 1.8})
    shapes = [(4, 4, 400, 1300), (4, 12, 400, 1300), (2, 200, 0, 20100)]
    for shape in shapes:
        assert got.forward_s("target", *shape) == pytest.approx(
            want.forward_s("target", *shape), rel=1e-12)
    assert got.step_overhead_s(3, 0) == pytest.approx(want.step_overhead_s(3, 0))
    assert got.describe()["phase_scales"] == {"prefill": 1.0, "decode": 1.1,
                                              "verify": pytest.approx(1.8)}
    plain = ProfiledLatency.with_host_time(table)
    assert plain.forward_s("target", 4, 4, 400, 1300) != got.forward_s("target", 4, 4, 400, 1300)
    assert got.describe()["calibration"] == calibration  # where the scales came from
    silent = LatencyTable(table.rows, {**table.meta, "calibration": {
        "phase_scales": {}, "host_scale": 0.0}})  # a window with no time between iterations
    assert ProfiledLatency.with_host_time(silent).step_overhead_s(3, 0) == 0.0
    for bad in ({"phase_scales": {"decode": 1.0}}, {"host_scale": -1.0, "phase_scales": {}},
                {"host_scale": 1.0, "phase_scales": {"draft": 2.0}},
                {"host_scale": 1.0, "phase_scales": [1.0, 1.0]}, [1.0]):
        with pytest.raises(ConfigError, match=r"calibration|not a target phase"):
            ProfiledLatency.with_host_time(LatencyTable(table.rows,
                                                        {**table.meta, "calibration": bad}))


def test_heldout_split_never_removes_corners_or_boundaries():
    table = make_table()
    for seed in range(5):
        train, held = heldout_split(table, fraction=0.5, seed=seed)
        assert len(train.rows) + len(held) == len(table.rows)
        assert train.meta == table.meta
        key = ["role", "phase", "num_seqs", "query_tokens_per_seq", "cached_tokens_per_seq"]
        both = train.rows.merge(held, on=key)
        assert both.empty
        for (role, phase), group in table.rows.groupby(["role", "phase"]):
            out = held[(held["role"] == role) & (held["phase"] == phase)]
            assert len(out) > 0
            for axis in key[2:]:
                values = group[axis]
                if values.nunique() >= 3:
                    assert out[axis].between(values.min(), values.max(),
                                             inclusive="neither").all()
    again = heldout_split(table, fraction=0.5, seed=3)[1]
    pd.testing.assert_frame_equal(again, heldout_split(table, fraction=0.5, seed=3)[1])
    assert heldout_split(table, fraction=0.0)[1].empty
    with pytest.raises(ConfigError, match="fraction"):
        heldout_split(table, fraction=1.0)


def test_table_without_target_rows_is_a_clear_error():
    points = [p for p in grid_points() if p[0] == "draft"]
    with pytest.raises(ConfigError, match="no target rows"):
        ProfiledLatency(make_table(points=points))


def test_non_positive_times_are_a_clear_error():
    table = make_table()
    table.rows.loc[5, "median_s"] = 0.0  # past the table's own checks
    with pytest.raises(ConfigError, match="row 6: median_s"):
        ProfiledLatency(table)


def test_a_lattice_edge_without_points_takes_its_nearest_neighbours_ratio():
    """A verify grid whose largest batch lacks the widest verify at the longest context (a
    profile whose long prompts stagger the requests, as vLLM's does): the corner nothing
    brackets takes the ratio of its nearest measured neighbours, as the model does outside its
    box ("clamp"), instead of dropping the whole phase's grid for the fitted form alone."""
    corner = ("target", "verify", BATCH[-1], VERIFY_Q[-1], CACHED[-1])
    points = [p for p in grid_points() if p != corner]
    model = ProfiledLatency(make_table(points=points))
    full = ProfiledLatency(make_table())
    verify = model.describe()["roles"]["target"]["phases"]["verify"]
    assert verify["interpolation"] == "multilinear on a 6x4x4 log grid"
    assert verify["filled_nodes"] == 1
    agg = [float(x) for x in uniform_aggregates(BATCH[-1], VERIFY_Q[-1], CACHED[-1])]
    truth = knee_truth("target", *agg)
    filled = model.pass_s("target", *agg)
    fitted = float(linear_form(model._roles["target"].coef, *agg))  # the fit alone
    assert abs(filled / truth - 1) < abs(fitted / truth - 1)
    # a measured point is still returned exactly
    inner = [float(x) for x in uniform_aggregates(BATCH[0], VERIFY_Q[0], CACHED[0])]
    assert model.pass_s("target", *inner) == pytest.approx(full.pass_s("target", *inner))


def test_missing_phases_use_the_fit():
    model = ProfiledLatency(make_table(verify=False))
    assert model.describe()["roles"]["target"]["phases"]["verify"]["points"] == 0
    agg = [float(x) for x in uniform_aggregates(8, 5, 1024)]
    assert 0.5 < model.pass_s("target", *agg) / knee_truth("target", *agg) < 2.0


def test_clamped_extrapolation_beats_the_fit_alone():
    """The documented choice: outside a grid, keep the ratio at the box's nearest point."""
    truth = RooflineLatency(get_model("Llama-3.1-8B"), get_model("Llama-68M"), get_gpu("H100-SXM"))
    table = make_table(truth.forward_s)
    outside = [("target", b, q, c) for b in (64, 128) for q in (1, 5) for c in (512, 2048)]
    outside += [("target", b, q, c) for b in (1, 8) for q in (1, 5) for c in (8192, 16384)]
    outside += [("target", b, 17, c) for b in (2, 16) for c in (256, 2048)]
    outside += [(r, b, q, 0) for r in ("target", "draft") for b in (1, 4) for q in (1024, 2048)]
    errors = {}
    for rule in ("clamp", "fit"):
        model = ProfiledLatency(table, extrapolation=rule)
        errors[rule] = [model.forward_s(role, *agg) / truth.forward_s(role, *agg) - 1
                        for role, b, q, c in outside
                        for agg in [[float(x) for x in uniform_aggregates(b, q, c)]]]
    assert np.median(np.abs(errors["clamp"])) < np.median(np.abs(errors["fit"]))
    # and the clamped prediction is continuous across the box's edge
    model = ProfiledLatency(table)
    edge, beyond = (uniform_aggregates(32, 9, c) for c in (4096, 4097))
    assert model.pass_s("target", *map(float, beyond)) / model.pass_s(
        "target", *map(float, edge)) == pytest.approx(1.0, abs=1e-3)


def test_source_and_describe(knee_model):
    source = knee_model.source
    assert source.startswith("profile: cpu: Intel Xeon Test, fp32, SmolLM2-135M target + ")
    assert "SmolLM2-135M-EE4 draft" in source
    assert source.endswith(knee_model.table.meta["created"][:10])
    d = knee_model.describe()
    assert d["kind"] == "profiled" and d["extrapolation"] == "clamp"
    verify = d["roles"]["target"]["phases"]["verify"]
    assert verify["num_seqs"] == [1, 32] and verify["cached_tokens_per_seq"] == [64, 4096]
    assert verify["interpolation"] == "multilinear on a 6x4x4 log grid"
    assert set(d["roles"]["draft"]["coefficients"]) == set(COEFFICIENTS)
    train, _ = heldout_split(make_table(), fraction=0.2)
    assert ProfiledLatency(train).describe()["roles"]["target"]["phases"]["verify"][
        "filled_nodes"] > 0


def test_error_helpers():
    summary = error_summary(np.array([0.01, -0.02, 0.03, -0.10]))
    assert summary["n"] == 4 and summary["max_abs_pct"] == pytest.approx(10.0)
    assert summary["median_abs_pct"] == pytest.approx(2.5)
    assert error_summary(np.array([]))["n"] == 0
    with pytest.raises(ConfigError, match="missing columns"):
        ragged_errors(ProfiledLatency(make_table()), pd.DataFrame({"role": ["target"]}))
    bad_role = pd.DataFrame({"role": ["verifier"], "num_seqs": [1], "query_tokens": [1],
                             "cached_tokens": [1], "attn_pairs": [2], "median_s": [1e-3]})
    with pytest.raises(ConfigError, match="role"):
        ragged_errors(ProfiledLatency(make_table()), bad_role)


def test_unknown_options_are_clear_errors():
    with pytest.raises(ConfigError, match="extrapolation"):
        ProfiledLatency(make_table(), extrapolation="linear")
    with pytest.raises(ConfigError, match="role"):
        ProfiledLatency(make_table()).forward_s("drafter", 1, 1, 1, 1)


def test_the_shipped_cpu_profile_meets_its_error_targets():
    """The profile shipped in the package, re-evaluated from its own files (no timing here):
    interpolation error at held-out grid points and on the ragged batches timed with it."""
    from simulator.builtin_profiles import DATA, builtin_profile_names, resolve_profile

    assert "cpu-smollm2-135m" in builtin_profile_names()
    table = LatencyTable.load(resolve_profile("cpu-smollm2-135m"))
    assert table.meta["device"].startswith("cpu:") and table.meta["dtype"] == "fp32"
    train, held = heldout_split(table)
    heldout = error_summary(prediction_errors(ProfiledLatency(train), held))
    ragged = pd.read_csv(DATA / "cpu-smollm2-135m" / "ragged.csv")
    on_ragged = error_summary(ragged_errors(ProfiledLatency(table), ragged))
    assert heldout["n"] >= 5 and on_ragged["n"] >= 30
    assert heldout["median_abs_pct"] <= 5 and heldout["p90_abs_pct"] <= 10
    assert on_ragged["median_abs_pct"] <= 5 and on_ragged["p90_abs_pct"] <= 10


def test_a_profile_can_price_a_mixed_step_as_its_parts():
    """meta mixed_steps = "parts": prompt chunks + decodes cost the prefill pass (read from the
    prefill grid, a continuing chunk too) plus the decode pass, less one fixed cost; without
    it the step is one pass, as before."""
    table = make_table(draft=False)
    one = ProfiledLatency(table)
    parted = LatencyTable(table.rows, {**table.meta, "mixed_steps": "parts"})
    parts = ProfiledLatency(parted)
    assert not one.mixed_parts and parts.mixed_parts
    assert parts.fixed_pass_s == pytest.approx(one._scalar_coef["target"][0])
    ks, cached = [0, 0, 0], [300, 500, 700]
    prompt, chunk_cached = 256, 128  # a continuing chunk: 256 new tokens over 128 cached
    pairs = int(attention_pairs(prompt, chunk_cached))
    decode = sum(int(attention_pairs(1, c)) for c in cached)
    expected = (parts.forward_s("target", 1, prompt, chunk_cached, pairs, phase="prefill")
                + parts.forward_s("target", 3, 3, sum(cached), decode) - parts.fixed_pass_s)
    got = StepCostModel(parts).iteration_s(ks, cached, 1, prompt, chunk_cached, pairs)
    assert got == pytest.approx(expected, rel=1e-12)
    # the prefill grid read at no cached context: the same pass as a fresh prompt's ratio
    fresh_ratio = (parts.forward_s("target", 1, prompt, 0, pairs)
                   / linear_form(parts._roles["target"].coef, 1, prompt, 0, pairs))
    chunk_ratio = (parts.forward_s("target", 1, prompt, chunk_cached, pairs, phase="prefill")
                   / linear_form(parts._roles["target"].coef, 1, prompt, chunk_cached, pairs))
    assert chunk_ratio == pytest.approx(fresh_ratio, rel=1e-9)
    whole = one.forward_s("target", 4, prompt + 3, chunk_cached + sum(cached), pairs + decode)
    assert StepCostModel(one).iteration_s(ks, cached, 1, prompt, chunk_cached, pairs) == \
        pytest.approx(whole, rel=1e-12)
    with pytest.raises(ConfigError, match="'one pass' or 'parts'"):
        ProfiledLatency(LatencyTable(table.rows, {**table.meta, "mixed_steps": "halves"}))


@pytest.mark.parametrize("profile", ["cpu-smollm2-135m", "vllm-cpu-smollm2"])
@pytest.mark.parametrize("scaled,extrapolation", [(False, "clamp"), (True, "clamp"),
                                                  (False, "fit")])
def test_a_shipped_profiles_arrays_are_its_scalars_to_the_bit(profile, scaled, extrapolation):
    """Every pass of a random batch of shapes, inside and outside each grid's box, in every
    phase and with the calibration's scales: the array gives each scalar's float exactly."""
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import LatencyTable

    table = LatencyTable.load(resolve_profile(profile))
    scales = {"pass_scale": 1.07, "phase_scales": {"prefill": 0.9, "decode": 1.1,
                                                   "verify": 1.3}} if scaled else {}
    model = ProfiledLatency(table, extrapolation=extrapolation, **scales)
    rng = np.random.default_rng(11)
    n = 3000
    b = rng.integers(0, 200, n)
    q = b * rng.integers(0, 12, n) + rng.integers(0, 3, n)  # decodes, verifies, ragged
    prompts = rng.random(n) < 0.2
    q[prompts] = b[prompts] * rng.integers(1, 2048, int(prompts.sum()))
    c = np.where(prompts & (rng.random(n) < 0.7), 0, rng.integers(0, 60_000, n))
    p = q * c + q * (q + 1) // 2
    for role in ("target", "draft"):
        for phase in (None, "prefill", "decode" if role == "target" else "draft"):
            array = model.forward_s(role, b, q, c, p, phase=phase)
            scalars = [model.forward_s(role, int(x), int(y), int(z), int(w), phase=phase)
                       for x, y, z, w in zip(b, q, c, p)]
            assert array.tolist() == scalars


def test_many_points_interpolate_with_maths_logarithm():
    """Where numpy's log and math's differ (about 1 input in 10,000), the array form takes
    math's, as the scalar form does: the points chosen are such inputs."""
    import math

    grid = next(g for m in _models()["clamp"]._roles.values() for g in m.grids.values()
                if 2 in g.active)
    lo, hi = grid.values[2][0], grid.values[2][-1]
    x = np.random.default_rng(5).uniform(lo, hi, 400_000)
    differ = x[np.log(x + 1.0) != np.array([math.log(v) for v in (x + 1.0).tolist()])][:50]
    assert len(differ) >= 10
    b = np.full(len(differ), float(grid.values[0][0]))
    q = np.full(len(differ), float(grid.values[1][0]))
    many = grid.interpolate_many(b, q, differ, clamp=True)
    assert many.tolist() == [grid.interpolate_scalar(x, y, z, True)
                             for x, y, z in zip(b.tolist(), q.tolist(), differ.tolist())]

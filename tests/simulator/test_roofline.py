"""Roofline latency: literal sanity timings, the compute knee, monotonicity, array = scalar."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.catalog import get_gpu, get_model
from simulator.errors import ConfigError
from simulator.latency import attention_pairs
from simulator.roofline import RooflineLatency, RooflineParams


@pytest.fixture(scope="module")
def lat() -> RooflineLatency:
    return RooflineLatency(get_model("llama-3.1-8b"), get_model("llama-68m"), get_gpu("h100"))


def decode(lat, role, batch, ctx, q=1):
    """One pass in which `batch` requests with `ctx` cached tokens feed `q` tokens each."""
    return lat.pass_s(role, batch, batch * q, batch * ctx, batch * attention_pairs(q, ctx))


def test_batch_one_decode_is_weight_streaming_time(lat):
    # ~15.0 GB of weights + 0.13 GB of KV over 3.35 TB/s x 0.85, plus launch costs: 5-6 ms.
    t = decode(lat, "target", 1, 1024)
    assert isinstance(t, float)
    assert 5e-3 < t < 6e-3
    weights = get_model("llama-3.1-8b").weight_params_read_per_pass * 2
    assert weights == pytest.approx(15.0e9, rel=0.01)


def test_compute_knee_for_a_verify_pass(lat):
    def verify(tokens):
        return lat.pass_s("target", 1, tokens, 1024, attention_pairs(tokens, 1024))

    assert verify(2) / verify(1) < 1.01  # memory-bound: one more token is nearly free
    assert verify(4096) / verify(2048) == pytest.approx(2.0, rel=0.1)  # compute-bound
    assert verify(64) / verify(1) < 1.01
    assert verify(1024) > 3 * verify(1)  # past the knee (a few hundred tokens)


def test_draft_pass_is_cheap_next_to_the_target(lat):
    assert decode(lat, "draft", 1, 1024) < 0.1 * decode(lat, "target", 1, 1024)


def test_verify_of_k_plus_one_costs_about_a_decode_at_batch_one(lat):
    plain = decode(lat, "target", 1, 1024)
    assert decode(lat, "target", 1, 1024, q=5) == pytest.approx(plain, rel=0.01)


def test_empty_passes_cost_nothing(lat):
    assert lat.pass_s("target", 0, 0, 0, 0) == 0.0
    assert lat.pass_s("target", 3, 0, 100, 0) == 0.0
    got = lat.pass_s("target", np.array([0, 1, 2]), np.array([1, 0, 2]), 10, 10)
    assert got[0] == 0.0 and got[1] == 0.0 and got[2] > 0


def test_model_free_drafter():
    lat = RooflineLatency(get_model("llama-3.1-8b"), None, get_gpu("h100"))
    assert not lat.has_draft_model
    assert lat.pass_s("draft", 8, 8, 8000, 8000) == 0.0
    assert np.array_equal(lat.pass_s("draft", np.array([1, 2]), 2, 10, 10), [0.0, 0.0])
    assert "model-free draft" in lat.source


def test_arrays_give_the_scalar_values(lat):
    batch = np.array([1, 4, 16, 64, 256])
    ctx = np.array([0, 128, 1024, 4096, 512])
    q = np.array([1, 5, 3, 2, 8])
    args = (batch, batch * q, batch * ctx, batch * attention_pairs(q, ctx))
    for role in ("target", "draft"):
        vec = lat.pass_s(role, *args)
        assert isinstance(vec, np.ndarray) and vec.shape == batch.shape
        one_by_one = [lat.pass_s(role, *(int(a[i]) for a in args)) for i in range(len(batch))]
        np.testing.assert_allclose(vec, one_by_one, rtol=1e-12)
    overhead = lat.step_overhead_s(batch)
    np.testing.assert_allclose(overhead, [lat.step_overhead_s(int(b)) for b in batch])


def test_numpy_scalars_return_python_floats(lat):
    assert isinstance(lat.pass_s("target", np.int64(2), np.int64(2), 10, 10), float)
    assert isinstance(lat.step_overhead_s(np.int64(4)), float)


def test_step_overhead(lat):
    p = lat.params
    assert lat.step_overhead_s(10) == pytest.approx(p.step_overhead_s + 10 * p.per_seq_overhead_s)
    assert lat.step_overhead_s(0) == 0.0


_count = st.integers(min_value=0, max_value=100_000)


@given(n=_count, q=_count, c=_count, pairs=_count, field=st.integers(0, 3), bump=_count)
def test_time_is_monotone_in_each_argument(lat, n, q, c, pairs, field, bump):
    args = [n, q, c, pairs]
    bigger = list(args)
    bigger[field] += bump
    for role in ("target", "draft"):
        assert lat.pass_s(role, *bigger) >= lat.pass_s(role, *args)


def test_bigger_models_and_slower_gpus_take_longer():
    h100, l4 = get_gpu("h100"), get_gpu("l4")
    small = RooflineLatency(get_model("llama-2-7b"), None, h100)
    big = RooflineLatency(get_model("llama-2-13b"), None, h100)
    slow = RooflineLatency(get_model("llama-2-7b"), None, l4)
    args = ("target", 8, 8, 8000, 8000)
    assert small.pass_s(*args) < big.pass_s(*args)
    assert small.pass_s(*args) < slow.pass_s(*args)


def test_params_are_validated_and_described(lat):
    with pytest.raises(ConfigError, match="bandwidth_efficiency"):
        RooflineParams(bandwidth_efficiency=1.5)
    with pytest.raises(ConfigError, match="per_layer_s"):
        RooflineParams(per_layer_s=-1.0)
    with pytest.raises(TypeError):
        RooflineParams(unknown=1.0)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="role"):
        lat.pass_s("verifier", 1, 1, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="query_tokens"):
        lat.pass_s("target", 1, -1, 1, 1)
    d = lat.describe()
    assert d["target"]["name"] == "Llama-3.1-8B" and d["draft"]["name"] == "Llama-68M"
    assert d["gpu"]["name"] == "H100-SXM" and d["dtype_bytes"] == 2
    assert d["params"] == {
        "bandwidth_efficiency": 0.85,
        "flops_efficiency": 0.70,
        "pass_fixed_s": 30e-6,
        "per_layer_s": 5e-6,
        "step_overhead_s": 200e-6,
        "per_seq_overhead_s": 2e-6,
        "allreduce_latency_s": 32.5e-6,
        "allreduce_latency_per_gpu_s": 1.75e-6,
    }
    assert d["tp"] == 1 and d["draft_tp"] == 1
    expected = "roofline: Llama-3.1-8B target + Llama-68M draft on H100-SXM, bf16"
    assert lat.source.startswith(expected)


def test_a_pass_with_no_query_costs_nothing_beside_passes_that_run(lat):
    """Arrays of passes with a scalar batch: those that feed no token cost 0, the others what
    they cost alone (the all-running case skips the mask; the mask still applies here)."""
    mixed = lat.forward_s("target", 3, np.array([0, 5]), np.array([10, 10]), np.array([0, 40]))
    assert mixed[0] == 0.0 and mixed[1] == lat.forward_s("target", 3, 5, 10, 40) > 0
    assert lat.forward_s("target", 3, 0, np.array([10]), np.array([0])).tolist() == [0.0]
    running = lat.forward_s("target", 3, np.array([3, 5]), np.array([10, 10]), np.array([9, 40]))
    assert running.tolist() == [lat.forward_s("target", 3, 3, 10, 9),
                                lat.forward_s("target", 3, 5, 10, 40)]

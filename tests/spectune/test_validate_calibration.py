"""validate's measured corrections: the workload-shaped grid, the drift scale's arithmetic, the
host-time fit, and the live engine's split of each iteration into passes and host time."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from live.pass_timer import PassTimer  # noqa: E402
from models.llama import LlamaModel, config_for  # noqa: E402
from simulator.catalog import ModelShape  # noqa: E402
from spectune.validate_calibration import DriftProbe, fit_host, validation_grid  # noqa: E402

TINY = ModelShape(name="tiny-cal", layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, ffn=64,
                  vocab=50, tied_embeddings=True, source="test")


@pytest.fixture(scope="module")
def target():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LlamaModel.random(config_for(TINY), seed=0)
    torch.set_num_threads(threads)


def test_validation_grid_covers_the_workload_and_no_more():
    grid = validation_grid(max_num_seqs=12, k_max=6, prompt_tokens=np.array([25, 60]),
                           output_tokens=np.array([64, 64]))
    assert grid.batch_sizes == (1, 2, 4, 8, 12)
    assert grid.query_tokens == (1, 2, 3, 5, 7)
    assert grid.context_tokens == (16, 32, 64, 128, 256)  # 25 .. 60 + 64 + 6 = 130
    assert grid.prompt_tokens == (16, 32, 64)
    assert grid.prefill_batch_sizes == (1, 2, 4, 8)
    plain = validation_grid(4, 8, np.array([40]), np.array([10]), drafting=False)
    assert plain.query_tokens == (1,) and plain.batch_sizes == (1, 2, 4)


def test_drift_scale_is_the_median_ratio_of_the_rounds_around_a_run(target, tmp_path):
    grid = validation_grid(2, 1, np.array([8]), np.array([4]))
    probe = DriftProbe(target, None, grid, tmp_path)
    probe.round()
    # replace the timings with known ones: every point 10 ms x (1, 1, 1.3, 1.3, 1) by round
    factors = [1.0, 1.0, 1.3, 1.3, 1.0]
    probe.sweep.samples = [[0.01 * f for f in factors] for _ in probe.sweep.samples]
    assert probe.rounds == 5
    assert probe.scale(0, 1) == pytest.approx(1.0, rel=1e-6)  # profile = median = 10 ms
    assert probe.scale(2, 3) == pytest.approx(1.3, rel=1e-6)
    assert probe.scale(1, 2) == pytest.approx(1.15, rel=1e-6)
    assert probe.table().meta["repeats"] == 5


def test_fit_host_recovers_a_linear_host_time():
    rng = np.random.default_rng(0)
    n = 200
    seqs = rng.integers(1, 17, n)
    drafted = rng.integers(0, 40, n) * (rng.random(n) < 0.8)
    host = 4e-4 + 1.5e-4 * seqs + 6e-5 * drafted
    passes = rng.uniform(0.05, 0.2, n)
    steps = pd.DataFrame({"duration_s": passes + host, "decode_seqs": seqs, "prefill_seqs": 0,
                          "drafted": drafted})
    fit = fit_host(SimpleNamespace(steps=steps, pass_s=passes))
    assert fit.step_overhead_s == pytest.approx(4e-4, rel=1e-6)
    assert fit.per_seq_overhead_s == pytest.approx(1.5e-4, rel=1e-6)
    assert fit.per_draft_token_s == pytest.approx(6e-5, rel=1e-6)
    assert fit.iterations == n and fit.residual_ms < 1e-6
    with pytest.raises(ValueError, match="passes timed"):
        fit_host(SimpleNamespace(steps=steps, pass_s=np.full(n, np.nan)))


def test_pass_timer_counts_forward_passes_and_not_the_rest(target):
    timer = PassTimer([target, target])  # a model listed twice is hooked once
    try:
        tokens = [torch.tensor([1, 2, 3])]
        t0 = time.perf_counter()
        target(tokens, [target.new_cache(8)], logits="all")
        inside = time.perf_counter() - t0
        time.sleep(0.02)  # host time: not counted
        took = timer.take()
        assert 0 < took <= inside
        assert timer.take() == 0.0  # reset by take
    finally:
        timer.close()
    target([torch.tensor([1])], [target.new_cache(8)], logits="all")
    assert timer.take() == 0.0  # closed: no hooks left

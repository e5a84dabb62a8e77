"""vLLM's profile and validation bookkeeping, by hand: which iteration lines become table rows
(shape and seconds), what a run's measured metrics are, which policies a server can run."""

from __future__ import annotations

import pandas as pd
import pytest

from live.vllm_profile import (
    batch_rows,
    cyclic_prompt,
    distinct_prompt,
    idle_proposer_s,
    table_rows,
)
from simulator import ConfigError
from spectune.flags import parse_policy_list
from spectune.validate_vllm import configs_of, ks_of, measured_metrics
from spectune.vllm_speed import (
    ServedTimes,
    busy_ratio,
    iteration_agreement,
    phase_speeds,
    pooled,
)


def lines(*rows):
    return pd.DataFrame(rows, columns=["iteration", "context_requests", "context_tokens",
                                       "generation_requests", "generation_tokens",
                                       "elapsed_ms", "dummy"])


def test_a_speculating_batch_becomes_prefill_and_verify_rows():
    its = lines((0, 2, 200, 0, 0, 500.0, False),   # both prompts of 100 tokens
                (1, 0, 0, 2, 10, 40.0, False),     # 2 x (1 + 4 drafts) over 100 cached
                (2, 0, 0, 2, 10, 42.0, False),     # after 2 accepted: 100 + 3 cached
                (3, 0, 0, 2, 6, 30.0, False),      # 2 drafts each: a 3-token verify
                (4, 0, 0, 2, 7, 20.0, False))      # not 2 x (1 + 4): one request had fewer
    rows = batch_rows(its, 2, 100, 4, drafted=[4, 4, 2, 4], accepted=[2, 4, 0, 1])
    assert rows == [
        {"phase": "prefill", "num_seqs": 2, "query_tokens_per_seq": 100,
         "cached_tokens_per_seq": 0, "seconds": 0.5},
        {"phase": "verify", "num_seqs": 2, "query_tokens_per_seq": 5,
         "cached_tokens_per_seq": 100, "seconds": 0.04},
        {"phase": "verify", "num_seqs": 2, "query_tokens_per_seq": 5,
         "cached_tokens_per_seq": 103, "seconds": 0.042},
        {"phase": "verify", "num_seqs": 2, "query_tokens_per_seq": 3,
         "cached_tokens_per_seq": 108, "seconds": 0.03},
    ]


def test_decode_rows_count_one_token_per_step_and_bin_by_context():
    its = lines((0, 1, 64, 0, 0, 100.0, False), *[(i, 0, 0, 1, 1, 20.0 + i, False)
                                                  for i in range(1, 10)])
    rows = batch_rows(its, 1, 64, 0, drafted=[], accepted=[])
    assert [r["cached_tokens_per_seq"] for r in rows[1:]] == list(range(64, 73))
    table = table_rows(pd.DataFrame(rows))
    decode = table[table.phase == "decode"]
    assert decode.cached_tokens_per_seq.tolist() == [64, 72]  # bins of 8
    assert decode.repeats.tolist() == [8, 1]
    assert decode.median_s.tolist() == pytest.approx([0.0245, 0.029])


def test_the_table_keeps_a_full_product_grid():
    raw = pd.DataFrame([
        {"phase": "prefill", "num_seqs": b, "query_tokens_per_seq": q,
         "cached_tokens_per_seq": 0, "seconds": 0.1}
        for b, q in ((1, 64), (2, 64), (1, 256), (2, 256), (1, 1536))] + [
        {"phase": "decode", "num_seqs": b, "query_tokens_per_seq": 1,
         "cached_tokens_per_seq": c, "seconds": 0.02}
        for b, c in ((1, 128), (2, 128), (1, 136), (2, 136), (1, 144))])
    table = table_rows(raw)
    prefill = table[table.phase == "prefill"]
    assert sorted(prefill.query_tokens_per_seq.unique()) == [64, 256]  # 1536: batch 1 only
    decode = table[table.phase == "decode"]
    assert sorted(decode.cached_tokens_per_seq.unique()) == [128, 136]  # 144: batch 1 only
    assert (table.role == "target").all() and len(table) == 8


def test_a_speculating_servers_decodes_give_the_idle_proposer_not_the_grid():
    """Decodes timed on a server with k > 0 (its lookup found nothing) against the k = 0
    server's at the same (batch, context bin): the median of the shapes' differences."""
    def rows(k, b, c, seconds):
        return [{"phase": "decode", "num_seqs": b, "query_tokens_per_seq": 1,
                 "cached_tokens_per_seq": c, "seconds": s, "k": k} for s in seconds]
    raw = pd.DataFrame(rows(0, 1, 128, [0.010, 0.012]) + rows(0, 2, 130, [0.014])
                       + rows(2, 1, 131, [0.0125, 0.0135]) + rows(4, 2, 129, [0.015])
                       + rows(4, 4, 128, [0.030]))  # batch 4: no k = 0 decode to pair with
    assert idle_proposer_s(raw) == (pytest.approx(0.0015), 2)  # median of +2.0 and +1.0 ms
    decode = table_rows(raw)
    assert decode.repeats.tolist() == [2, 1] and decode.num_seqs.tolist() == [1, 2]
    assert idle_proposer_s(raw[raw.k == 0]) is None


def test_the_distinct_prompt_never_repeats_a_token():
    p = distinct_prompt(300)
    assert len(set(p)) == 300 and not set(p) & set(cyclic_prompt(16))


def test_the_cyclic_prompt_repeats():
    p = cyclic_prompt(40)
    assert len(p) == 40 and p[:16] == p[16:32] and len(set(p)) == 16


def test_measured_metrics_of_a_run():
    requests = pd.DataFrame({"arrival_s": [0.0, 1.0], "first_token_s": [0.5, 2.0],
                             "finish_s": [1.5, 4.0], "output_tokens": [3, 5]})
    its = lines((0, 1, 10, 0, 0, 1, False), (1, 1, 10, 1, 5, 1, False),
                (2, 0, 0, 2, 6, 1, False), (3, 0, 0, 1, 1, 1, False))
    m = measured_metrics(requests, its)
    assert m["ttft_mean_s"] == pytest.approx(0.75)
    assert m["tpot_mean_s"] == pytest.approx((0.5 + 0.5) / 2)
    assert m["e2e_mean_s"] == pytest.approx(2.25)
    assert m["emitted_per_step"] == pytest.approx((8 - 2) / 4)  # less each prompt's first token
    assert m["drafted_per_step"] == pytest.approx((4 + 4 + 0) / 4)
    assert m["throughput_tokens_per_s"] == pytest.approx(8 / 4.0)


def test_a_vllm_server_runs_fixed_k_or_a_batch_size_table():
    assert ks_of([("fixed:k=0", "fixed", {"k": "0"}), ("fixed:k=4", "fixed", {"k": "4"})]) == (0, 4)
    fixed, table = configs_of(parse_policy_list(
        "fixed:k=2,batch_adaptive:schedule=[[1,4,4],[5,128,0]]"))
    assert (fixed.k, fixed.table, fixed.folder) == (2, (), "k2")
    assert fixed.policy().k == 2
    assert table.k == 4  # the server's num_speculative_tokens: the table's largest k
    assert table.table == ((1, 4, 4), (5, 128, 0))
    assert table.folder == "table-1-4x4_5-128x0"
    assert table.policy().schedule == [[1, 4, 4], [5, 128, 0]]
    with pytest.raises(ConfigError, match="fixed:k=K or batch_adaptive:schedule"):
        ks_of([("goodput", "goodput", {})])
    with pytest.raises(ConfigError, match="fixed:k=K or batch_adaptive:schedule"):
        configs_of(parse_policy_list("batch_adaptive:schedule=[[1,4,4]]:alpha=0.5"))
    with pytest.raises(ConfigError, match="k = 0 only is fixed:k=0"):
        configs_of(parse_policy_list("batch_adaptive:schedule=[[1,128,0]]"))


def sim_steps(*rows):
    return pd.DataFrame(rows, columns=["duration_s", "decode_seqs", "prefill_seqs",
                                       "prefill_tokens", "drafted"])


def test_iteration_agreement_compares_only_steps_of_the_same_shape():
    logged = lines((0, 1, 100, 0, 0, 100.0, False), (1, 0, 0, 1, 5, 20.0, False),
                   (2, 0, 0, 1, 3, 40.0, False))
    # the simulator's steps carry the 5 ms gap; its third step drafted 1, vLLM's drafted 2
    steps = sim_steps((0.0, 0, 0, 0, 0), (0.115, 0, 1, 100, 0), (0.027, 1, 0, 0, 4),
                      (0.045, 1, 0, 0, 1))
    got = iteration_agreement(logged, steps, 0.005)
    assert (got["matched"], got["of"]) == (2, 3)  # the idle step is skipped, the third differs
    assert got["median_abs_error_pct"] == pytest.approx((10 + 10) / 2)  # +10% and +10%
    # vLLM's 160 ms against the simulated passes' 110 + 22 + 40 ms (gaps out)
    assert busy_ratio(logged, steps, 0.005) == pytest.approx(0.160 / 0.172)
    # a gap per step (the fitted model's): the 4-request-step's own gap is taken out
    per_step = [0.0, 0.005, 0.005, 0.007]
    assert busy_ratio(logged, steps, per_step) == pytest.approx(0.160 / 0.170)
    assert iteration_agreement(logged, steps, per_step)["median_abs_error_pct"] \
        == pytest.approx(10)


def test_phase_speeds_compare_shape_for_shape_whatever_the_mix():
    """Per phase, vLLM's time over the simulated mean pass of the same shape, summed over vLLM's
    iterations: how often each shape ran (which differs near saturation) does not move it,
    where it moves the busy ratio; a phase nothing matched takes the overall ratio."""
    # simulated (1 ms gap each): decode at batch 2 three times (10 ms passes), at batch 4 once
    # (20 ms), a verify of 2 requests x 3 tokens (30 ms), a prompt of 100 tokens (100 ms)
    steps = sim_steps((0.011, 2, 0, 0, 0), (0.011, 2, 0, 0, 0), (0.011, 2, 0, 0, 0),
                      (0.021, 4, 0, 0, 0), (0.031, 2, 0, 0, 4), (0.101, 0, 1, 100, 0),
                      (0.0, 0, 0, 0, 0))
    # vLLM ran batch 2 once and batch 4 five times, all 10% faster; its verify 20% slower; a
    # prompt of a shape the simulation never ran; a dummy iteration that ran no request
    logged = lines((0, 0, 0, 2, 2, 9.0, False), *[(i, 0, 0, 4, 4, 18.0, False)
                                                  for i in range(1, 6)],
                   (6, 0, 0, 2, 6, 36.0, False), (7, 1, 90, 0, 0, 80.0, False),
                   (8, 0, 0, 0, 0, 500.0, True))
    speeds = phase_speeds(logged, steps, 0.001)
    assert speeds["decode"] == pytest.approx(0.9)
    assert speeds["verify"] == pytest.approx(1.2)
    # no prompt of 90 tokens was simulated: the overall ratio, (9 + 90 + 36) / (10 + 100 + 30)
    assert speeds["prefill"] == pytest.approx((9 + 5 * 18 + 36) / (10 + 5 * 20 + 30))
    # the busy ratio counts each side's own mix (and here the dummy's time): not 0.9 for decode
    assert busy_ratio(logged, steps, 0.001) != pytest.approx(0.9, abs=0.05)


def window(decode_logged: float, decode_simulated: float, gap: float = 1.0) -> ServedTimes:
    """A window that ran only decodes, with its host gap against a modelled 1 s."""
    return ServedTimes({"prefill": (0.0, 0.0), "decode": (decode_logged, decode_simulated),
                        "verify": (0.0, 0.0)}, (gap, 1.0), (decode_logged, decode_simulated))


def test_a_calibration_pools_the_servers_earlier_windows_each_weighing_half_the_next():
    """Serving order cal 0.5, run 0.5, cal 1.5, run 1.5, cal 3: the run at 3 req/s is scaled by
    the five windows before it with weights 1/16, 1/8, 1/4, 1/2, 1 (validate_vllm.POOL_KEEP)."""
    from spectune.validate_vllm import POOL_KEEP

    served = [window(2.0, 1.0), window(1.0, 1.0), window(1.0, 1.0), window(1.0, 1.0),
              window(1.0, 1.0)]
    pool = None
    for w in served:
        pool = pooled(pool, w, POOL_KEEP)
    speed = pool.speed()
    weights = [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1]
    assert speed.phases["decode"] == pytest.approx(
        sum(w * t for w, t in zip(weights, [2, 1, 1, 1, 1])) / sum(weights))
    # a phase nothing matched takes the overall ratio: here the decodes'
    assert speed.phases["prefill"] == speed.phases["verify"] == speed.phases["decode"]
    assert speed.windows == 5 and speed.busy == pytest.approx(speed.phases["decode"])
    # without decay every window weighs the same
    flat = None
    for w in served:
        flat = pooled(flat, w, 1.0)
    assert flat.speed().phases["decode"] == pytest.approx(6 / 5)


def test_a_window_speed_never_scales_by_zero_or_a_negative_gap():
    """A log whose iterations fill the busy time leaves no host gap (0, not negative); a
    window with nothing simulated has no busy ratio; no phase scale is 0."""
    speed = window(0.0, 0.0, gap=-0.2).speed()
    assert speed.host == 0.0 and speed.busy is None
    assert all(x == 1.0 for x in speed.phases.values())
    assert speed.to_json()["busy_ratio"] is None

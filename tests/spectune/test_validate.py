"""`spectune validate --quick`: live runs of a tiny random model against the simulator.

Timing errors are reported, not bounded tightly (a shared CI machine is noisy); acceptance is
replayed exactly from the live run's own outputs, so emitted per step must agree."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from simulator import ConfigError  # noqa: E402
from spectune.validate import (  # noqa: E402
    ROW_KEYS,
    ValidateSpec,
    add_parser,
    format_table,
    run_validate,
)

TIMES = ("ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s", "e2e_mean_s", "e2e_p50_s",
         "e2e_p99_s")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    threads = torch.get_num_threads()
    try:
        rows = run_validate(ValidateSpec(quick=True, requests=5, rates=(5.0, 80.0)), out)
    finally:
        torch.set_num_threads(threads)
    return rows, out


def test_rows_have_the_documented_keys_for_every_policy_and_rate(quick):
    rows, _ = quick
    assert rows and all(tuple(r) == ROW_KEYS for r in rows)
    runs = {(r["policy"], r["rate"]) for r in rows}
    assert runs == {(p, rate) for p in ("fixed:k=0", "fixed:k=4") for rate in (5.0, 80.0)}
    metrics = {r["metric"] for r in rows}
    assert set(TIMES) | {"emitted_per_step", "tpot_p99_s"} <= metrics


def test_simulated_and_measured_are_positive(quick):
    for r in quick[0]:
        if r["metric"] in TIMES or r["metric"] == "emitted_per_step":
            assert r["simulated"] > 0 and r["measured"] > 0, r


def test_acceptance_replays_exactly(quick):
    for r in quick[0]:
        if r["metric"] == "emitted_per_step":
            assert abs(r["error_pct"]) < 5, r
            if r["policy"] == "fixed:k=0":
                assert r["simulated"] == r["measured"] == 1.0


def test_timings_are_not_wildly_off(quick):
    """Loose: the tiny model's passes take ~0.1-1 ms, so noise is large; a factor of 5 means
    the comparison itself is broken (wrong units, wrong workload, a missing term)."""
    for r in quick[0]:
        if r["metric"] == "e2e_mean_s":
            assert 0.2 < r["simulated"] / r["measured"] < 5, r


def test_results_are_written(quick):
    rows, out = quick
    data = json.loads((out / "validate.json").read_text())
    assert len(data["rows"]) == len(rows)
    meta = data["meta"]
    assert set(meta["host"]) == {"fixed:k=0", "fixed:k=4"} and meta["threads"] == 1
    assert len(meta["runs"]) == 4 and all(r["pass_scale"] > 0 for r in meta["runs"])
    assert (out / "validate.csv").read_text().splitlines()[0] == ",".join(ROW_KEYS)
    assert "fixed:k=4 at 80 req/s" in format_table(rows, meta)


def test_parser_and_spec():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["validate", "--quick", "--rates", "1", "3", "--policies",
                              "fixed:k=2,goodput"])
    assert args.rates == [1.0, 3.0] and args.quick
    spec = ValidateSpec(quick=True, policies="fixed:k=2,goodput")
    assert spec.model == "tiny" and spec.policy_specs == [("fixed:k=2", "fixed", {"k": "2"}),
                                                          ("goodput", "goodput", {})]
    assert ValidateSpec().rate_list == (0.5, 4.0)
    with pytest.raises(ConfigError, match="--model"):
        ValidateSpec(model="gpt")
    with pytest.raises(ConfigError, match="--rates"):
        ValidateSpec(rates=(0.0,))
    assert np.isfinite(ValidateSpec().n_requests)


def test_model_drafter_signals_replay_for_per_request_policies(tmp_path):
    """An early-exit drafter: the trace carries KL and draft confidence from teacher-forced
    passes, so policies that decide from each request's own history (kld_variance reads KL,
    gammatune stops chains on draft confidence) replay exactly too. (A batch-level policy such
    as goodput may not: its k depends on the batch, which real timing shapes.)"""
    spec = ValidateSpec(quick=True, requests=4, rates=(20.0,), drafter="early-exit:1",
                        policies="fixed:k=3,kld_variance,gammatune")
    rows = run_validate(spec, tmp_path)
    emitted = [r for r in rows if r["metric"] == "emitted_per_step"]
    assert len(emitted) == 3
    for r in emitted:
        assert abs(r["error_pct"]) < 5, r


def test_sampling_replays_exactly(tmp_path):
    """--temperature: the live engine samples (rejection sampling) and the simulator replays the
    acceptance it saw, step for step."""
    spec = ValidateSpec(quick=True, requests=4, rates=(20.0,), drafter="early-exit:1",
                        policies="fixed:k=3", temperature=0.8)
    rows = run_validate(spec, tmp_path)
    emitted = [r for r in rows if r["metric"] == "emitted_per_step"]
    assert len(emitted) == 1 and emitted[0]["measured"] > 1.0
    assert emitted[0]["error_pct"] == pytest.approx(0.0, abs=1e-9)
    live = pd.read_csv(next(tmp_path.glob("**/live_requests.csv")))
    sim = pd.read_csv(next(tmp_path.glob("**/sim_requests.csv")))
    assert live.accepted.tolist() == sim.accepted.tolist()
    with pytest.raises(ConfigError, match="temperature"):
        ValidateSpec(temperature=-0.1)


@pytest.mark.parametrize(("drafter", "acceptance", "policies", "tokens"), [
    ("ngram", None, "fixed:k=3", 64),  # the shipped n-gram recording, with its proposal caps
    ("model:Llama-68M", "beta:6,3~10", "fixed:k=2,kld_variance", 12),
])
def test_replay_mode_serves_a_catalog_shape(tmp_path, drafter, acceptance, policies, tokens):
    """A catalog shape with random weights: real passes, acceptance from a trace, which the
    simulator replays too, so the accepted drafts agree request by request."""
    spec = ValidateSpec(model="Llama-68M", drafter=drafter, acceptance=acceptance, requests=4,
                        rates=(20.0,), output_tokens=tokens, policies=policies, max_num_seqs=4,
                        k_max=3)
    rows = run_validate(spec, tmp_path)
    emitted = [r for r in rows if r["metric"] == "emitted_per_step"]
    assert len(emitted) == len(spec.policy_specs)
    for r in emitted:
        assert r["measured"] > 1.0 and r["error_pct"] == pytest.approx(0.0, abs=1e-9), r
    for live_file in tmp_path.glob("**/live_requests.csv"):
        live = pd.read_csv(live_file)
        sim = pd.read_csv(live_file.with_name("sim_requests.csv"))
        assert live.accepted.tolist() == sim.accepted.tolist()
    meta = json.loads((tmp_path / "validate.json").read_text())["meta"]
    assert meta["replay"]["acceptance"] == (acceptance or "smollm2-ngram")
    assert meta["weights"] == "random (replay mode)"
    assert "acceptance replayed from" in format_table(rows, meta)


def test_replay_mode_refusals():
    with pytest.raises(ConfigError, match="--acceptance"):
        ValidateSpec(model="Llama-68M", drafter="model:Llama-68M")  # which acceptance?
    with pytest.raises(ConfigError, match="replay"):
        ValidateSpec(model="smollm2", acceptance="beta:6,3")
    with pytest.raises(ConfigError, match="--dtype"):
        ValidateSpec(dtype="int8")
    with pytest.raises(ConfigError, match="--scheduler 'nope': known: fcfs-reserve"):
        ValidateSpec(scheduler="nope")


def test_chunked_prefill_validates_with_the_same_scheduler(tmp_path):
    """The live engine and the simulator both chunk prompts under the same token budget."""
    spec = ValidateSpec(quick=True, requests=5, rates=(40.0,), policies="fixed:k=2",
                        chunked_prefill=True, max_batched_tokens=16)
    rows = run_validate(spec, tmp_path)
    emitted = next(r for r in rows if r["metric"] == "emitted_per_step")
    assert emitted["error_pct"] == pytest.approx(0.0, abs=1e-9)
    live = pd.read_csv(next(tmp_path.glob("**/live_steps.csv")))
    sim = pd.read_csv(next(tmp_path.glob("**/sim_steps.csv")))
    for steps in (live, sim):
        assert ((steps.prefill_seqs > 0) & (steps.decode_seqs > 0)).any()
        assert steps.prefill_tokens.max() <= 16
    assert json.loads((tmp_path / "validate.json").read_text())["meta"]["scheduler"][
        "chunked_prefill"] is True
    with pytest.raises(ConfigError, match="max-batched-tokens"):
        ValidateSpec(chunked_prefill=True)


def test_policies_the_replayed_acceptance_cannot_serve_are_caught_before_any_run():
    """The README's `validate --model Llama-68M --acceptance smollm2-ngram` failed after its
    first live runs: kld_variance (a default) reads KL, which the n-gram recording lacks."""
    import types
    import warnings

    from spectune.simulate import build_acceptance
    from spectune.validate import usable_policies
    from traces import UserNote, synthetic_workload
    from traces.synthetic import FixedLengths

    workload = synthetic_workload("poisson", 4.0, 4, FixedLengths(20, 8),
                                  np.random.default_rng(0))
    setup = types.SimpleNamespace(acceptance="smollm2-ngram", replay_trace=lambda wl: (
        build_acceptance("smollm2-ngram", wl, np.random.default_rng(0))))
    default = ValidateSpec(model="Llama-68M", acceptance="smollm2-ngram")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = usable_policies(default, setup, workload)
    assert "kld_variance" in {name for _, name, _ in default.policy_specs}
    assert "kld_variance" not in {name for _, name, _ in kept} and kept
    assert any(issubclass(w.category, UserNote) and "kld_variance reads kl" in str(w.message)
               for w in caught)
    named = ValidateSpec(model="Llama-68M", acceptance="smollm2-ngram",
                         policies="fixed:k=2,kld_variance")
    with pytest.raises(ConfigError, match="lacks signals that policies read"):
        usable_policies(named, setup, workload)


def test_a_profile_of_other_models_is_refused():
    """--profile must time the models served: else the comparison is silently wrong (a tiny
    model's runs compared with SmolLM2's passes once printed errors of +10,000%)."""
    from dataclasses import replace as replace_shape

    from simulator.catalog import get_model
    from simulator.latency_table import LatencyTable, new_meta
    from spectune.validate import check_profile_models

    target, draft = get_model("SmolLM2-135M"), get_model("Llama-68M")
    rows = pd.DataFrame([{"role": "target", "phase": "decode", "num_seqs": 1,
                          "query_tokens_per_seq": 1, "cached_tokens_per_seq": 64,
                          "median_s": 0.01, "p10_s": 0.01, "p90_s": 0.01, "repeats": 1}])
    table = LatencyTable(rows, new_meta("cpu", "none", "2.13", "fp32", target, draft,
                                        {"num_seqs": [1]}, 1, 0))
    check_profile_models(table, target, draft, "p")  # the same models
    check_profile_models(table, replace_shape(target, name="renamed"), None, "p")  # no draft
    with pytest.raises(ConfigError, match="times SmolLM2-135M as the target, but this "
                                          "validation serves Llama-68M"):
        check_profile_models(table, draft, None, "p")
    with pytest.raises(ConfigError, match="times Llama-68M as the draft, but this validation "
                                          "serves SmolLM2-135M"):
        check_profile_models(table, target, target, "p")
    no_draft = LatencyTable(rows, new_meta("cpu", "none", "2.13", "fp32", target, None,
                                           {"num_seqs": [1]}, 1, 0))
    with pytest.raises(ConfigError, match="times no draft model as the draft"):
        check_profile_models(no_draft, target, draft, "p")

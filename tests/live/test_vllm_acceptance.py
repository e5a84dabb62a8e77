"""Acceptance replayed from what vLLM wrote: the n-gram trace rebuilt from a real vLLM run's
prompts and outputs reproduces vLLM's own per-step drafted/accepted counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from live.vllm_acceptance import (
    explained_by_zero_drafts,
    ngram_trace,
    per_step_check,
    replayed_steps,
)

RUN = json.loads((Path(__file__).parent / "data" / "vllm-ngram-k4.json").read_text())


def test_replay_reproduces_vllms_steps():
    trace = ngram_trace(RUN["prompts"], RUN["outputs"], 16, {"source": RUN["source"]})
    check = per_step_check(trace, RUN["k"], RUN["per_step"])
    # vLLM verifies past max_tokens and counts what it accepted there: only a last step differs
    assert check.different == 0
    assert check.identical + check.last_step_only == len(RUN["outputs"]) == 16
    assert check.identical >= 8
    drafted = sum(sum(d) for d, _ in RUN["per_step"])
    ours = sum(sum(replayed_steps(r.run, r.proposable, RUN["k"])[0]) for r in trace.requests)
    assert ours == drafted


def test_a_different_output_is_caught():
    outputs = [list(o) for o in RUN["outputs"]]
    outputs[0][5:20] = [outputs[0][4]] * 15  # repeats: the lookup now proposes and accepts more
    trace = ngram_trace(RUN["prompts"], outputs, 16, {})
    assert per_step_check(trace, RUN["k"], RUN["per_step"]).different >= 1


NEAR_LIMIT = json.loads((Path(__file__).parent / "data" /
                         "vllm-ngram-k4-max-model-len.json").read_text())


def test_zero_draft_steps_near_max_model_len_explain_a_real_run():
    """A real run where request 13 (2032 + 15 tokens) came within K of max_model_len 2048:
    while it did, vLLM gave every request of the batch zero drafts, all rejected. The lookup
    alone leaves 10 of 16 requests different; read with zero-draft steps, none."""
    run = NEAR_LIMIT
    trace = ngram_trace(run["prompts"], run["outputs"], 16, {})
    alone = per_step_check(trace, run["k"], run["per_step"])
    assert alone.different == 10
    lengths = [len(p) for p in run["prompts"]]
    check = per_step_check(trace, run["k"], run["per_step"], lengths, run["max_model_len"])
    assert (check.different, check.zero_drafts) == (0, 10)
    assert check.identical + check.last_step_only == alone.identical + alone.last_step_only
    # any (K, 0) step may be read as a zero-draft step, but not the cut of request 13's last
    # drafts to 3, 2 and 1 (max_model_len - N - 1): under another limit it stays different
    assert per_step_check(trace, run["k"], run["per_step"], lengths, 4096).different == 1


def test_zero_draft_steps_by_hand():
    """A request of 8 output tokens whose real drafts (k = 2) are always right: a zero-draft
    step at position 1 (2 drafted, none accepted, one token) shifts the rest; drafts are cut
    to max_model_len - N - 1."""
    run = np.array([0, 2, 2, 2, 2, 2, 1, 0], dtype=np.int32)
    proposable = np.full(8, 16, dtype=np.int32)
    assert explained_by_zero_drafts(run, proposable, 2, 10, 50, [2, 2, 2], [2, 2, 0])
    assert explained_by_zero_drafts(run, proposable, 2, 10, 50, [2, 2, 2], [0, 2, 2])
    assert not explained_by_zero_drafts(run, proposable, 2, 10, 50, [2, 2, 2], [0, 1, 2])
    assert not explained_by_zero_drafts(run, proposable, 2, 10, 50, [2, 2], [0, 2])
    # prompt 44: N = 45 at position 1, room 50 - 45 - 1 = 4; at position 4 room 1
    assert explained_by_zero_drafts(run, proposable, 2, 44, 50, [2, 1], [2, 1])

"""Acceptance replayed from what vLLM wrote: the n-gram trace rebuilt from a real vLLM run's
prompts and outputs reproduces vLLM's own per-step drafted/accepted counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from live.vllm_acceptance import ngram_trace, per_step_check, replayed_steps

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

"""The shipped prompt set and its split live in traces/, below every job that reads them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from traces.prompts import DEFAULT_PROMPTS, in_split, load_prompts


def test_the_shipped_set_and_its_split():
    prompts = load_prompts(DEFAULT_PROMPTS)
    assert len(prompts) == 480 and len({p.category for p in prompts}) == 13
    train = [p for p in prompts if in_split(p.key, "train")]
    evaluation = [p for p in prompts if in_split(p.key, "eval")]
    assert len(train) == len(evaluation) == 240
    assert all(int(p.key) % 2 == 0 for p in train)
    assert len(load_prompts(DEFAULT_PROMPTS, limit=1)) == 13
    with pytest.raises(ValueError, match="--categories: unknown nope"):
        load_prompts(DEFAULT_PROMPTS, categories="nope")


def test_reading_prompts_imports_no_job():
    probe = ("import sys, traces.prompts; "
             "print(any(m.startswith(('spectune', 'profiler', 'torch')) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "False"

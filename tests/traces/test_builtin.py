"""The shipped Azure traces: counts, rates and provenance match the shared data README."""

from __future__ import annotations

import gzip
import hashlib
from importlib import resources

import numpy as np
import pytest

from traces import DEFAULT_WORKLOAD, TraceError, builtin_names, builtin_workload

# From traces/data/README.md (neither file has zero-token rows, so none are dropped).
EXPECTED = {
    "azure-conv": ("AzureLLMInferenceTrace_conv.csv.gz", 19_366, 5.53,
                   "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"),
    "azure-code": ("AzureLLMInferenceTrace_code.csv.gz", 8_819, 2.57,
                   "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"),
}


def test_names():
    assert builtin_names() == ("azure-conv", "azure-code")
    assert DEFAULT_WORKLOAD in builtin_names()


@pytest.mark.parametrize("name", list(EXPECTED))
def test_counts_and_rates(name):
    _, count, rate, _ = EXPECTED[name]
    w = builtin_workload(name)
    assert len(w) == count
    assert w.mean_rate_per_s == pytest.approx(rate, rel=0.01)
    assert w.arrival_s[0] == 0.0
    assert np.array_equal(w.request_ids, np.arange(count))
    assert w.source.startswith("Azure LLM inference trace 2023")
    assert "dropped" not in w.source


def test_known_first_rows():
    conv = builtin_workload("azure-conv")
    assert (conv[0].prompt_tokens, conv[0].output_tokens) == (374, 44)
    assert conv[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-9)
    assert conv.output_tokens.max() == 1000 and conv.prompt_tokens.max() == 14050
    code = builtin_workload("azure-code")
    assert (code[0].prompt_tokens, code[0].output_tokens) == (4808, 10)
    assert code.output_tokens.max() == 1899


def test_cached_and_shared_safely():
    w = builtin_workload("azure-code")
    assert builtin_workload("azure-code") is w
    with pytest.raises(ValueError):
        w.prompt_tokens[0] = 1


def test_unknown_name_lists_known_names():
    with pytest.raises(TraceError, match="unknown built-in workload 'azure'; known: azure-conv, "
                                         "azure-code"):
        builtin_workload("azure")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_embedded_files_are_the_originals(name):
    file_name, _, _, sha = EXPECTED[name]
    data = (resources.files("traces") / "data" / file_name).read_bytes()
    raw = gzip.decompress(data)
    assert hashlib.sha256(raw).hexdigest() == sha
    assert gzip.compress(raw, compresslevel=9, mtime=0) == data  # reproducible bytes


def test_data_readme_carries_license_and_attribution():
    text = (resources.files("traces") / "data" / "README.md").read_text(encoding="utf-8")
    for fact in ("CC-BY-4.0", "Splitwise", "ISCA 2024", "Pratyush Patel",
                 "b469a113cedca53ddc3bdea71a143dc4b7d8700c",
                 EXPECTED["azure-conv"][3], EXPECTED["azure-code"][3]):
        assert fact in text


def test_every_shipped_speculation_trace_matches_its_summary():
    """The recordings load, and their summary files (the figures the README quotes) are what
    the traces themselves give."""
    import json

    from spectune.record import acceptance_summary
    from traces import SpeculationTrace
    from traces.builtin import builtin_speculation_path, speculation_names

    assert {"smollm2-ngram", "smollm2-early-exit-24-lens"} <= set(speculation_names())
    for name in speculation_names():
        path = builtin_speculation_path(name)
        trace = SpeculationTrace.load(path)
        summary = json.loads(path.with_name(path.name.replace(".npz", ".summary.json"))
                             .read_text())
        again = acceptance_summary(list(trace.requests), summary["k"])
        assert (again["prompts"], again["tokens"]) == (summary["prompts"], summary["tokens"])
        assert again["tokens_per_step"] == summary["tokens_per_step"]
        assert again["acceptance_k1"] == summary["acceptance_k1"]
    full = SpeculationTrace.load(builtin_speculation_path("smollm2-ngram"))
    assert len(full.requests) == 480 and len({r.category for r in full.requests}) == 13

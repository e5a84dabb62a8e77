"""Named workloads shipped inside the package, so a default run needs no files or network."""

from __future__ import annotations

import functools
from importlib import resources

from traces.errors import TraceError
from traces.loaders import parse_workload_bytes
from traces.workload import Workload

DEFAULT_WORKLOAD = "azure-conv"

# name -> (file in traces/data, provenance written into Workload.source)
_BUILTIN: dict[str, tuple[str, str]] = {
    "azure-conv": (
        "AzureLLMInferenceTrace_conv.csv.gz",
        "Azure LLM inference trace 2023 (conv)",
    ),
    "azure-code": (
        "AzureLLMInferenceTrace_code.csv.gz",
        "Azure LLM inference trace 2023 (code)",
    ),
}


def builtin_names() -> tuple[str, ...]:
    """Names accepted by builtin_workload, in a stable order."""
    return tuple(_BUILTIN)


@functools.cache
def builtin_workload(name: str) -> Workload:
    """Load a shipped trace by name (cached: a Workload is read-only, so sharing it is safe).

    See traces/data/README.md for the source, license (CC-BY-4.0) and required attribution.
    """
    if name not in _BUILTIN:
        known = ", ".join(builtin_names())
        raise TraceError(f"unknown built-in workload {name!r}; known: {known}")
    file_name, source = _BUILTIN[name]
    data = (resources.files("traces") / "data" / file_name).read_bytes()
    return parse_workload_bytes(data, file_name, source=source)


# Speculation traces recorded with `spectune record` from the real SmolLM2-135M-Instruct (greedy);
# see traces/data/speculation/README.md for how each was made and what it measured.
_SPECULATION: dict[str, str] = {
    "smollm2-ngram": "smollm2-ngram.npz",
    "smollm2-early-exit-20": "smollm2-early-exit-20.npz",
    "smollm2-early-exit-24-lens": "smollm2-early-exit-24-lens.npz",
    "smollm2-eagle-ngram": "smollm2-eagle-ngram.npz",
    "smollm2-eagle-tree": "smollm2-eagle-tree.npz",
}


def speculation_names() -> tuple[str, ...]:
    """Names of the shipped speculation traces (usable as `--acceptance NAME`)."""
    return tuple(_SPECULATION)


def builtin_speculation_path(name: str):
    """The packaged file of a shipped speculation trace (a Traversable path)."""
    if name not in _SPECULATION:
        known = ", ".join(speculation_names())
        raise TraceError(f"unknown shipped speculation trace {name!r}; known: {known}")
    return resources.files("traces") / "data" / "speculation" / _SPECULATION[name]

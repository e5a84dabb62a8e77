"""vLLM's per-iteration log lines (`--enable-logging-iteration-details`), as a table.

One line per engine step: requests and tokens of "context" (a prompt's first scheduling or its
chunks before any output) and "generation" (decode tokens, drafts included), and the step's
elapsed time on the engine (forward pass, sampling, n-gram proposal; not scheduling or output
processing). docs/vllm-v1-scheduler.md §10.1 says exactly what each count holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

ITERATION = re.compile(
    r"Iteration\((?P<iteration>\d+)\): (?P<context_requests>\d+) context requests, "
    r"(?P<context_tokens>\d+) context tokens, (?P<generation_requests>\d+) generation requests, "
    r"(?P<generation_tokens>\d+) generation tokens, iteration elapsed time: "
    r"(?P<elapsed_ms>[0-9.]+) ms(?P<dummy> \(dummy\))?")
COLUMNS = ("iteration", "context_requests", "context_tokens", "generation_requests",
           "generation_tokens", "elapsed_ms", "dummy")


def read_iterations(log: Path) -> pd.DataFrame:
    """Every iteration line of a server log, in order (dummy steps flagged, not dropped)."""
    rows = []
    for line in log.read_text(errors="replace").splitlines():
        match = ITERATION.search(line)
        if match:
            values = match.groupdict()
            rows.append({**{k: int(values[k]) for k in COLUMNS[:5]},
                         "elapsed_ms": float(values["elapsed_ms"]),
                         "dummy": values["dummy"] is not None})
    return pd.DataFrame(rows, columns=list(COLUMNS))

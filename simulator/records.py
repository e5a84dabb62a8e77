"""Per-request and per-step records of a simulation (and, with the same schema, of a live run).

Steps are collected in blocks: single iterations append tuples, the engine's multi-step fast path
appends whole numpy columns, and `steps_frame` stitches them in order.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_COLUMNS: tuple[str, ...] = (
    "replica",
    "start_s",
    "duration_s",
    "decode_seqs",  # requests that drafted/verified in this iteration
    "prefill_seqs",  # requests with prompt tokens in this iteration
    "prefill_tokens",
    "drafted",  # sum of k over decode requests
    "max_k",
    "accepted",  # sum of accepted drafts
    "emitted",  # tokens emitted by decode requests (accepted + 1 each, cut at max tokens)
    "waiting",  # queued at this replica when the iteration started
    "held",  # requests at this replica (queued, prefilling, decoding) when it started
    "kv_used_tokens",  # KV tokens reserved when the iteration started
)

REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id",
    "replica",
    "arrival_s",
    "admitted_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "steps",
    "drafted",
    "accepted",
)


class StepLog:
    """Append-only log of iterations, in the order they ran on each replica."""

    def __init__(self) -> None:
        self._blocks: list[list[tuple] | dict[str, np.ndarray]] = []
        self._rows: list[tuple] | None = None

    def add(self, *row: float) -> None:
        if self._rows is None:
            self._rows = []
            self._blocks.append(self._rows)
        self._rows.append(row)

    def add_block(self, columns: dict[str, np.ndarray]) -> None:
        self._rows = None
        self._blocks.append(columns)

    def frame(self) -> pd.DataFrame:
        """All iterations as one frame, ordered by start time (then replica)."""
        columns: dict[str, list[np.ndarray]] = {c: [] for c in STEP_COLUMNS}
        for block in self._blocks:
            if isinstance(block, list):
                arr = np.array(block, dtype=np.float64).reshape(-1, len(STEP_COLUMNS))
                for i, c in enumerate(STEP_COLUMNS):
                    columns[c].append(arr[:, i])
            else:
                for c in STEP_COLUMNS:
                    columns[c].append(np.asarray(block[c]))
        data = {}
        for c in STEP_COLUMNS:
            values = np.concatenate(columns[c]) if columns[c] else np.zeros(0)
            data[c] = values.astype(np.float64 if c in ("start_s", "duration_s") else np.int64)
        order = np.lexsort((data["replica"], data["start_s"]))
        return pd.DataFrame({c: v[order] for c, v in data.items()})


class RequestLog:
    """Fixed-size columns indexed by the request's position in the workload."""

    def __init__(self, n: int) -> None:
        self.replica = np.full(n, -1, dtype=np.int64)
        self.arrival_s = np.full(n, np.nan)
        self.admitted_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.steps = np.zeros(n, dtype=np.int64)
        self.drafted = np.zeros(n, dtype=np.int64)
        self.accepted = np.zeros(n, dtype=np.int64)

    def frame(self, request_ids, prompt_tokens, output_tokens) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "request_id": np.asarray(request_ids, dtype=np.int64),
                "replica": self.replica,
                "arrival_s": self.arrival_s,
                "admitted_s": self.admitted_s,
                "first_token_s": self.first_token_s,
                "finish_s": self.finish_s,
                "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
                "output_tokens": np.asarray(output_tokens, dtype=np.int64),
                "steps": self.steps,
                "drafted": self.drafted,
                "accepted": self.accepted,
            }
        )

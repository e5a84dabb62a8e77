"""Per-request and per-step records of a simulation (and, with the same schema, of a live run).

Steps are collected in blocks: single iterations append tuples, the engine's multi-step fast path
appends whole 2-D arrays, and `StepLog.frame` stitches them in order.
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

#: column positions, for building blocks
STEP_INDEX = {c: i for i, c in enumerate(STEP_COLUMNS)}
_FLOAT_COLUMNS = ("start_s", "duration_s")


class StepLog:
    """Append-only log of iterations, in blocks: tuples (one per iteration) or 2-D arrays."""

    def __init__(self) -> None:
        self._blocks: list[np.ndarray | list[tuple]] = []
        self._rows: list[tuple] | None = None

    def add(self, *row: float) -> None:
        if self._rows is None:
            self._rows = []
            self._blocks.append(self._rows)
        self._rows.append(row)

    def add_block(self, block: np.ndarray) -> None:
        """`block` has shape (len(STEP_COLUMNS), iterations): one row per column."""
        self._rows = None
        self._blocks.append(block)

    def frame(self) -> pd.DataFrame:
        """All iterations as one frame, ordered by start time, then replica.

        Built column-major with as few large temporaries as possible: at millions of
        iterations, allocating and touching memory is what costs.
        """
        width = len(STEP_COLUMNS)
        parts = [np.asarray(b, dtype=np.float64).reshape(-1, width).T
                 if isinstance(b, list) else b for b in self._blocks]
        table = np.concatenate(parts, axis=1) if parts else np.zeros((width, 0))
        start, replica = table[STEP_INDEX["start_s"]], table[STEP_INDEX["replica"]]
        step = np.diff(start)
        if np.any((step < 0) | ((step == 0) & (np.diff(replica) < 0))):
            table = table[:, np.lexsort((replica, start))]  # by start time, then replica
        ints = [c for c in STEP_COLUMNS if c not in _FLOAT_COLUMNS]
        frame = pd.DataFrame(table[[STEP_INDEX[c] for c in ints]].astype(np.int64).T,
                             columns=ints, copy=False)
        for c in _FLOAT_COLUMNS:
            frame.insert(STEP_INDEX[c], c, table[STEP_INDEX[c]])
        return frame


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

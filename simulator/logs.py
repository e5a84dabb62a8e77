"""Per-request and per-step records of a simulation (and, with the same schema, of a live run).

Steps are collected in blocks: single iterations append tuples, the engine's multi-step fast path
appends whole 2-D arrays, and `StepLog.frame` stitches them in order. A log that does not keep
its steps folds them into `StepTotals` as they come (what the summary needs), so memory stays
flat however long the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class StepTotals:
    """What the summary reads of the steps: iterations, request-steps (one request in one
    decode iteration), decode iterations, and the tokens emitted and drafted over them."""

    iterations: int = 0
    request_steps: int = 0
    decode_iterations: int = 0
    emitted: int = 0
    drafted: int = 0

    @classmethod
    def of(cls, table: np.ndarray) -> StepTotals:
        """Of a block (len(STEP_COLUMNS), iterations)."""
        decode = table[STEP_INDEX["decode_seqs"]]
        return cls(table.shape[1], int(decode.sum()), int(np.count_nonzero(decode > 0)),
                   int(table[STEP_INDEX["emitted"]].sum()),
                   int(table[STEP_INDEX["drafted"]].sum()))

    @classmethod
    def from_frame(cls, steps: pd.DataFrame) -> StepTotals:
        decode = steps["decode_seqs"].to_numpy()
        return cls(len(steps), int(decode.sum()), int(np.count_nonzero(decode > 0)),
                   int(steps["emitted"].to_numpy().sum()), int(steps["drafted"].to_numpy().sum()))

    def __add__(self, other: StepTotals) -> StepTotals:
        return StepTotals(*(a + b for a, b in zip(self.__dict__.values(),
                                                  other.__dict__.values())))


class StepLog:
    """Append-only log of iterations, in blocks: tuples (one per iteration) or 2-D arrays.

    `keep` False: the steps are folded into totals (every FOLD rows of single iterations, and
    each block as it comes) and `frame()` is empty. `sink`: the steps are streamed instead,
    in their final order, to `sink(frame)` as `flush` finds them final, and folded into totals;
    the buffer holds the rows that a replica could still precede."""

    FOLD = 65536

    def __init__(self, keep: bool = True,
                 sink: Callable[[pd.DataFrame], None] | None = None) -> None:
        self.keep = keep and sink is None
        self.sink = sink
        self._blocks: list[np.ndarray | list[tuple]] = []
        self._rows: list[tuple] | None = None
        self._folded = StepTotals()
        self._counts = [0, 0, 0, 0, 0]  # add_totals' sums, in StepTotals' order
        self._last_start: dict[int, float] = {}  # per replica, its latest start flushed or held

    def add(self, *row: float) -> None:
        if self._rows is None:
            self._rows = []
            self._blocks.append(self._rows)
        self._rows.append(row)
        if not self.keep and self.sink is None and len(self._rows) >= self.FOLD:
            self._fold()

    def add_block(self, block: np.ndarray) -> None:
        """`block` has shape (len(STEP_COLUMNS), iterations): one row per column."""
        self._rows = None
        if self.keep or self.sink is not None:
            self._blocks.append(block)
        else:
            self._fold()
            self._folded += StepTotals.of(block)

    @property
    def records_rows(self) -> bool:
        """Whether steps are kept or streamed (else only their totals are: a caller may then
        give `add_totals` what a block would have folded into)."""
        return self.keep or self.sink is not None

    def add_totals(self, iterations: int, request_steps: int, decode_iterations: int,
                   emitted: int, drafted: int) -> None:
        """The totals of a block not made (`records_rows` False): what `add_block` folds
        (counted in place: the fast path calls this once a segment; totals need no order, so
        the rows `add` holds stay until FOLD of them are folded)."""
        counts = self._counts
        counts[0] += iterations
        counts[1] += request_steps
        counts[2] += decode_iterations
        counts[3] += emitted
        counts[4] += drafted

    def _fold(self) -> None:
        for part in self._parts():
            self._folded += StepTotals.of(part)
        self._blocks, self._rows = [], None

    def _parts(self) -> list[np.ndarray]:
        width = len(STEP_COLUMNS)
        return [np.asarray(b, dtype=np.float64).reshape(-1, width).T
                if isinstance(b, list) else b for b in self._blocks]

    def totals(self) -> StepTotals:
        """The totals of every step logged so far."""
        total = self._folded + StepTotals(*self._counts)
        for part in self._parts():
            total += StepTotals.of(part)
        return total

    def flush(self, idle_since: dict[int, float | None]) -> None:
        """Stream the rows no replica can precede any more. Each replica logs its rows in start
        order, so a replica's next row starts no earlier than its latest, or than `now` for an
        idle one (`idle_since[r]`: now when replica r is idle, else None); rows starting before
        the least of those are final (`close` streams the rest at the end)."""
        if self.sink is None or not self._blocks:
            return
        table = _ordered(np.concatenate(self._parts(), axis=1))
        start, replica = table[STEP_INDEX["start_s"]], table[STEP_INDEX["replica"]]
        for r in idle_since:
            mine = start[replica == r]
            if len(mine):
                self._last_start[r] = float(mine[-1])
        watermark = min(now if now is not None else self._last_start.get(r, -np.inf)
                        for r, now in idle_since.items())
        self._stream(table, int(np.searchsorted(start, watermark, side="left")))

    def close(self) -> None:
        """Stream every row left (the run is over)."""
        if self.sink is not None and self._blocks:
            table = _ordered(np.concatenate(self._parts(), axis=1))
            self._stream(table, table.shape[1])

    def _stream(self, table: np.ndarray, final: int) -> None:
        """Hand the ordered `table`'s first `final` rows to the sink (and the totals); hold the
        rest."""
        if final:
            done = table[:, :final]
            self._folded += StepTotals.of(done)
            self.sink(_frame(done))
        self._blocks, self._rows = ([table[:, final:]] if final < table.shape[1] else []), None

    def frame(self) -> pd.DataFrame:
        """All iterations as one frame, ordered by start time, then replica (empty when the
        log does not keep its steps).

        Built column-major with as few large temporaries as possible: at millions of
        iterations, allocating and touching memory is what costs.
        """
        width = len(STEP_COLUMNS)
        parts = self._parts() if self.keep else []
        table = np.concatenate(parts, axis=1) if parts else np.zeros((width, 0))
        return _frame(_ordered(table))


def _ordered(table: np.ndarray) -> np.ndarray:
    """The rows by start time, then replica (stable: ties keep their log order)."""
    start, replica = table[STEP_INDEX["start_s"]], table[STEP_INDEX["replica"]]
    step = np.diff(start)
    if np.any((step < 0) | ((step == 0) & (np.diff(replica) < 0))):
        table = table[:, np.lexsort((replica, start))]
    return table


def _frame(table: np.ndarray) -> pd.DataFrame:
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

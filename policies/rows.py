"""Per-request state as rows of arrays, one row per request: where a policy's state lives while
the simulator's compiled runs of steps read and move it in place (simulator/stepped.py). A
request takes a row when first handed to a run and frees it when it finishes; the arrays grow
by doubling. `auto.StateRows` and kld_variance's `RequestRows` lay out their columns."""

from __future__ import annotations


class RowPool:
    """The rows' bookkeeping: which request holds which row, and the free ones. A subclass
    grows its arrays in `_extend`."""

    def __init__(self, rows: int) -> None:
        self.row_of: dict[int, int] = {}
        self._free: list[int] = []
        self.size = 0
        self._grow(rows)

    def _grow(self, rows: int) -> None:
        self._free += range(rows - 1, self.size - 1, -1)  # (taken from the end: lowest first)
        self._extend(self.size, rows)
        self.size = rows

    def _extend(self, n: int, rows: int) -> None:
        """Grow every column from n rows to `rows`, keeping the first n."""
        raise NotImplementedError

    def row(self, request_id: int) -> tuple[int, bool]:
        """The request's row, and whether it just took it (a new one to fill)."""
        row = self.row_of.get(request_id)
        if row is not None:
            return row, False
        if not self._free:
            self._grow(2 * self.size)
        row = self.row_of[request_id] = self._free.pop()
        return row, True

    def release(self, request_id: int) -> int | None:
        """Free the request's row (None: it has none); returns it, still holding its values
        until another request takes it."""
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self._free.append(row)
        return row

"""A pass's packed tokens [tokens, ...] and attention's [batch, max q, ...] layout, both ways:
the paged backends (paged_kv.py, paged_triton.py) attend in the padded layout."""

from __future__ import annotations

import torch


def pad_queries(queries: torch.Tensor, t: dict[str, torch.Tensor], batch: int,
                qmax: int) -> torch.Tensor:
    """Packed [tokens, heads, d] -> [batch, qmax, heads, d]. Without `padded_rows` the tokens
    are already in place (every request brings qmax); else token j goes to row padded_rows[j],
    and a CUDA graph's padding tokens to one scratch row past the end (rows past a request's
    q are 0)."""
    rows = t.get("padded_rows")
    if rows is None:
        return queries.view(batch, qmax, *queries.shape[1:])
    padded = queries.new_zeros(batch * qmax + 1, *queries.shape[1:])
    padded.index_copy_(0, rows, queries)
    return padded[: batch * qmax].view(batch, qmax, *queries.shape[1:])


def unpad_output(out: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """[batch, qmax, heads, d] -> packed [tokens, heads * d]: row `read_rows[j]` (or
    `padded_rows[j]`) for token j."""
    batch, qmax, heads, d = out.shape
    flat = out.reshape(batch * qmax, heads * d)
    rows = t.get("read_rows", t.get("padded_rows"))
    return flat if rows is None else flat.index_select(0, rows)

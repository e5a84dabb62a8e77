"""What the CLI jobs ask of torch itself (threads, dtypes, its version), here so that only the
torch packages import torch: a planner's install of spectune never needs it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: The dtype names the CLI takes: short ("fp32") or torch's own ("float32").
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_named(name: str) -> torch.dtype:
    """The torch dtype of a CLI name; a clear error for any other."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    return torch.tensor([], dtype=dtype).element_size()


def threads() -> int:
    """torch's intra-op thread count."""
    return torch.get_num_threads()


def set_threads(count: int) -> None:
    torch.set_num_threads(count)


@contextmanager
def threads_restored() -> Iterator[None]:
    """Whatever the body sets, torch's thread count is what it was afterwards."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def torch_version() -> str:
    return torch.__version__

"""Atomic file replacement: a crash mid-write never leaves a truncated trace behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from traces.errors import TraceError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """Yield a binary file in `path`'s directory; on success it replaces `path` in one step."""
    target = Path(path)
    if not target.parent.is_dir():
        raise TraceError(
            f"{target}: directory {str(target.parent)!r} does not exist; create it first"
        )
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp_name, _default_mode())  # mkstemp makes 0600; match an ordinary file
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def _default_mode() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask

"""What the commands share on the console: the torch check, a progress line on a terminal, and
the one line Ctrl-C prints."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable


def require_torch(command: str) -> None:
    """A clear error, not an ImportError traceback, when the torch extra is missing."""
    try:
        import models.runtime  # noqa: F401  (it imports torch)
    except ImportError:
        raise ValueError(f"spectune {command} needs torch: pip install -e '.[torch]'") from None


def progress_line(template: str) -> Callable[[int, int], None] | None:
    """A callback printing `template.format(done, total)` in place on stderr; None when stderr
    is not a terminal (logs and CI get no carriage-return noise)."""
    if not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        print("\r" + template.format(done, total), end="", file=sys.stderr)

    return report


def end_progress(report: Callable[[int, int], None] | None) -> None:
    if report is not None:
        print(file=sys.stderr)


class Resumable(KeyboardInterrupt):
    """Ctrl-C in a job that keeps its finished work (a profile's rounds): `kept` says what and
    where, for the one line the command prints."""

    def __init__(self, kept: str) -> None:
        super().__init__(kept)
        self.kept = kept


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """The one line Ctrl-C prints instead of a traceback: how much a cached run (an
    evaluate.Interrupted, carrying done/total/cache_dir) keeps, and that a rerun resumes."""
    lead = "\n" if sys.stderr.isatty() else ""  # off the progress bar's line and the ^C
    if isinstance(exc, Resumable):
        return f"{lead}interrupted; {exc.kept}: rerun the same command to resume"
    cache = getattr(exc, "cache_dir", None)
    if cache is None:
        return lead + "interrupted"
    done, total = getattr(exc, "done", 0), getattr(exc, "total", 0)
    return (f"{lead}interrupted; {done} of {total} simulations are cached in {cache}: "
            "rerun the same command to resume")


def seconds(value: float | None) -> str:
    """A duration for a person: "1.453 s", "95.2 ms", "1.0 us"; a negative one keeps its sign
    and its unit ("-1.660 s", never "-1,660.1 ms"); "-" where there is none."""
    if value is None or not math.isfinite(value):
        return "-"
    size = abs(value)
    if size >= 1 or size == 0:
        return f"{value:,.3f} s"
    if size >= 1e-3:
        return f"{value * 1e3:,.1f} ms"
    return f"{value * 1e6:,.1f} us"

"""The one exception type the traces package raises for bad input."""

from __future__ import annotations


class TraceError(ValueError):
    """A workload or speculation trace (or a spec string describing one) is unusable.

    Subclasses ValueError so generic callers still catch it; the message is one line saying what
    was wrong, where (file, line, column or request index) and what to do about it.
    """

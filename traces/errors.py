"""The one exception type the traces package raises for bad input."""

from __future__ import annotations


class TraceError(ValueError):
    """A workload or speculation trace (or a spec string describing one) is unusable.

    Subclasses ValueError so generic callers still catch it; the message is one line saying what
    was wrong, where (file, line, column or request index) and what to do about it.
    """


class UserNote(UserWarning):
    """Something the input did that a user should hear about although it is not an error (rows
    sorted by arrival, a request count above a trace's length). Raised with `warnings.warn`; the
    CLI prints each as one `spectune: note:` line."""

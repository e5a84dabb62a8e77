"""Helpers for tests that start spectune as a child process."""

from __future__ import annotations

import signal


def terminal_sigint() -> None:
    """Ctrl-C as a terminal's foreground job has it (a Popen preexec_fn): a test run started in
    the background without job control (`cmd &` in a script) inherits SIGINT ignored, and so
    would the child whose Ctrl-C a test checks."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

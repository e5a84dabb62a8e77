"""The local Ray's reaper: `python -m spectune.ray_reaper DRIVER_PID`, started by the run that
started Ray, in a session of its own (a terminal's Ctrl-C does not reach it).

While the driver lives it notes every process below it (Ray's servers, agents and workers, which
Ray spawns over time) with its start time. Its stdin is a pipe from the driver: "done" means Ray
was shut down, and it exits; end of file without it means the driver died without shutting Ray
down (killed outright), and it kills what it noted, where the process is still the same one.
Linux only (/proc); the local pool's workers get the same by PDEATHSIG.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from pathlib import Path

POLL_S = 0.5


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            kids += [int(k) for k in (task / "children").read_text().split()]
    return [k for kid in kids for k in (kid, *descendants(kid))]


def watch(driver: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me, seen = os.getpid(), {}
    while True:
        for pid in descendants(driver):
            if pid != me and pid not in seen:
                seen[pid] = start_time(pid)
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready:
            if sys.stdin.readline().strip() == "done":
                return 0
            break
    for pid, started in seen.items():
        if started is not None and start_time(pid) == started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1])))

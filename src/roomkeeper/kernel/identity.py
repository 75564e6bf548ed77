"""Which process a record names: its pid and its start time, so a reused pid is never it.

A pid alone is recycled by the kernel; the pair (pid, start time) names one
process for as long as the machine runs.  Records written by one process and
read by another (a batch's workspace rows) keep this pair and ask
:func:`identity_lives` before trusting that the writer still runs.
"""

from __future__ import annotations

import os

import psutil

# psutil's start times come in clock ticks (0.01 s), and an identity keeps two decimals.
START_TOLERANCE_S = 0.015


def process_identity(pid: int | None = None) -> str:
    """``"PID:START"`` for ``pid`` (this process when None)."""
    process = psutil.Process(os.getpid() if pid is None else pid)
    return f"{process.pid}:{process.create_time():.2f}"


def identity_lives(identity: str) -> bool:
    """Whether the process ``identity`` names still runs (a malformed one: it does not).

    A zombie does not: it has exited, and only its parent's reaping is left.
    """
    pid_text, _, started_text = identity.partition(":")
    try:
        process = psutil.Process(int(pid_text))
        same = abs(process.create_time() - float(started_text)) < START_TOLERANCE_S
        return same and process.status() != psutil.STATUS_ZOMBIE
    except (ValueError, psutil.Error):
        return False

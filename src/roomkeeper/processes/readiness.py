"""Waiting for a helper process to say it is ready: as long as it lives and makes progress.

A fixed deadline is wrong exactly when roomkeeper matters most: under the
memory pressure it exists for, a cold Python start can take far longer than
usual while it pages its code in.  A helper is waited for as long as it is
alive and making progress (its CPU time grows, or it waits on the disk);
only one that has died, or has made no progress at all for ``stall_s``, is
given up on, with a message that says which.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import time
from collections.abc import Callable

import psutil

from roomkeeper.errors import RoomkeeperError

log = logging.getLogger("roomkeeper")

STALL_S = 60.0  # no CPU time and no disk wait for this long: the helper is stuck
SAY_EVERY_S = 10.0  # a line while a slow start goes on, so nobody thinks it hung
_SLICE_S = 0.5


def await_ready(
    proc: subprocess.Popen[bytes],
    fd: int,
    token: bytes,
    *,
    what: str,
    stall_s: float = STALL_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Read ``fd`` until ``token`` arrives from ``proc``.

    Raises:
        RoomkeeperError: the helper exited, closed its output, or made no progress
            for ``stall_s``; the message says which (and the helper is killed).
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    data = b""
    started = progress_at = said_at = clock()
    last = _progress_mark(proc.pid)
    while not data.endswith(token):
        if poller.poll(_SLICE_S * 1000):
            chunk = os.read(fd, 64)
            if not chunk:
                _give_up(proc, _ended_early(proc, what))
            data += chunk
            continue
        if proc.poll() is not None:
            _give_up(proc, f"{what} exited (status {proc.returncode}) before it was ready")
        now = clock()
        mark = _progress_mark(proc.pid)
        if mark != last or mark == "waiting on disk":
            last, progress_at = mark, now
        elif now - progress_at >= stall_s:
            _give_up(proc, f"{what} made no progress for {stall_s:g} s and was stopped")
        if now - said_at >= SAY_EVERY_S:
            said_at = now
            log.info("still waiting for %s to start (%.0f s; it is alive)", what, now - started)


def _progress_mark(pid: int) -> object:
    """Something that changes while the process makes progress: its CPU time, or its wait."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_DISK_SLEEP:
                return "waiting on disk"
            times = process.cpu_times()
            return round(times.user + times.system, 2)
    except psutil.Error:
        return None


def _ended_early(proc: subprocess.Popen[bytes], what: str) -> str:
    """Why its output ended: it exited (and how), or it closed the pipe and lives on."""
    try:
        code = proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return f"{what} closed its output before it was ready"
    return f"{what} exited (status {code}) before it was ready"


def _give_up(proc: subprocess.Popen[bytes], message: str) -> None:
    if proc.poll() is None:
        proc.kill()  # our own helper: never left behind
    proc.wait()
    if proc.stdin is not None:
        proc.stdin.close()
    raise RoomkeeperError(f"{message}; see its stderr")

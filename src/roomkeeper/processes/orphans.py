"""Orphans of managed jobs: made ours as a subreaper, reaped when their job is closed.

A job's descendant whose parent exits is reparented to the nearest
subreaper, so with :func:`become_subreaper` its tree can still be walked,
and its zombie is ours to reap once the job is closed
(:func:`reap_orphans`).  Moved out of :mod:`roomkeeper.processes.process`,
unchanged, before that module grew suspension and sampled peaks.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Iterable

import psutil

from roomkeeper.kernel.proc import PR_SET_CHILD_SUBREAPER, prctl, scan_proc

_subreaper = False  # whether become_subreaper() made orphans ours to reap
# Sessions of closed jobs: an adopted zombie in one of them is ours to reap.
_job_sessions: collections.deque[int] = collections.deque(maxlen=4096)
_ADOPTED_SCAN_EVERY_S = 1.0
_last_adopted_scan = 0.0
_adopted_lock = threading.Lock()


def _zombie_children() -> bool:
    """Whether any child of ours waits to be reaped (a peek that reaps nothing, ~2 us)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # no children at all
        return False


def _reap_adopted() -> None:
    """Reap orphans of closed jobs that were reparented to us (subreaper) and died.

    A zombie keeps its session id, which tells a job's orphan from any other
    child of ours.  Scanning /proc costs about 0.5 ms, so it runs at most
    once a second, not at every close: a zombie costs a pid slot, nothing else.
    """
    global _last_adopted_scan  # noqa: PLW0603 -- one scan clock per process
    with _adopted_lock:
        now = time.monotonic()
        if now - _last_adopted_scan < _ADOPTED_SCAN_EVERY_S:
            return
        _last_adopted_scan = now
        sessions = set(_job_sessions)
    me = os.getpid()
    for pid, stat in scan_proc().items():
        if stat.ppid == me and stat.state == "Z" and stat.sid in sessions and pid not in sessions:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def become_subreaper(enable: bool = True) -> bool:
    """Make this process a child subreaper; returns whether the kernel agreed.

    Orphans of a job are then reparented to us instead of to init, so the
    tree can still be walked.  The scheduler calls it once; the orphans it
    adopts are reaped when their job is closed.
    """
    global _subreaper  # noqa: PLW0603 -- mirrors a per-process kernel flag
    try:
        prctl(PR_SET_CHILD_SUBREAPER, int(enable))
    except (OSError, AttributeError):  # not Linux, or a libc without prctl
        return False
    _subreaper = enable
    return True


def reap_orphans(session: int, members: Iterable[psutil.Process]) -> None:
    """A job (leader ``session``) was closed: reap its orphans that came to us, if any did."""
    _job_sessions.append(session)
    if not _subreaper:
        return
    for proc in members:  # orphans we saw: reaped now, cheaply
        # is_running() compares create times: never reap a reused pid.
        with contextlib.suppress(ChildProcessError, psutil.Error):
            if proc.is_running():
                os.waitpid(proc.pid, os.WNOHANG)
    if _zombie_children():
        _reap_adopted()  # orphans never seen: a rate-limited /proc scan

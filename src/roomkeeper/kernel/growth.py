"""Which of the container's processes grew: resident memory now against a first look.

When memory is not given back after work ends, the question is who holds
it.  :class:`ProcessGrowth` looks at the container's processes once (the
gateway's start) and, when asked, ranks them by how much their resident
set grew since: a process started later grew by all it holds.  A process is
known by its pid *and* its start time, so a pid reused since is a new
process, never a grown one.

The container's processes are the members of its cgroup and every child
group, or every process ``/proc`` lists where there is no cgroup.  The
caller says which to leave out (our own jobs: their sessions, their job
groups).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from roomkeeper.kernel.host import PROC_ROOT
from roomkeeper.kernel.proc import cgroup_members

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class Grown:
    """One process and how much its resident memory grew.

    Attributes:
        pid: its pid.
        name: its name as the kernel keeps it (``comm``, at most 15 characters).
        bytes: resident memory gained since the first look (all it holds if it started
            since).
    """

    pid: int
    name: str
    bytes: int


@dataclass(frozen=True, slots=True)
class _Seen:
    start: int  # clock ticks after boot: with the pid, names one process
    sid: int
    rss: int
    name: str


def _look(pid: int, proc_root: str) -> _Seen | None:
    """One process's start, session, resident set and name; None once it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"{proc_root}/{pid}/statm", "rb") as f:
            resident = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    head, _, tail = stat.rpartition(b")")
    fields = tail.split()
    try:
        # After the name: state(3) ppid pgrp session(6) ... starttime(22).
        return _Seen(
            int(fields[19]), int(fields[3]), resident * PAGE, head.partition(b"(")[2].decode()
        )
    except (IndexError, ValueError):
        return None


class ProcessGrowth:
    """The container's processes, ranked by growth since :meth:`start`.

    Args:
        container: the container's cgroup directory now (None: the machine is the
            container, every process counts).
        proc_root: where ``/proc`` is.
    """

    def __init__(self, container: Callable[[], str | None], *, proc_root: str = PROC_ROOT) -> None:
        self._container = container
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._first: dict[tuple[int, int], int] = {}  # (pid, start) -> resident bytes

    def _pids(self) -> set[int]:
        directory = self._container()
        if directory is not None:
            return cgroup_members(directory)
        try:
            return {int(n) for n in os.listdir(self._proc_root) if n.isdigit()}
        except OSError:  # no /proc (not Linux): nothing to rank
            return set()

    def start(self) -> None:
        """Take the first look: every process's resident memory now."""
        first = {}
        for pid in self._pids():
            seen = _look(pid, self._proc_root)
            if seen is not None:
                first[(pid, seen.start)] = seen.rss
        with self._lock:
            self._first = first

    def ranking(
        self,
        *,
        sessions: Iterable[int] = (),
        leave_out: Callable[[int], bool] = lambda pid: False,
        most: int = 10,
    ) -> list[Grown]:
        """The ``most`` processes that grew most, largest first (none that shrank).

        Args:
            sessions: sessions to leave out (our jobs' leaders start their own).
            leave_out: any other process to leave out, by pid (a job group's member).
            most: how many to list.
        """
        skip = set(sessions)
        with self._lock:
            first = dict(self._first)
        found = []
        for pid in self._pids():
            seen = _look(pid, self._proc_root)
            if seen is None or seen.sid in skip or leave_out(pid):
                continue
            grew = seen.rss - first.get((pid, seen.start), 0)
            if grew > 0:
                found.append(Grown(pid, seen.name, grew))
        found.sort(key=lambda g: g.bytes, reverse=True)
        return found[:most]


def in_group_named(pid: int, fragment: str, proc_root: str = PROC_ROOT) -> bool:
    """Whether any of the process's cgroup paths contains ``fragment`` (a job group's name)."""
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            return fragment in f.read()
    except OSError:
        return False

"""Processes as ``/proc`` and cgroups list them: who is in a tree, and how to kill a group.

These read ``/proc`` directly, without psutil, so that the lifeline helper's
kill path loads nothing else; the process trees above share them.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from roomkeeper.kernel.host import PROC_ROOT

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that place a process in a tree."""

    state: str  # "Z" for a zombie: dead, only its exit status is left
    ppid: int
    pgid: int
    sid: int


def prctl(option: int, arg: int) -> None:
    """Call Linux's prctl(2) through libc; raises OSError where it fails or does not exist."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def read_stat(pid: int, proc_root: str = PROC_ROOT) -> ProcStat | None:
    """One process's place in the tree, None when it no longer exists."""
    try:  # os.open/os.read: a /proc scan reads ~100 of these; buffered io doubles its cost
        fd = os.open(f"{proc_root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ")".
    fields = raw.rpartition(b")")[2].split()
    return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]))


def scan_proc(proc_root: str = PROC_ROOT) -> dict[int, ProcStat]:
    """Every process on the machine (about 1 ms for 70 processes)."""
    table: dict[int, ProcStat] = {}
    for name in os.listdir(proc_root):
        if name.isdigit() and (stat := read_stat(int(name), proc_root)) is not None:
            table[int(name)] = stat
    return table


SHARED_SCAN_SECONDS = 0.05  # a walk of /proc this recent serves every tree measured now


class _SharedScan:
    """The latest walk of ``/proc`` and when it was taken (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: tuple[float, str, dict[int, ProcStat]] | None = None

    def get(self, proc_root: str, max_age_s: float) -> dict[int, ProcStat]:
        with self._lock:
            now = time.monotonic()
            latest = self._latest
            if latest is not None and latest[1] == proc_root and now - latest[0] < max_age_s:
                return latest[2]
            table = scan_proc(proc_root)
            self._latest = (now, proc_root, table)
            return table


_SHARED = _SharedScan()


def recent_scan(
    proc_root: str = PROC_ROOT, *, max_age_s: float = SHARED_SCAN_SECONDS
) -> dict[int, ProcStat]:
    """The machine's processes, walked again only when the last walk is older than
    ``max_age_s``: a reading that measures many trees without job groups (the pressure
    monitor's, every 100 ms) then costs one walk of ``/proc``, not one per tree.

    Membership may be that old; what each member holds is read fresh by the caller.
    """
    return _SHARED.get(proc_root, max_age_s)


def cgroup_members(directory: str) -> set[int]:
    """Every pid in a cgroup and its child groups; empty when the group is gone."""
    pids: set[int] = set()
    try:
        with open(f"{directory}/cgroup.procs", "rb") as file:
            pids.update(int(token) for token in file.read().split())
        children = [entry.path for entry in os.scandir(directory) if entry.is_dir()]
    except OSError:
        return pids
    for child in children:
        pids |= cgroup_members(child)
    return pids


def tree_members(
    table: dict[int, ProcStat], sid: int, cgroup_dir: str | None, seeds: Iterable[int] = ()
) -> set[int]:
    """The pids of one job's tree, zombies included.

    A member is in the job's session or process group, in its cgroup, one of
    the ``seeds`` (members seen earlier), or a descendant of any of those:
    a grandchild that called setsid() is found through its living parent.
    """
    members = {pid for pid, stat in table.items() if sid in (stat.sid, stat.pgid)}
    if cgroup_dir is not None:
        members |= cgroup_members(cgroup_dir)
    members.update(seeds)
    members = {pid for pid in members if pid > 1}  # never init, nor everything below it
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat.ppid, []).append(pid)
    stack = list(members)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in members:
                members.add(child)
                stack.append(child)
    members.discard(os.getpid())  # never ourselves, whatever a stale pid says
    return members


def kill_cgroup(directory: str) -> bool:
    """SIGKILL a whole v2 cgroup at once through ``cgroup.kill`` (Linux 5.14); False without it."""
    try:
        fd = os.open(f"{directory}/cgroup.kill", os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True

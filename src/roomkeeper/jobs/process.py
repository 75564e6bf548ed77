"""Managed processes: one job, one process tree, stopped whole (seed 002).

A :class:`ManagedProcess` is a running job's tree, started by
:func:`roomkeeper.jobs.launch.launch`.  Where the job has its own memory cgroup,
the group measures its footprint and finds every member, however it tried
to leave; without one, the tree is found through ``/proc`` and psutil
measures it.  :func:`become_subreaper` makes a job's orphans ours, so that
closing the job can reap them.

The leader is never reaped before :meth:`ManagedProcess.close`: its exit
status is read with ``WNOWAIT``, so its pid, which is also the process group
and session id, cannot be reused while we might still signal it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from roomkeeper.errors import KernelFileError, LaunchError
from roomkeeper.jobs.lifeline import (
    Lifeline,
    cgroup_members,
    kill_cgroup,
    scan_proc,
    tree_members,
)
from roomkeeper.jobs.orphans import become_subreaper, reap_orphans
from roomkeeper.kernel.job_cgroups import JobCgroup, create_job_cgroup, job_cgroup_parent

__all__ = [
    "JobCgroup",
    "LaunchError",
    "Lifeline",
    "ManagedProcess",
    "ProcessStatistics",
    "become_subreaper",
    "create_job_cgroup",
    "job_cgroup_parent",
]

_KILL_ROUNDS = 100


@dataclass(frozen=True, slots=True)
class ProcessStatistics:
    """A snapshot of a :class:`ManagedProcess`; ``members`` counts descendants remembered."""

    job_id: str
    pid: int
    returncode: int | None
    cgroup_dir: str | None
    cgroup_note: str | None  # why the job has no cgroup, or why it could not be removed
    members: int
    peak_bytes: int
    closed: bool


class ManagedProcess:
    """A running job's tree; made by :func:`roomkeeper.jobs.launch.launch`.

    Attributes:
        job_id: the scheduler's name for the job.
        pid: the leader's pid, which is also its session and process group id.
        started_at: ``time.monotonic()`` just after the spawn.
        log_path: where stdout and stderr went.
        cgroup_dir: the job's own memory cgroup, None when none could be made.
    """

    def __init__(
        self,
        job_id: str,
        popen: subprocess.Popen[bytes],
        *,
        log_path: str,
        cgroup: JobCgroup | str,
        lifeline: Lifeline | None,
    ) -> None:
        self.job_id, self.pid, self.log_path = job_id, popen.pid, log_path
        self.started_at = time.monotonic()
        self._cgroup = cgroup if isinstance(cgroup, JobCgroup) else None
        self.cgroup_dir = None if self._cgroup is None else self._cgroup.directory
        self.cgroup_note = cgroup if isinstance(cgroup, str) else None
        self._popen, self._lifeline, self._lock = popen, lifeline, threading.RLock()
        self._returncode: int | None = None
        self._peak = 0
        self._members: dict[int, psutil.Process] = {}  # remembered while they ran
        self._closed = False
        try:  # a pidfd names this process and no later one with the same pid
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def poll(self) -> int | None:
        """The leader's exit code (negative: the signal that killed it), None while it runs."""
        if self._returncode is None:
            try:  # WNOWAIT: learn the status, leave the zombie holding the pid
                result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # someone else reaped it
                self._returncode = self._popen.poll()
                return self._returncode
            if result is not None:
                killed = result.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                self._returncode = -result.si_status if killed else result.si_status
        return self._returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the leader to exit; its exit code, or None when ``timeout`` passed first."""
        if self.poll() is not None or self._closed:
            return self._returncode
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)  # readable once the process exits
            poller.poll(None if timeout is None else max(0.0, timeout) * 1000)
            return self.poll()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.005)
        return self._returncode

    def refresh(self) -> list[psutil.Process]:
        """Find the tree's live members besides the leader, and remember them.

        A descendant that leaves the session and loses its parent can be found
        later only if it was seen here (or is in the job's cgroup), so a
        scheduler without cgroups calls this now and then (footprint_bytes does).
        """
        if self._cgroup is not None:
            # Every descendant joined the group before it could fork (the
            # trampoline), and only a privileged process can move one out.
            table, pids = {}, cgroup_members(self._cgroup.directory)
        else:
            table = scan_proc()
            seeds = [pid for pid, proc in self._members.items() if proc.is_running()]
            pids = tree_members(table, self.pid, None, seeds)
        pids.discard(self.pid)
        live: list[psutil.Process] = []
        for pid in pids:
            if pid in table and table[pid].state == "Z":
                continue
            proc = self._members.get(pid)
            if proc is None or not proc.is_running():  # new, or its pid was reused
                try:
                    proc = self._members[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            live.append(proc)
        return live

    def footprint_bytes(self) -> int:
        """Memory the job holds now that the kernel cannot give back (cgroup, else RSS sum)."""
        value: int | None = None
        if self._cgroup is not None and not self._closed:
            try:
                value = self._cgroup.footprint_bytes()
            except (OSError, KernelFileError):
                value = None  # the group is going away; measure the processes instead
        if value is None:
            value = 0
            members = [] if self._closed else self.refresh()
            if self.poll() is None:  # unreaped until close(): its pid is not reused
                members.append(psutil.Process(self.pid))
            for proc in members:
                try:
                    value += proc.memory_info().rss
                except psutil.Error:
                    continue
        self._peak = max(self._peak, value)
        return value

    def peak_bytes(self) -> int:
        """The highest footprint seen: the kernel's mark where kept, else our samples."""
        kernel = None if self._cgroup is None or self._closed else self._cgroup.peak_bytes()
        return max(self._peak, kernel or 0)

    def stop(
        self,
        grace: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int | None:
        """Stop the whole tree: SIGTERM to all, up to ``grace`` seconds, then SIGKILL the rest.

        Returns:
            the leader's exit code.
        """
        with self._lock:
            if self._closed:
                return self._returncode
            members = self.refresh()
            self._signal(signal.SIGTERM, members)
            deadline, step = clock() + grace, 0.001
            while (left := deadline - clock()) > 0 and self._alive(members):
                sleep(min(step, left))
                step = min(step * 2, 0.05)
            for _ in range(_KILL_ROUNDS):  # a member may fork between listing and signal
                members = self.refresh()
                if self.poll() is not None and not members:
                    break
                self._signal(signal.SIGKILL, members)
                sleep(0.002)
            return self.wait(timeout=5.0)

    def close(self) -> None:
        """Kill what is left of the tree, reap it, remove its cgroup, leave the lifeline.

        Idempotent.  Call :meth:`stop` first for a graceful end: whatever still
        runs here gets SIGTERM and at once SIGKILL.
        """
        with self._lock:
            if self._closed:
                return
            if self.poll() is None or self.refresh():
                self.stop(grace=0.0)
            if self._cgroup is not None and not self._cgroup.remove():
                self.cgroup_note = f"{self._cgroup.directory} could not be removed"
            if self._lifeline is not None:
                self._lifeline.unregister(self.pid)
            self._popen.wait()  # from here on the pid may be reused
            self._returncode = self._popen.returncode
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
            self._closed = True
            reap_orphans(self.pid, self._members.values())

    def statistics(self) -> ProcessStatistics:
        """A snapshot of the job's state."""
        return ProcessStatistics(
            self.job_id,
            self.pid,
            self.poll() if not self._closed else self._returncode,
            self.cgroup_dir,
            self.cgroup_note,
            len(self._members),
            self.peak_bytes(),
            self._closed,
        )

    def _alive(self, members: list[psutil.Process]) -> bool:
        if self.poll() is None:
            return True
        for proc in members:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
            except psutil.Error:
                continue
        return False

    def _signal(self, sig: int, members: list[psutil.Process]) -> None:
        if self.poll() is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):  # it exited just now
                signal.pidfd_send_signal(self._pidfd, sig)
        # Safe without a pidfd too: the unreaped leader keeps its pid, hence the group id.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        if sig == signal.SIGKILL and self._cgroup is not None and self._cgroup.version == 2:
            kill_cgroup(self._cgroup.directory)
        for proc in members:
            try:
                if proc.is_running():  # psutil compares create times: no reused pid
                    proc.send_signal(sig)
            except psutil.Error:
                continue

"""Managed processes: one job, one process tree, stopped whole.

A :class:`ManagedProcess` is a running job's tree, started by
:func:`roomkeeper.processes.launch.launch`.  Where the job has its own memory cgroup,
the group measures its footprint and finds every member, however it tried
to leave; without one, the tree is found through ``/proc`` and psutil
measures it.  Its peak says how it was taken (:mod:`roomkeeper.processes.peaks`
samples what the kernel does not keep).  The whole tree can be suspended
and resumed (:mod:`roomkeeper.kernel.freezer`'s three ways).
:func:`~roomkeeper.processes.orphans.become_subreaper` makes a job's orphans
ours, so that closing the job can reap them.

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

from roomkeeper.errors import KernelFileError, SuspendError
from roomkeeper.kernel.freezer import FREEZE_TIMEOUT_S, FreezeMethod, FreezerGroup
from roomkeeper.kernel.job_cgroups import JobCgroup
from roomkeeper.kernel.proc import (
    ProcStat,
    cgroup_members,
    kill_cgroup,
    scan_proc,
    tree_members,
)
from roomkeeper.processes.lifeline import Lifeline
from roomkeeper.processes.orphans import reap_orphans
from roomkeeper.processes.peaks import MemoryPeak, PeakMethod, sampler, tree_footprint
from roomkeeper.processes.suspension import Suspension

__all__ = ["ManagedProcess", "ProcessStatistics"]

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
    peak_method: PeakMethod = PeakMethod.SAMPLED
    freezer_dir: str | None = None
    suspended: FreezeMethod | None = None  # how the tree is suspended now, None while it runs


class ManagedProcess:
    """A running job's tree; made by :func:`roomkeeper.processes.launch.launch`.

    Attributes:
        job_id: the scheduler's name for the job.
        pid: the leader's pid, which is also its session and process group id.
        started_at: ``time.monotonic()`` just after the spawn.
        log_path: where stdout and stderr went.
        cgroup_dir: the job's own memory cgroup, None when none could be made.
        freezer_dir: the job's own v1 freezer group, None without one.
    """

    def __init__(
        self,
        job_id: str,
        popen: subprocess.Popen[bytes],
        *,
        log_path: str,
        cgroup: JobCgroup | str,
        lifeline: Lifeline | None,
        freezer_group: FreezerGroup | None = None,
    ) -> None:
        self.job_id, self.pid, self.log_path = job_id, popen.pid, log_path
        self.started_at = time.monotonic()
        self._cgroup = cgroup if isinstance(cgroup, JobCgroup) else None
        self.cgroup_dir = None if self._cgroup is None else self._cgroup.directory
        self.cgroup_note = cgroup if isinstance(cgroup, str) else None
        self._freezer = freezer_group
        self.freezer_dir = None if freezer_group is None else freezer_group.directory
        self._popen, self._lifeline, self._lock = popen, lifeline, threading.RLock()
        self._returncode: int | None = None
        self._peak = 0
        self._kernel_peak: int | None = None  # memory.peak, kept when the group is removed
        self._latest: int | None = None  # the latest footprint measured
        self._members: dict[int, psutil.Process] = {}  # remembered while they ran
        self._closed = False
        try:  # a pidfd names this process and no later one with the same pid
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self._pidfd = None
        self._kernel_keeps_peak = (
            self._cgroup is not None
            and self._cgroup.version == 2
            and (self._cgroup.peak_bytes() is not None)
        )
        if not self._kernel_keeps_peak:
            sampler.add(self)
        self._suspension = Suspension(
            job_id,
            cgroup=self._cgroup,
            freezer_group=freezer_group,
            members=self._tree_pids,
            send=self._send,
            known=self._known_pids,
        )

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

    def refresh(self, table: dict[int, ProcStat] | None = None) -> list[psutil.Process]:
        """Find the tree's live members besides the leader, and remember them.

        A descendant that leaves the session and loses its parent can be found
        later only if it was seen here (or is in the job's cgroup), so a
        tree without a cgroup is sampled now and then (:mod:`roomkeeper.processes.peaks`).

        Args:
            table: the machine's processes (:func:`scan_proc`), when just read.
        """
        with self._lock:
            if self._cgroup is not None:
                # Every descendant joined the group before it could fork (the job's first
                # shell joins it), and only a privileged process can move one out.
                table, pids = {}, cgroup_members(self._cgroup.directory)
            else:
                table = scan_proc() if table is None else table
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

    # ----------------------------------------------------------------- memory

    @property
    def needs_process_table(self) -> bool:
        """Whether a sample reads the machine's process table (a tree without a group)."""
        return self._cgroup is None

    def _measure(self, table: dict[int, ProcStat] | None = None) -> int:
        """The footprint now: the group's usage less file cache, else the tree's anonymous RSS."""
        if self._cgroup is not None:
            try:
                return self._cgroup.footprint_bytes()
            except (OSError, KernelFileError):
                pass  # the group is going away; measure the processes instead
        if table is None:
            # A reading between samples (the pressure monitor's, a launch round's) measures
            # the members the sampler found: a walk of /proc reads a file per process on
            # the machine and, beside busy threads, each read waits its turn for the
            # interpreter lock (seconds in all on a slow machine).  A stop or a
            # suspension walks afresh (refresh() without a table).
            # is_running() compares start times: a pid reused since is never counted.
            members = [p for p in self._members.values() if p.pid != self.pid and p.is_running()]
        else:
            members = self.refresh(table)
        if self.poll() is None:  # unreaped until close(): its pid is not reused
            with contextlib.suppress(psutil.Error):
                members.append(psutil.Process(self.pid))
        return tree_footprint(members)

    def _record(self, value: int) -> int:
        self._peak = max(self._peak, value)
        self._latest = value
        return value

    def sample(self, table: dict[int, ProcStat] | None) -> bool:
        """Take one sample for the peak (the sampler's call); False once the tree has ended."""
        if not self._lock.acquire(blocking=False):
            return True  # stopping or closing right now: the next round samples
        try:
            if self._closed or self.poll() is not None:
                return False
            self._record(self._measure(table))
            return True
        finally:
            self._lock.release()

    def footprint_bytes(self) -> int:
        """Memory the job holds now that the kernel cannot give back (cgroup, else tree).

        Measured now, the way the sampler measures for the peak, and kept as
        a sample: the guard's young-job reservations see the same figure the
        peak is made of.  While another thread holds the tree (a stop, a
        close, a suspension, or the sampler's round), the latest sample.
        """
        if self._closed or not self._lock.acquire(blocking=False):
            return self._latest or 0
        try:
            return self._record(self._measure())
        finally:
            self._lock.release()

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user and system) the tree used so far; None once it is closed, or
        while another thread holds the tree (a stop, a close, a suspension, or the
        sampler's round): never waited for, so the caller's thread never blocks on them.

        A v2 job group counts every process that was ever in it.  Otherwise the
        leader and the members found now, each with its reaped children: a member
        reaped by a process outside the tree takes its seconds with it, so the
        figure can step down (a rate read from it is never below zero).
        """
        if self._closed or not self._lock.acquire(blocking=False):
            return None  # closed, or another thread holds the tree: never waited for
        try:
            if self._closed:
                return None
            if self._cgroup is not None:
                counted = self._cgroup.cpu_seconds()
                if counted is not None:
                    return counted
            # A group's members are one read away; without a group, those the sampler found
            # (a walk of /proc for each reading would cost the scheduler's lock too much).
            procs = (
                self.refresh()
                if self._cgroup is not None
                else [p for p in self._members.values() if p.is_running()]
            )
            with contextlib.suppress(psutil.Error):  # the leader is ours until closed: no reuse
                procs.append(psutil.Process(self.pid))
            total = 0.0
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    total += times.user + times.system + times.children_user + times.children_system
            return total
        finally:
            self._lock.release()

    def peak(self) -> MemoryPeak:
        """The highest memory the tree held, and how that was taken.

        A v2 job group's ``memory.peak`` where the kernel keeps one (file
        cache included); else the highest of the samples, taken every
        :data:`~roomkeeper.processes.peaks.SAMPLE_SECONDS` from the v1 group
        (less file cache) or from the tree's processes.
        """
        if self._kernel_keeps_peak and self._cgroup is not None:
            kernel = self._kernel_peak if self._closed else self._cgroup.peak_bytes()
            if kernel is not None:
                return MemoryPeak(kernel, PeakMethod.KERNEL)
        method = PeakMethod.SAMPLED_CGROUP if self._cgroup is not None else PeakMethod.SAMPLED
        return MemoryPeak(self._peak, method)

    def peak_bytes(self) -> int:
        """The bytes of :meth:`peak`."""
        return self.peak().bytes

    # ------------------------------------------------------------- suspension

    @property
    def local(self) -> bool:
        """Always: the tree runs here, in this container's reading."""
        return True

    @property
    def suspendable(self) -> bool:
        """Always: a tree here can be frozen (its group) or stopped by signals."""
        return True

    def settlement(self) -> None:
        """None: a tree here always ends with an exit status of its own."""
        return None

    def halt(self) -> None:
        """SIGSTOP the processes of the tree known already, without a walk of ``/proc``, where
        the tree is suspended by signals; :meth:`suspend` must follow (it finds the rest,
        and a failed one lets these go on too)."""
        with self._lock:
            if not self._closed:
                self._suspension.halt()

    def suspend(self, *, timeout: float = FREEZE_TIMEOUT_S) -> FreezeMethod:
        """Suspend the whole tree; returns how.  Idempotent: a suspended tree stays so.

        The job's v2 group is frozen (``cgroup.freeze``), else its v1
        freezer group, else every process of the tree gets SIGSTOP, a
        descendant that left the process group included.  A suspended tree
        uses no CPU and its memory stops growing; :meth:`resume` lets it go on.

        Raises:
            SuspendError: it would not stop within ``timeout`` seconds, or the
                kernel refused; the tree was let go on.
        """
        with self._lock:
            if self._closed and self._suspension.method is None:
                raise SuspendError(self.job_id, "it has ended and been closed")
            return self._suspension.suspend(timeout)

    def resume(self) -> FreezeMethod | None:
        """Let a suspended tree go on; returns how it had been suspended, None if it was not.

        Idempotent: resuming a running tree does nothing (it sends no SIGCONT).

        Raises:
            SuspendError: the kernel refused to thaw the group (the tree stays suspended).
        """
        with self._lock:
            return self._suspension.resume()

    @property
    def suspended(self) -> FreezeMethod | None:
        """How the tree is suspended now, None while it runs."""
        return self._suspension.method

    def _known_pids(self) -> set[int]:
        """The unreaped leader and the members seen so far, without a walk of ``/proc``."""
        pids = set(self._members)
        if self.poll() is None:
            pids.add(self.pid)
        return pids

    def _tree_pids(self) -> set[int]:
        """Every live member and the unreaped leader."""
        pids = {proc.pid for proc in self.refresh()}
        if self.poll() is None:
            pids.add(self.pid)
        return pids

    def _send(self, pid: int, sig: int) -> None:
        """Signal one member, never a process that took a member's pid since it was seen."""
        if pid == self.pid:  # unreaped: its pid cannot have been reused
            os.kill(pid, sig)
            return
        proc = self._members.get(pid)
        try:
            if proc is None or not proc.is_running():  # psutil compares create times
                raise ProcessLookupError(pid)
            proc.send_signal(sig)
        except psutil.NoSuchProcess as err:
            raise ProcessLookupError(pid) from err
        except psutil.AccessDenied as err:  # a setuid member: the suspension fails cleanly
            raise PermissionError(f"pid {pid}: {err}") from err

    # ---------------------------------------------------------------- ending

    def stop(
        self,
        grace: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> int | None:
        """Stop the whole tree: SIGTERM to all, up to ``grace`` seconds, then SIGKILL the rest.

        A suspended tree is resumed just after its SIGTERM, so it dies of
        that signal instead of running on first (and a v1-frozen task could
        not die of SIGKILL at all).

        Returns:
            the leader's exit code.
        """
        with self._lock:
            if self._closed:
                return self._returncode
            members = self.refresh()
            self._signal(signal.SIGTERM, members)
            self._suspension.resume_quietly(listed={p.pid for p in members} | {self.pid})
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
        """Kill what is left of the tree, reap it, remove its cgroups, leave the lifeline.

        Idempotent.  Call :meth:`stop` first for a graceful end: whatever still
        runs here gets SIGTERM and at once SIGKILL.
        """
        with self._lock:
            if self._closed:
                return
            if not self._gone_with_groups():
                if self.poll() is None or self.refresh():
                    self.stop(grace=0.0)
                self._remove_groups()
            self._suspension.forget()  # the groups are gone, the processes dead
            if self._lifeline is not None:
                self._lifeline.unregister(self.pid)
            self._popen.wait()  # from here on the pid may be reused
            self._returncode = self._popen.returncode
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
            self._closed = True
            sampler.discard(self)
            reap_orphans(self.pid, self._members.values())

    def _gone_with_groups(self) -> bool:
        """Whether the leader has exited and the job's groups could be removed at once.

        The kernel removes a group only when no process is left in it, so one
        rmdir each says that nothing of the tree runs on, for less than reading
        the members (a batch of short jobs closes hundreds a second).  On a
        refusal, :meth:`close` lists the memory group's members and stops them
        as before, then removes the groups with :meth:`_remove_groups`.
        """
        if self._cgroup is None or self.poll() is None:
            return False  # without a memory group, only a look at the processes can tell
        self._keep_kernel_peak()
        if not self._cgroup.remove(attempts=1):
            return False
        return self._freezer is None or self._freezer.remove(attempts=1)

    def _keep_kernel_peak(self) -> None:
        """Read the kernel's peak while the group is there: the highest of the readings (a tree
        stopped after a refused rmdir may have grown since the first)."""
        if self._kernel_keeps_peak and self._cgroup is not None:
            now = self._cgroup.peak_bytes()  # None once the group is gone
            if now is not None:
                self._kernel_peak = max(now, self._kernel_peak or 0)

    def _remove_groups(self) -> None:
        """Keep the kernel's peak, then remove the job's groups (noting one that stays)."""
        if self._cgroup is not None:
            self._keep_kernel_peak()
            if not self._cgroup.remove():
                self.cgroup_note = f"{self._cgroup.directory} could not be removed"
        if self._freezer is not None and not self._freezer.remove():
            self.cgroup_note = f"{self._freezer.directory} could not be removed"

    def statistics(self) -> ProcessStatistics:
        """A snapshot of the job's state."""
        peak = self.peak()
        return ProcessStatistics(
            self.job_id,
            self.pid,
            self.poll() if not self._closed else self._returncode,
            self.cgroup_dir,
            self.cgroup_note,
            len(self._members),
            peak.bytes,
            self._closed,
            peak.method,
            self.freezer_dir,
            self._suspension.method,
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

"""Real processes for tests: a keeper of everything a test launched, and reading a child's log.

Every test that starts process trees or job groups hands them to a
:class:`Reaper` (the ``reaper`` fixture in ``conftest.py``), which kills and
removes them whatever the test's outcome.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil

from roomkeeper.kernel.proc import ProcStat, cgroup_members, read_stat, scan_proc, tree_members
from roomkeeper.processes.launch import LaunchSpec, launch
from roomkeeper.processes.lifeline import Lifeline
from roomkeeper.processes.process import ManagedProcess


def python(code: str, *args: str) -> list[str]:
    """argv running a Python snippet in a fresh interpreter."""
    return [sys.executable, "-c", code, *args]


def gone(pid: int) -> bool:
    """Whether a process is dead: no longer there, or a zombie waiting to be reaped."""
    stat = read_stat(pid)
    return stat is None or stat.state == "Z"


def read_log(path: Path, needle: str, timeout: float = 60.0) -> str:
    """The log once it holds ``needle`` (waits for a child to get ready, not for a timeout).

    Generous: an emulated kernel (CI's cgroup v2 VM) takes seconds to start a child.
    """
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(0.01)


class Reaper:
    """Everything a test started, so that nothing outlives it even when it fails."""

    def __init__(self) -> None:
        self.jobs: list[ManagedProcess] = []
        self.procs: list[psutil.Process] = []
        self.sessions: set[int] = set()
        self.cgroups: list[str] = []

    def launch(self, job_id: str, spec: LaunchSpec, **kwargs: Lifeline) -> ManagedProcess:
        job = launch(job_id, spec, **kwargs)
        self.jobs.append(job)
        self.cgroups += [d for d in (job.cgroup_dir, job.freezer_dir) if d is not None]
        return job

    def watch(self, *pids: int) -> None:
        for pid in pids:
            stat = read_stat(pid)
            try:
                self.procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
            if stat is not None and stat.sid != os.getsid(0):  # never our own session
                self.sessions.add(stat.sid)

    def cleanup(self) -> None:
        for job in self.jobs:
            job.close()
        # Listed before anything is killed (a killed parent hides its children):
        # members never printed (a tree's middle children) share a watched
        # session or descend from a watched member, so they are ours to kill.
        table = scan_proc()
        seeds = [proc.pid for proc in self.procs if proc.is_running()]
        for sid in self.sessions or {-1}:  # -1: no session, the seeds' trees only
            for pid in tree_members(table, sid, None, seeds):
                if table.get(pid, ProcStat("Z", 0, 0, 0)).state != "Z":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            try:
                if proc.is_running():
                    proc.kill()
            except psutil.NoSuchProcess:
                continue
        deadline = time.monotonic() + 5
        while not all(gone(proc.pid) for proc in self.procs) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Reap what came to us as a subreaper, from the sessions of the trees watched.
        for pid, stat in scan_proc().items():
            if stat.ppid == os.getpid() and stat.state == "Z" and stat.sid in self.sessions:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        for directory in self.cgroups:
            with contextlib.suppress(OSError):  # a frozen v1 task dies only once thawed
                Path(directory, "freezer.state").write_text("THAWED")
            with contextlib.suppress(OSError):
                Path(directory, "cgroup.freeze").write_text("0")
            for pid in cgroup_members(directory):  # in a group we made: ours to kill
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)

"""The lifeline: managed trees die with the scheduler, even when it is killed abruptly.

A job's descendants are cleaned up even when the scheduler is killed
abruptly.  One small helper per scheduler, ``python -m
roomkeeper.processes.lifeline``, reads registrations from a pipe on its stdin::

    add <pid> <session id = process group id> <cgroup dir or ->
    frz <pid> <v1 freezer group dir>
    del <pid>

The scheduler holds the only write end of that pipe, so when the scheduler
dies, for any reason, SIGKILL included, the kernel closes it and the
helper reads end-of-file.  It then SIGKILLs every registered tree (its
process group, its session, every pid in its cgroup, and every descendant
of those) until nothing is left, thawing any v1 freezer group (a frozen
v1 task dies only once thawed), removes the trees' cgroups, and exits.
:meth:`Lifeline.close` ends it the same way after the scheduler has stopped
its jobs itself, when nothing is left to kill.

The helper lives in its own session and ignores SIGINT, SIGTERM and SIGHUP:
Ctrl-C on the scheduler's terminal must not take it out before it has done
its one job.  ``PR_SET_PDEATHSIG`` is a second trigger for the case where a
forked copy of the scheduler still holds the pipe open.

Limits: a job is registered just after its spawn, so a scheduler killed in
between (microseconds) leaves that one job behind; and without a cgroup, a
descendant that left the job's session and then lost its parent is out of
the helper's reach (the scheduler's own stop still finds it if it was seen).

The ``/proc`` and cgroup primitives that find a tree's members live in
:mod:`roomkeeper.kernel.proc`; they read ``/proc`` directly, without psutil,
so the helper's kill path needs nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from roomkeeper.errors import RoomkeeperError
from roomkeeper.kernel.proc import (
    PR_SET_PDEATHSIG,
    kill_cgroup,
    prctl,
    scan_proc,
    tree_members,
)

_READY = b"ready\n"
_KILL_DEADLINE_S = 1.5  # the whole kill fits well inside 2 s


@dataclass(frozen=True, slots=True)
class LifelineStatistics:
    """A snapshot of a :class:`Lifeline`.

    Attributes:
        pid: the helper's pid, None when none is running.
        registered: how many trees it would kill if the scheduler died now.
        starts: how many helpers were started (more than one: one died and was replaced).
    """

    pid: int | None
    registered: int
    starts: int


def _signal_quietly(sig: int, pid: int, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or not ours
        (os.killpg if group else os.kill)(pid, sig)


@dataclass(frozen=True, slots=True)
class Registration:
    """One tree the helper would kill: its leader, its session (= process group), its cgroups."""

    pid: int
    sid: int
    cgroup_dir: str | None
    freezer_dir: str | None = None


def kill_jobs(jobs: Iterable[Registration], *, deadline_s: float = _KILL_DEADLINE_S) -> set[int]:
    """SIGKILL every member of every tree until none is left; returns the pids still alive."""
    jobs = list(jobs)
    deadline = time.monotonic() + deadline_s
    while True:
        # List before killing: a grandchild that called setsid() is found only
        # through its parent, which the first SIGKILL would take away.
        alive = _living_members(jobs)
        _kill_round(jobs, alive)
        # Again until a listing comes back empty: a member may fork in between.
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    for job in jobs:
        for directory in (job.cgroup_dir, job.freezer_dir):
            if directory is not None:
                _rmdir_soon(directory, deadline + 0.3)
    return alive


def _living_members(jobs: list[Registration]) -> set[int]:
    """Every member of the trees that is not yet a zombie, found now."""
    table = scan_proc()
    alive: set[int] = set()
    for job in jobs:
        found = tree_members(table, job.sid, job.cgroup_dir)
        alive |= {pid for pid in found if pid not in table or table[pid].state != "Z"}
    return alive


def _kill_round(jobs: list[Registration], alive: set[int]) -> None:
    """One SIGKILL of every group, cgroup and listed member (a frozen v1 group thawed)."""
    for job in jobs:
        _signal_quietly(signal.SIGKILL, job.sid, group=True)
        if job.cgroup_dir is not None:
            kill_cgroup(job.cgroup_dir)
        if job.freezer_dir is not None:
            _thaw_v1(job.freezer_dir)
    for pid in alive:
        _signal_quietly(signal.SIGKILL, pid)


def _thaw_v1(directory: str) -> None:
    """Thaw a v1 freezer group, so that its SIGKILLed tasks can die."""
    with contextlib.suppress(OSError), open(f"{directory}/freezer.state", "w") as state:
        state.write("THAWED")


def _rmdir_soon(directory: str, deadline: float) -> None:
    while True:
        try:
            os.rmdir(directory)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)  # EBUSY while the last killed tasks drain


class _ParentGone(Exception):  # noqa: N818 -- control flow, not an error
    pass


def _feed(chunk: bytes, buffer: bytearray, jobs: dict[int, Registration]) -> None:
    buffer += chunk
    *complete, rest = bytes(buffer).split(b"\n")
    buffer[:] = rest
    for raw in complete:
        line = raw.decode("utf-8", "replace")
        fields = line.split(maxsplit=3)
        try:
            pid = int(fields[1])
            if fields[0] == "add" and len(fields) == 4 and min(pid, int(fields[2])) > 1:
                cgroup_dir = None if fields[3] == "-" else fields[3]
                jobs[pid] = Registration(pid, int(fields[2]), cgroup_dir)
            elif fields[0] == "frz" and len(fields) >= 3 and pid in jobs:
                freezer_dir = line.split(maxsplit=2)[2]  # a path may hold spaces
                jobs[pid] = dataclasses.replace(jobs[pid], freezer_dir=freezer_dir)
            elif fields[0] == "del" and len(fields) == 2:
                jobs.pop(pid, None)
            else:
                raise ValueError(line)
        except (IndexError, ValueError):
            print(f"roomkeeper lifeline: ignoring line {line[:80]!r}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """The helper: follow registrations on stdin, kill what is registered at end-of-file."""
    args = sys.argv[1:] if argv is None else argv
    parent = int(args[0]) if args else os.getppid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    reading = [True]

    def on_parent_death(signum: int, frame: object) -> None:
        # PDEATHSIG also fires when the *thread* that started us exits while the
        # scheduler lives on (prctl(2)); only a changed parent means it is gone.
        if reading[0] and os.getppid() != parent:
            raise _ParentGone

    signal.signal(signal.SIGUSR1, on_parent_death)
    jobs: dict[int, Registration] = {}
    buffer = bytearray()
    try:
        with contextlib.suppress(OSError):  # end-of-file is the main trigger, this the second
            prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
        if os.getppid() != parent:
            raise _ParentGone  # it died before the prctl could watch it
        with contextlib.suppress(BrokenPipeError):  # it died before reading: EOF follows
            os.write(1, _READY)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the scheduler reads nothing more from us
        os.close(devnull)
        while chunk := os.read(0, 4096):
            _feed(chunk, buffer, jobs)
        reading[0] = False
    except _ParentGone:
        reading[0] = False
        # What the scheduler wrote before it died is still in the pipe; a forked
        # copy of it may hold the pipe open, so read only what is there.
        os.set_blocking(0, False)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(0, 4096):
                _feed(chunk, buffer, jobs)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    survivors = kill_jobs(jobs.values())
    if survivors:
        print(f"roomkeeper lifeline: could not kill {sorted(survivors)}", file=sys.stderr)
    return 1 if survivors else 0


class Lifeline:
    """The scheduler's side of the helper: one per scheduler, started on first use.

    Thread-safe.  When the helper dies (someone killed it), the next
    registration starts a new one and sends it every live registration again.

    Args:
        python: the interpreter that runs the helper.
        stall_s: how long a starting helper may make no progress at all before it
            is given up on (a slow start that makes progress is waited out);
            :data:`roomkeeper.processes.readiness.STALL_S` when None.
    """

    def __init__(self, *, python: str = sys.executable, stall_s: float | None = None) -> None:
        self._python = python
        self._stall_s = stall_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: dict[int, bytes] = {}
        self._starts = 0

    @property
    def pid(self) -> int | None:
        """The helper's pid, None before it starts or after :meth:`close`."""
        proc = self._proc
        return None if proc is None else proc.pid

    def start(self) -> None:
        """Start the helper unless one is running; returns once it is armed.

        Raises:
            RoomkeeperError: the helper did not come up.
        """
        with self._lock:
            self._ensure_running()

    def register(
        self, pid: int, sid: int, cgroup_dir: str | None, freezer_dir: str | None = None
    ) -> None:
        """Have the helper kill this tree if the scheduler dies before :meth:`unregister`.

        Args:
            pid: the tree's leader.
            sid: its session, which is also its process group.
            cgroup_dir: its memory cgroup, every member of which is killed.
            freezer_dir: its v1 freezer group, thawed so that its members can die.
        """
        for name, directory in (("cgroup_dir", cgroup_dir), ("freezer_dir", freezer_dir)):
            if directory is not None and ("\n" in directory or not directory.strip()):
                raise ValueError(f"{name} must be a path on one line (got {directory!r})")
        if min(pid, sid) <= 1:
            raise ValueError(f"pid and sid must be > 1 (got {pid}, {sid})")
        line = f"add {pid} {sid} {cgroup_dir or '-'}\n"
        if freezer_dir is not None:
            line += f"frz {pid} {freezer_dir}\n"  # one write: under PIPE_BUF, so atomic
        with self._lock:
            self._lines[pid] = line.encode()
            self._send(self._lines[pid])

    def unregister(self, pid: int) -> None:
        """Forget a tree, once it is gone; unknown pids are ignored."""
        with self._lock:
            if self._lines.pop(pid, None) is not None and self._proc is not None:
                self._send(f"del {pid}\n".encode())

    def close(self, timeout: float = 5.0) -> int | None:
        """End the helper: it kills what is still registered, then exits.  Idempotent.

        Returns:
            the helper's exit status (0: nothing was left alive), None when none ran.
        """
        with self._lock:
            proc, self._proc = self._proc, None
            self._lines.clear()
            if proc is None:
                return None
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()  # our own helper, stuck: do not leave it behind
                return proc.wait()

    def statistics(self) -> LifelineStatistics:
        """A snapshot of the helper's state."""
        with self._lock:
            return LifelineStatistics(self.pid, len(self._lines), self._starts)

    def _ensure_running(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                return
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # a dead helper: let it go, start another
            self._proc = None
        # src/roomkeeper/processes/lifeline.py -> src: the lifeline imports the package from there
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        try:
            proc = subprocess.Popen(
                [self._python, "-m", "roomkeeper.processes.lifeline", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # out of reach of the terminal's Ctrl-C
                bufsize=0,
                env=env,
            )
        except OSError as err:
            raise RoomkeeperError(f"the lifeline helper could not start: {err}") from err
        assert proc.stdout is not None
        # Imported here: the helper imports this module too, and must start light.
        from roomkeeper.processes.readiness import STALL_S, await_ready

        try:
            await_ready(
                proc,
                proc.stdout.fileno(),
                _READY,
                what=f"the lifeline helper ({self._python} -m roomkeeper.processes.lifeline)",
                stall_s=STALL_S if self._stall_s is None else self._stall_s,
            )
        finally:
            proc.stdout.close()
        self._proc = proc
        self._starts += 1
        for line in self._lines.values():  # a replaced helper learns every live tree again
            self._write(line)

    def _send(self, line: bytes) -> None:
        self._ensure_running()
        try:
            self._write(line)
        except BrokenPipeError:  # the helper died (was killed) since the last write
            assert self._proc is not None
            self._proc.kill()  # our own helper, perhaps still on its way out
            self._proc.wait()
            self._ensure_running()  # replays every registration, this one included

    def _write(self, line: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        # One os.write of under PIPE_BUF bytes is atomic; no buffering to flush.
        os.write(self._proc.stdin.fileno(), line)


if __name__ == "__main__":
    sys.exit(main())

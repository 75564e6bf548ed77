"""Suspending a whole process tree and letting it go on: three ways, the kernel's first.

- cgroup v2's ``cgroup.freeze`` (Linux 5.2): writing 1 freezes every process
  of the group and of its children; the group is frozen once its
  ``cgroup.events`` says ``frozen 1``.  A frozen process can still be killed.
- The cgroup v1 freezer, where its hierarchy is mounted: ``freezer.state``
  reads FREEZING until every task has stopped, then FROZEN.  A frozen v1 task
  dies of SIGKILL only once thawed, so whoever kills one thaws it too.
- Neither: SIGSTOP to every process of the tree, listed again until a
  listing finds none still running (a member may fork between the listing
  and the signal), and SIGCONT to let them go on.  Which processes belong to
  the tree is the caller's to say (:mod:`roomkeeper.processes.process` finds
  descendants that left the job's process group too).

A suspended tree is not scheduled: it uses no CPU and its memory stops
growing, and nothing of its work is lost.  Every wait here takes an
injected clock and sleep, and ends in :class:`TimeoutError` naming what did
not stop; the caller decides what to undo.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from roomkeeper.errors import KernelFileError
from roomkeeper.kernel import parsers
from roomkeeper.kernel.cgroup_hierarchy import read_file, remove_group, v1_controller_group
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT

FREEZE_TIMEOUT_S = 5.0
_STOPPED_STATES = frozenset("TtZXx")  # stopped, traced, dead: none of them runs again by itself


class FreezeMethod(enum.Enum):
    """How a tree was suspended."""

    CGROUP_V2 = "cgroup.freeze"  # the job's own v2 group
    FREEZER_V1 = "v1 freezer"  # the job's own group in the v1 freezer hierarchy
    SIGNALS = "SIGSTOP"  # every process of the tree, one by one


@dataclass(frozen=True, slots=True)
class FreezerGroup:
    """A job's own group in the cgroup v1 freezer hierarchy."""

    directory: str

    def set_frozen(
        self,
        frozen: bool,
        *,
        timeout: float = FREEZE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Freeze or thaw the group; returns once ``freezer.state`` says it is done.

        Raises:
            TimeoutError: still FREEZING after ``timeout`` seconds.
            OSError: the group's files could not be read or written.
        """
        want = "FROZEN" if frozen else "THAWED"
        path = f"{self.directory}/freezer.state"
        deadline, step = clock() + timeout, 0.001
        while True:
            _write(path, want)  # writing FROZEN again retries tasks that did not stop yet
            state = read_file(path).decode("ascii", "replace").strip()
            if state == want:
                return
            if clock() >= deadline:
                raise TimeoutError(f"{path} still reads {state} after {timeout:g} s")
            sleep(step)
            step = min(step * 2, 0.02)

    def remove(self, attempts: int = 100) -> bool:
        """rmdir the group, else thaw it and retry while its last tasks drain; True once gone.

        An empty group goes at the first rmdir, frozen or not; one with tasks left
        is thawed first, since a frozen task cannot exit.
        """
        if remove_group(self.directory, attempts=1):
            return True
        with contextlib.suppress(OSError):
            _write(f"{self.directory}/freezer.state", "THAWED")
        return remove_group(self.directory, max(attempts - 1, 1))


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)  # as the shell's ">" does
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def freezer_parent(proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT) -> str | None:
    """Our own group in the v1 freezer hierarchy, where job freezer groups go; None unmounted.

    Raises:
        OSError, KernelFileError: the membership files could not be read.
    """
    group = v1_controller_group("freezer", proc_root, cgroup_root)
    return None if group is None else group.own_dir


def v2_can_freeze(directory: str) -> bool:
    """Whether a v2 group has ``cgroup.freeze`` (Linux 5.2 and later)."""
    return os.path.exists(f"{directory}/cgroup.freeze")


def set_v2_frozen(
    directory: str,
    frozen: bool,
    *,
    timeout: float = FREEZE_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Freeze or thaw a v2 group; returns once ``cgroup.events`` says ``frozen`` is so.

    Raises:
        TimeoutError: ``frozen`` did not change within ``timeout`` seconds.
        OSError, KernelFileError: the group's files could not be read or written.
    """
    want = 1 if frozen else 0
    _write(f"{directory}/cgroup.freeze", str(want))
    deadline, step = clock() + timeout, 0.001
    while True:
        events = parsers.parse_flat_keyed(
            read_file(f"{directory}/cgroup.events"), "cgroup.events", frozenset(("frozen",))
        )
        if events.get("frozen") == want:
            return
        if "frozen" not in events:
            raise KernelFileError("cgroup.events", "has no frozen line (Linux 5.2 brought it)")
        if clock() >= deadline:
            raise TimeoutError(
                f"{directory}/cgroup.events says frozen {1 - want} after {timeout:g} s"
            )
        sleep(step)
        step = min(step * 2, 0.02)


def _state(pid: int, proc_root: str) -> str | None:
    try:
        return parsers.parse_pid_stat(read_file(f"{proc_root}/{pid}/stat")).state
    except (OSError, KernelFileError):
        return None  # gone


def _send_quietly(send: Callable[[int, int], None], pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
        send(pid, sig)


def stop_processes(
    members: Callable[[], Iterable[int]],
    *,
    first: Iterable[int] = (),
    send: Callable[[int, int], None] = os.kill,
    proc_root: str = PROC_ROOT,
    timeout: float = FREEZE_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """SIGSTOP every process ``members`` lists until a listing finds none still running.

    A process takes the signal when it is next scheduled, and one in
    uninterruptible sleep (state D) only when its I/O ends: each listing
    checks every state again, and a member forked meanwhile is in the next.

    ``first`` (the members known already) are stopped before the first listing: a
    listing walks ``/proc``, which on a busy machine takes long enough for a
    growing tree to reach the limit meanwhile.

    Raises:
        TimeoutError: some members still ran after ``timeout`` seconds (named).
    """
    for pid in first:
        _send_quietly(send, pid, signal.SIGSTOP)
    deadline, step = clock() + timeout, 0.001
    while True:
        states = {pid: _state(pid, proc_root) for pid in members()}
        running = [pid for pid, state in states.items() if state not in _STOPPED_STATES]
        running = [pid for pid in running if states[pid] is not None]  # None: gone
        if not running:
            return
        for pid in running:
            _send_quietly(send, pid, signal.SIGSTOP)
        if clock() >= deadline:
            raise TimeoutError(f"pids {sorted(running)[:8]} still ran after {timeout:g} s")
        sleep(step)
        step = min(step * 2, 0.02)


def continue_processes(
    members: Iterable[int], *, send: Callable[[int, int], None] = os.kill
) -> None:
    """SIGCONT every process of ``members`` (the ones stopped, and any listed since)."""
    for pid in members:
        _send_quietly(send, pid, signal.SIGCONT)

"""Suspending a managed tree and letting it go on, the kernel's way where it has one.

:class:`Suspension` is a :class:`~roomkeeper.processes.process.ManagedProcess`'s
state of being suspended, and the choice of way (the mechanisms are
:mod:`roomkeeper.kernel.freezer`'s): the job's v2 group is frozen with
``cgroup.freeze``, else its v1 freezer group, else every process of the
tree gets SIGSTOP.  Both calls are idempotent: suspending a suspended tree
and resuming a running one do nothing.  The pressure relief ladder
suspends the newest tree before it stops one: nothing is lost.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable

from roomkeeper.errors import KernelFileError, SuspendError
from roomkeeper.kernel import freezer
from roomkeeper.kernel.freezer import FreezeMethod, FreezerGroup
from roomkeeper.kernel.job_cgroups import JobCgroup


class Suspension:
    """Whether one tree is suspended, and how; not thread-safe (its process's lock guards it).

    Args:
        job_id: the job, for errors.
        cgroup: the job's memory group, if it has one (a v2 one freezes).
        freezer_group: the job's v1 freezer group, if it has one.
        members: every pid of the tree now (signals only).
        known: the pids of the tree known without a walk of ``/proc`` (signals only):
            they are stopped first.
        send: signals one member (signals only); raises ProcessLookupError
            for a process that is gone.
    """

    def __init__(
        self,
        job_id: str,
        *,
        cgroup: JobCgroup | None,
        freezer_group: FreezerGroup | None,
        members: Callable[[], set[int]],
        send: Callable[[int, int], None],
        known: Callable[[], set[int]] = set,
    ) -> None:
        self._job_id = job_id
        self._cgroup = cgroup
        self._freezer = freezer_group
        self._members = members
        self._known = known
        self._send = send
        self._stopped: set[int] = set()  # every pid SIGSTOP went to, for the SIGCONT
        self.method: FreezeMethod | None = None  # how the tree is suspended now

    def way(self) -> FreezeMethod:
        """How this tree would be suspended: the job's v2 group, its v1 freezer group, signals."""
        cgroup = self._cgroup
        if cgroup is not None and cgroup.version == 2 and freezer.v2_can_freeze(cgroup.directory):
            return FreezeMethod.CGROUP_V2
        if self._freezer is not None:
            return FreezeMethod.FREEZER_V1
        return FreezeMethod.SIGNALS

    def halt(self) -> None:
        """SIGSTOP the members known already (signals only; nothing once suspended): the
        tree grows no more while :meth:`suspend`, which must follow, walks for the rest."""
        if self.method is not None or self.way() is not FreezeMethod.SIGNALS:
            return
        first = self._known()
        self._stopped |= first
        for pid in first:
            with contextlib.suppress(ProcessLookupError):
                self._send(pid, signal.SIGSTOP)

    def suspend(self, timeout: float) -> FreezeMethod:
        """Suspend the tree (see :meth:`ManagedProcess.suspend`); how it was suspended.

        Raises:
            SuspendError: it did not stop; what did stop was let go on.
        """
        if self.method is not None:
            return self.method
        method = self.way()
        try:
            self._set(method, True, timeout)
        except (OSError, KernelFileError, TimeoutError) as err:
            self.method = method
            self.resume_quietly()
            raise SuspendError(self._job_id, f"{method.value}: {err}") from err
        self.method = method
        return method

    def resume(self, listed: set[int] | None = None) -> FreezeMethod | None:
        """Let the tree go on; how it had been suspended, None if it was not.

        Args:
            listed: the tree's pids, when the caller has just walked ``/proc`` for them
                (signals only: spares a second walk).

        Raises:
            SuspendError: the kernel refused to thaw it (it stays suspended).
        """
        method = self.method
        if method is None:
            return None
        try:
            self._set(method, False, freezer.FREEZE_TIMEOUT_S, listed)
        except (OSError, KernelFileError, TimeoutError) as err:
            raise SuspendError(self._job_id, f"cannot resume ({method.value}): {err}") from err
        self.method = None
        self._stopped.clear()
        return method

    def resume_quietly(self, listed: set[int] | None = None) -> None:
        """Resume before a stop or after a failed suspend, whatever the kernel says."""
        with contextlib.suppress(SuspendError):
            self.resume(listed)

    def forget(self) -> None:
        """The tree is gone (its groups removed): nothing is suspended any more."""
        self.method = None
        self._stopped.clear()

    def _set(
        self, method: FreezeMethod, frozen: bool, timeout: float, listed: set[int] | None = None
    ) -> None:
        if method is FreezeMethod.CGROUP_V2:
            assert self._cgroup is not None
            freezer.set_v2_frozen(self._cgroup.directory, frozen, timeout=timeout)
        elif method is FreezeMethod.FREEZER_V1:
            assert self._freezer is not None
            self._freezer.set_frozen(frozen, timeout=timeout)
        elif frozen:
            first = self._known()
            self._stopped |= first
            freezer.stop_processes(self._listed, first=first, send=self._send, timeout=timeout)
        else:
            now = self._members() if listed is None else listed
            freezer.continue_processes(self._stopped | now, send=self._send)

    def _listed(self) -> set[int]:
        """The tree's pids now; each is remembered as one to SIGCONT."""
        pids = self._members()
        self._stopped |= pids
        return pids

"""Suspending a managed tree and letting it go on, the kernel's way where it has one.

:class:`Suspension` is a :class:`~roomkeeper.trees.process.ManagedProcess`'s
state of being suspended, and the choice of way (the mechanisms are
:mod:`roomkeeper.kernel.freezer`'s): the job's v2 group is frozen with
``cgroup.freeze``, else its v1 freezer group, else every process of the
tree gets SIGSTOP.  Both calls are idempotent: suspending a suspended tree
and resuming a running one do nothing.  The pressure relief ladder
suspends the newest tree before it stops one: nothing is lost.
"""

from __future__ import annotations

import contextlib
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
    ) -> None:
        self._job_id = job_id
        self._cgroup = cgroup
        self._freezer = freezer_group
        self._members = members
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

    def resume(self) -> FreezeMethod | None:
        """Let the tree go on; how it had been suspended, None if it was not.

        Raises:
            SuspendError: the kernel refused to thaw it (it stays suspended).
        """
        method = self.method
        if method is None:
            return None
        try:
            self._set(method, False, freezer.FREEZE_TIMEOUT_S)
        except (OSError, KernelFileError, TimeoutError) as err:
            raise SuspendError(self._job_id, f"cannot resume ({method.value}): {err}") from err
        self.method = None
        self._stopped.clear()
        return method

    def resume_quietly(self) -> None:
        """Resume before a stop or after a failed suspend, whatever the kernel says."""
        with contextlib.suppress(SuspendError):
            self.resume()

    def forget(self) -> None:
        """The tree is gone (its groups removed): nothing is suspended any more."""
        self.method = None
        self._stopped.clear()

    def _set(self, method: FreezeMethod, frozen: bool, timeout: float) -> None:
        if method is FreezeMethod.CGROUP_V2:
            assert self._cgroup is not None
            freezer.set_v2_frozen(self._cgroup.directory, frozen, timeout=timeout)
        elif method is FreezeMethod.FREEZER_V1:
            assert self._freezer is not None
            self._freezer.set_frozen(frozen, timeout=timeout)
        elif frozen:
            freezer.stop_processes(self._listed, send=self._send, timeout=timeout)
        else:
            freezer.continue_processes(self._stopped | self._members(), send=self._send)

    def _listed(self) -> set[int]:
        """The tree's pids now; each is remembered as one to SIGCONT."""
        pids = self._members()
        self._stopped |= pids
        return pids

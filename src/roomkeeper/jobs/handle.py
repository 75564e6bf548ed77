"""The seam between the scheduler and a backend: what it needs of a launched tree.

A :class:`Handle` is a local managed tree (:mod:`roomkeeper.processes.process`) or a
task on another machine (:mod:`roomkeeper.cluster.handle`); the scheduler asks the
handle what it is (``local``, ``suspendable``, ``settlement``) and never its class.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from roomkeeper.guard.rule import Word
from roomkeeper.processes.peaks import MemoryPeak


class RemoteEnd(enum.Enum):
    """How a tree that ran elsewhere ended without an exit status of its own."""

    REFUSED = "refused"  # the node's own guard refused it before it started: it waits again
    LOST = "lost"  # the node or its runner was lost mid-job: uncertain, never re-run
    FAILED = "failed"  # the node could not start it (the node's runner says why)
    DEADLINE = "deadline"  # its node stopped it at the deadline the gateway holds too
    PRESSURE = "pressure"  # its node's ladder stopped it for memory pressure: run again if it may


@dataclass(frozen=True, slots=True)
class Settlement:
    """Why a remote handle's poll ended without a real exit status.

    Attributes:
        end: what happened.
        reason: the node guard's reason (REFUSED), else None.
        summary: the node's words, for the job's error or the refusal log.
        rate: bytes per second it grew by when its node stopped it (PRESSURE).
        never_fits: it alone outgrew its node (PRESSURE): never run again.
    """

    end: RemoteEnd
    reason: Word | None
    summary: str
    rate: float = 0.0
    never_fits: bool = False


class Handle(Protocol):
    """What the scheduler needs of a launched tree (see :mod:`roomkeeper.processes.process`).

    ``pid`` is the leader's pid on this machine, or None for a tree that runs
    elsewhere (the Ray backend): the scheduler then polls instead of waiting on a pidfd.
    """

    @property
    def pid(self) -> int | None: ...

    @property
    def local(self) -> bool:
        """Whether the tree runs on this machine, so its memory is in this container's
        reading and the ladder here may act on it (False on another Ray node)."""
        ...

    @property
    def suspendable(self) -> bool:
        """Whether :meth:`suspend` and :meth:`resume` can act on the tree from here."""
        ...

    def poll(self) -> int | None: ...
    def footprint_bytes(self) -> int: ...

    def cpu_seconds(self) -> float | None:
        """CPU seconds the tree used so far; None where that is not known here (a tree on
        another machine uses none of this one's cores)."""
        ...

    def peak(self) -> MemoryPeak: ...
    def stop(self, grace: float = ...) -> int | None: ...
    def close(self) -> None: ...

    def halt(self) -> None:
        """Stop the tree's growth at once where that needs no walk of ``/proc`` (SIGSTOP to
        the processes known already); :meth:`suspend` must follow.  Nothing where a
        suspension is as quick (a group's freezer) or impossible."""
        ...

    def suspend(self, *, timeout: float = ...) -> object:
        """Suspend the whole tree (the relief ladder).

        Raises:
            SuspendError: it could not be suspended, or cannot be from here.
        """
        ...

    def resume(self) -> object:
        """Let a suspended tree go on.

        Raises:
            SuspendError: it could not be resumed, or cannot be from here.
        """
        ...

    def settlement(self) -> Settlement | None:
        """None while it runs or when it exited by itself (every local tree); else how a
        tree that ran elsewhere ended without an exit status of its own."""
        ...

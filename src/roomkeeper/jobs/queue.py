"""The bounded fair queue: the scheduler's bounds, and who waits in what order.

The bounds: at most 32 jobs wait (8 per owner) and 4 run (2 per
owner).  Each owner has a line of waiting jobs, oldest first; owner rotation
keeps one owner from taking every free slot: the owner just served goes to
the back of the turn.  The waiting bounds are checked here, at submission;
the running bounds are the launch round's (:mod:`roomkeeper.jobs.rounds`), which
also decides when the head of a line may start.

:class:`FairQueue` keeps no lock of its own: the scheduler calls it with its
lock held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from roomkeeper.config import QueueSettings
from roomkeeper.errors import QueueFullError
from roomkeeper.jobs.spec import SchedulerReason

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one round.  ``None`` per-owner caps mean one owner (a batch);
    a ``None`` CPU pressure percentage means no CPU gate (a batch unless asked)."""

    max_waiting: int
    max_waiting_per_owner: int | None
    max_running: int
    max_running_per_owner: int | None
    cpu_pressure_percent: float | None
    worker_nice: int
    hold: bool = False  # launch nothing (relief, recovery mode); waiting jobs say "held"
    # Hold launches while our running jobs keep every core busy (a batch given no count).
    until_cores_free: bool = False

    @classmethod
    def from_settings(cls, s: QueueSettings) -> Limits:
        """The bounds as the environment sets them."""
        return cls(
            s.max_waiting,
            s.max_waiting_per_owner,
            s.max_running,
            s.max_running_per_owner,
            s.cpu_pressure_percent,
            s.worker_nice,
        )


def batch_limits(
    max_running: int,
    worker_nice: int,
    cpu_pressure_percent: float | None,
    until_cores_free: bool = False,
) -> Limits:
    """A batch is one owner: no per-owner caps, and lines are fed as room frees."""
    return Limits(
        max_waiting=10**9,
        max_waiting_per_owner=None,
        max_running=max_running,
        max_running_per_owner=None,
        cpu_pressure_percent=cpu_pressure_percent,
        worker_nice=worker_nice,
        until_cores_free=until_cores_free,
    )


class FairQueue(Generic[T]):
    """One line of waiting items per owner, oldest first, and the owner rotation."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}  # owner -> waiting jobs, oldest first
        self._turn: deque[str] = deque()  # owner rotation: the next owner to serve is first

    def require_room(self, owner: str, limits: Limits) -> None:
        """Refuse at once when a waiting bound is reached.

        Raises:
            QueueFullError: ``queue_full`` or ``owner_queue_full``, with the bound.
        """
        waiting = self.waiting()
        if waiting >= limits.max_waiting:
            raise QueueFullError(
                f"{waiting} jobs are waiting, the most ROOMKEEPER_MAX_WAITING allows "
                f"({limits.max_waiting}); try again when some have started",
                reason=SchedulerReason.QUEUE_FULL.value,
                owner=owner,
            )
        mine = self.waiting_of(owner)  # a refusal must not leave a line outside the turn
        if limits.max_waiting_per_owner is not None and mine >= limits.max_waiting_per_owner:
            raise QueueFullError(
                f"owner {owner!r} has {mine} jobs waiting, the most "
                f"ROOMKEEPER_MAX_WAITING_PER_OWNER allows ({limits.max_waiting_per_owner})",
                reason=SchedulerReason.OWNER_QUEUE_FULL.value,
                owner=owner,
            )

    def push(self, owner: str, item: T) -> None:
        """Put ``item`` at the back of its owner's line; a new owner joins the turn last."""
        self._queues.setdefault(owner, deque()).append(item)
        if owner not in self._turn:
            self._turn.append(owner)

    def push_front(self, owner: str, item: T) -> None:
        """Put ``item`` back at the head of its owner's line (it keeps its place)."""
        self._queues.setdefault(owner, deque()).appendleft(item)
        if owner not in self._turn:
            self._turn.append(owner)

    def remove(self, owner: str, item: T) -> None:
        """Take ``item`` out of its owner's line, if it is there."""
        queue = self._queues.get(owner)
        if queue is not None and item in queue:
            queue.remove(item)

    def take(self, pick: Callable[[T], bool]) -> list[T]:
        """Take every waiting item ``pick`` chooses out of its line; line by line, oldest first."""
        taken: list[T] = []
        for queue in self._queues.values():
            for item in [i for i in queue if pick(i)]:
                queue.remove(item)
                taken.append(item)
        return taken

    def heads(self, skip: Callable[[T], bool] | None = None) -> Iterator[tuple[str, T]]:
        """Each owner with a waiting item, and its oldest, in the order of the turn.

        Items ``skip`` chooses wait aside: an owner's head is its oldest other item.
        """
        for owner in list(self._turn):
            queue = self._queues.get(owner)
            if not queue:
                continue
            head = queue[0] if skip is None else next((i for i in queue if not skip(i)), None)
            if head is not None:
                yield owner, head

    def rotate(self, owner: str) -> None:
        """Rotation: ``owner`` was just served, so it goes to the back of the line."""
        self._turn.remove(owner)
        self._turn.append(owner)

    def first(self) -> T | None:
        """The oldest item of the first owner with one (by when the owner first came)."""
        return next((q[0] for q in self._queues.values() if q), None)

    def waiting(self) -> int:
        """How many items wait, in all."""
        return sum(len(q) for q in self._queues.values())

    def waiting_of(self, owner: str) -> int:
        """How many of ``owner``'s items wait."""
        return len(self._queues.get(owner, ()))

    def owners(self) -> set[str]:
        """Every owner with a line, empty or not."""
        return set(self._queues)

    def __iter__(self) -> Iterator[T]:
        """Every waiting item, line by line, oldest first."""
        return (item for queue in self._queues.values() for item in queue)

    def forget_idle(self, busy: Container[str]) -> None:
        """Drop the empty lines, and their turns, of owners not in ``busy``."""
        for owner in [o for o, q in self._queues.items() if not q]:
            if owner not in busy:
                del self._queues[owner]
                self._turn.remove(owner)

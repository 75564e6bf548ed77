"""The scheduler's job book: every job it knows, by id, and the views and events made of them.

A job's :class:`JobRecord` is mutable and lives under the scheduler's lock
from submission to its end; callers only ever see frozen
:class:`~roomkeeper.jobs.spec.JobView` snapshots.  Every state change is a
:class:`~roomkeeper.jobs.spec.Transition` in the record's history and an event
handed to ``on_change`` outside the lock, in order.  Finished records are
forgotten beyond KEEP_FINISHED; the journal keeps every one.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from roomkeeper.errors import UnknownJobError
from roomkeeper.guard.rule import Word
from roomkeeper.jobs.handle import Handle
from roomkeeper.jobs.spec import (
    Estimate,
    JobSpec,
    JobState,
    JobView,
    SchedulerReason,
    Transition,
)
from roomkeeper.processes.peaks import PeakMethod
from roomkeeper.worktrees.request import Worktree

KEEP_FINISHED = 1000  # finished jobs kept in memory; the journal keeps every one
WAIT_LOOK_S = 1.0  # a wait on a change looks again at least this often, change or not


@dataclass(slots=True)
class JobRecord:
    """One job as the scheduler keeps it, from submission to its end (under the lock)."""

    id: str
    spec: JobSpec
    log_path: str
    submitted: float
    deadline: float | None
    estimate: Estimate  # resolved once, at submission; a re-run after a stop raises it
    state: JobState = JobState.WAITING
    reason: Word | None = SchedulerReason.QUEUED
    handle: Handle | None = None
    pidfd: int = -1
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    peak_bytes: int | None = None
    peak_method: PeakMethod | None = None
    error: str | None = None
    stop_cause: JobState | None = None
    stop_reason: Word | None = None
    reruns: int = 0  # times the relief ladder stopped it and queued it again
    stop_rate: float = 0.0  # bytes/s it was growing by when stopped for pressure
    stop_frozen: bool = False  # it was suspended (frozen) when stopped for pressure
    line_bytes: int | None = None  # the guard's memory line at its last admission
    admitted_bytes: int | None = None  # the estimate its run was admitted with (reserved)
    history: list[Transition] = field(default_factory=list)
    # Monotonic seconds of each transition in ``history``: run times a wall clock's jump
    # cannot stretch (a frozen tree must not look as if it waited for hours).
    moments: list[float] = field(default_factory=list)
    worktree: Worktree | None = None


def run_times(moves: Sequence[tuple[JobState, float]], now: float) -> tuple[float, float]:
    """Seconds the current run has spent running, and seconds it has been suspended now
    (0 while it runs), from a job's ``moves`` (each state it entered, and when) at ``now``
    (seconds on the clock of the moves' times).

    The current run begins at the last move to ``running`` that is not a resumption (a
    re-run after a stop begins afresh: what the stop threw away is not counted).
    """
    begun = next(
        (
            i
            for i in range(len(moves) - 1, -1, -1)
            if moves[i][0] is JobState.RUNNING
            and (i == 0 or moves[i - 1][0] is not JobState.SUSPENDED)
        ),
        None,
    )
    if begun is None:
        return 0.0, 0.0
    ran = 0.0
    run = moves[begun:]
    for (state, at), after in zip(run, [*run[1:], None], strict=True):
        until = now if after is None else after[1]
        if state is JobState.RUNNING:
            ran += max(0.0, until - at)
    last_state, last_at = run[-1]
    suspended = max(0.0, now - last_at) if last_state is JobState.SUSPENDED else 0.0
    return ran, suspended


class JobBook:
    """Every job the scheduler knows, in submission order.

    It shares the scheduler's lock: :meth:`get`, :meth:`jobs`, :meth:`wait`
    and :meth:`flush` take it; every other method is called with it held.

    Args:
        lock: the scheduler's lock.
        wall: wall-clock seconds (timestamps people read).
        on_change: called with a job's view after each state change, outside the lock.
        clock: monotonic seconds (how long a run has run and waited).
    """

    def __init__(
        self,
        lock: threading.Lock,
        *,
        wall: Callable[[], float],
        on_change: Callable[[JobView], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self._lock = lock
        self._clock = clock
        self._changed = threading.Condition(lock)
        self._flush_lock = threading.Lock()
        self._wall = wall
        self._on_change = on_change
        self._jobs: dict[str, JobRecord] = {}
        # The finished ones' ids in the order they ended: pruning looks at these alone, not
        # at every job (a batch of thousands queued would make each round scan them all).
        self._finished: dict[str, None] = {}
        self._ended: Counter[str] = Counter()
        self._just_ended: list[JobView] = []
        self._pending_events: list[JobView] = []

    # ------------------------------------------------------- taking the lock

    def get(self, job_id: str) -> JobView:
        """The job's current view.

        Raises:
            UnknownJobError: no job has that id.
        """
        with self._lock:
            return self.view(self.find(job_id))

    def jobs(self) -> list[JobView]:
        """Every job this scheduler knows, in submission order."""
        with self._lock:
            return [self.view(j) for j in self._jobs.values()]

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """Block until the job reaches a final state (or ``timeout`` passes); return its view."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            job = self.find(job_id)
            while not job.state.final:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            return self.view(job)

    def flush(self) -> None:
        """Hand the change events recorded so far to ``on_change``, outside the lock."""
        # One flusher at a time, so every job's changes reach on_change in order.
        with self._flush_lock:
            with self._lock:
                events, self._pending_events = self._pending_events, []
            if self._on_change is not None:
                for view in events:
                    self._on_change(view)

    def resend(self, job_id: str) -> bool:
        """Hand the job's current view to ``on_change`` again (its last save failed), in
        order with the other changes; False when the job is no longer known."""
        with self._flush_lock:
            with self._lock:
                job = self._jobs.get(job_id)
                view = None if job is None else self.view(job)
            if view is None:
                return False
            if self._on_change is not None:
                self._on_change(view)
            return True

    # ------------------------------------------------------ with the lock held

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def add(self, job: JobRecord) -> None:
        """Keep a new job's record (its first transition is :meth:`record`'s)."""
        self._jobs[job.id] = job

    def find(self, job_id: str) -> JobRecord:
        """The job's record.

        Raises:
            UnknownJobError: no job has that id.
        """
        try:
            return self._jobs[job_id]
        except KeyError:
            raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id) from None

    def record(self, job: JobRecord, state: JobState, reason: Word | None) -> None:
        """Move the job to ``state``: a transition in its history and a change event."""
        job.state, job.reason = state, reason
        if state.final:
            self._finished.setdefault(job.id)
        else:
            self._finished.pop(job.id, None)
        job.history.append(Transition(state, self._wall(), reason))
        job.moments.append(self._clock())
        self._pending_events.append(self.view(job))
        self._changed.notify_all()

    def finish(self, job: JobRecord, state: JobState, reason: Word | None) -> None:
        """End the job in the final ``state``; it is counted and kept for :meth:`take_ended`."""
        job.ended = self._wall()
        self._ended[state.value] += 1
        self.record(job, state, reason)
        self._just_ended.append(self.view(job))

    def wait_while(self, busy: Callable[[], bool]) -> None:
        """Wait while ``busy()`` holds, looked at again on every change; the lock is let go
        meanwhile and held again on return."""
        while busy():
            self._changed.wait(WAIT_LOOK_S)

    def take_ended(self) -> list[JobView]:
        """The views of the jobs that ended since the last call."""
        ended, self._just_ended = self._just_ended, []
        return ended

    def ended_counts(self) -> dict[str, int]:
        """How many jobs ended, by final state."""
        return dict(self._ended)

    def prune(self) -> bool:
        """Forget the jobs that ended first beyond KEEP_FINISHED finished ones (the journal
        keeps them all); waiting and running jobs are never forgotten nor counted.

        Returns:
            Whether the book was over its bound (False: nothing to forget).
        """
        excess = len(self._finished) - KEEP_FINISHED
        if excess <= 0:
            return False
        for job_id in list(itertools.islice(self._finished, excess)):
            del self._finished[job_id]
            del self._jobs[job_id]
        return True

    def forget(self, job_id: str) -> bool:
        """Forget one finished job (its record was removed); False if it is unknown or live."""
        job = self._jobs.get(job_id)
        if job is None or not job.state.final:
            return False
        del self._jobs[job_id]
        del self._finished[job_id]
        return True

    def run_times(self, job: JobRecord) -> tuple[float, float]:
        """How long the job's current run has run, its suspensions left out, and how long
        it has been suspended now (:func:`run_times`), on the monotonic clock."""
        moves = [(t.state, at) for t, at in zip(job.history, job.moments, strict=True)]
        return run_times(moves, self._clock())

    def view(self, job: JobRecord) -> JobView:
        """A frozen snapshot of the record."""
        return JobView(
            id=job.id,
            spec=job.spec,
            state=job.state,
            reason=job.reason,
            exit_code=job.exit_code,
            submitted_at=job.history[0].at if job.history else self._wall(),
            started_at=job.started,
            ended_at=job.ended,
            log_path=job.log_path,
            peak_bytes=job.peak_bytes,
            error=job.error,
            history=tuple(job.history),
            pid=job.handle.pid if job.handle is not None else None,
            peak_method=job.peak_method,
            worktree=job.worktree,
            estimate_bytes=job.estimate.bytes,
            estimate_source=job.estimate.source,
        )

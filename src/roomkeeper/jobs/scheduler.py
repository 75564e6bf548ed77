"""The scheduler: a bounded, fair queue that launches only what the guard admits.

Admits work only when there is room.  This module is the service
that callers hold: it takes calls (submit, cancel, wait, statistics), runs the
rounds, and shuts down in order.  Its parts: :mod:`roomkeeper.jobs.queue` (the
bounds and owner rotation), :mod:`roomkeeper.jobs.book` (every job's record and
change events) and :mod:`roomkeeper.jobs.rounds` (what one round launches, stops
and reaps).  The next round starts when a job ends (the loop waits on the
jobs' pidfds) and on a short timer, because memory can come back without any
of our jobs ending.

The core is :meth:`Scheduler.tick`, one synchronous round driven by an
injected clock, so every rule is tested without sleeping; :meth:`start`
runs it on a thread that sleeps until a job ends, a call arrives, or the
next deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import select
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roomkeeper.errors import QueueFullError
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.rule import Word
from roomkeeper.jobs.book import JobBook, JobRecord
from roomkeeper.jobs.queue import FairQueue
from roomkeeper.jobs.rounds import RETRY_SECONDS, LaunchRounds
from roomkeeper.jobs.scheduler_relief import SchedulerRelief
from roomkeeper.jobs.settings import (
    SchedulerClocks,
    SchedulerListeners,
    SchedulerParts,
    SchedulerSettings,
)
from roomkeeper.jobs.spec import JobSpec, JobState, JobView, SchedulerReason
from roomkeeper.jobserver.meter import JobserverStatistics
from roomkeeper.relief.cooldown import Cooldown
from roomkeeper.relief.monitor import (
    MonitorPace,
    MonitorStatistics,
    PressureMonitor,
    arm_container,
)

log = logging.getLogger("roomkeeper")

# After the stop grace, how long closing waits for stopped trees to be reaped.
CLOSE_MARGIN_S = 10.0


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """A snapshot: counts by state and owner, refusals by reason, launches."""

    waiting: int
    running: int
    by_owner: Mapping[str, tuple[int, int]]  # owner -> (waiting, running)
    refusals: Mapping[str, int]
    launched: int
    ended: Mapping[str, int]
    last_refusal: str | None
    waiting_reason: Word | None  # why the next job in line waits, if one does
    suspended: int = 0  # of the running, how many the relief ladder has suspended


class Scheduler:
    """Owns the bounded queue and the running trees.

    Built from records (:mod:`roomkeeper.jobs.settings`), each passed whole to
    the parts that need it; only ``settings`` (its ``logs_dir``) has no default::

        Scheduler(SchedulerSettings(logs_dir="logs"))

    Args:
        settings: where output goes, the bounds and pressure variables' readers,
            the stop grace, whether the pressure monitor runs and how often it reads.
        parts: the guard, the launcher, the job user, the cooldown, worktrees and
            placement; defaults that run jobs here when omitted.
        listeners: who is told of changes, ends, refusals, launches and relief steps.
        clocks: the clocks and the CPU reading; the real ones when omitted.
    """

    def __init__(
        self,
        settings: SchedulerSettings,
        *,
        parts: SchedulerParts | None = None,
        listeners: SchedulerListeners | None = None,
        clocks: SchedulerClocks | None = None,
    ) -> None:
        parts = parts if parts is not None else SchedulerParts()
        listeners = listeners if listeners is not None else SchedulerListeners()
        clocks = clocks if clocks is not None else SchedulerClocks()
        self._settings = settings
        self._logs_dir = Path(settings.logs_dir)
        self._guard = parts.guard if parts.guard is not None else Guard()
        self._limits = settings.limits
        self._clock = clocks.clock
        self._on_end = listeners.on_end
        self._lock = threading.Lock()
        self._round = threading.Lock()  # one round at a time
        self._book = JobBook(
            self._lock, wall=clocks.wall, on_change=listeners.on_change, clock=clocks.clock
        )
        self._queue: FairQueue[JobRecord] = FairQueue()
        self._rounds = LaunchRounds(
            lock=self._lock,
            book=self._book,
            queue=self._queue,
            guard=self._guard,
            settings=settings,
            parts=parts,
            listeners=listeners,
            clocks=clocks,
        )
        self.cooldown = parts.cooldown if parts.cooldown is not None else Cooldown(clocks.clock)
        self.relief = SchedulerRelief(
            lock=self._lock,
            book=self._book,
            rounds=self._rounds,
            guard=self._guard,
            wake=self._wake,
            flush=self._book.flush,
        )
        self.monitor = PressureMonitor(
            target=self.relief,
            read=self._guard.pressure_reading,
            cooldown=self.cooldown,
            settings=settings.pressure_settings,
            pace=MonitorPace(
                clock=clocks.clock, interval=settings.monitor_interval, arm=arm_container
            ),
            on_step=listeners.on_relief,
            reruns=lambda: self._rounds.reruns,
        )
        self._thread: threading.Thread | None = None
        self._closing = False
        self._closed = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    @property
    def guard(self) -> Guard:
        """The admission guard this scheduler asks (its own when it was given none)."""
        return self._guard

    # ----------------------------------------------------------------- calls

    def submit(self, spec: JobSpec, *, job_id: str | None = None) -> JobView:
        """Queue a job, or refuse it at once when a waiting bound is reached.

        Raises:
            QueueFullError: ``queue_full`` or ``owner_queue_full``, with the bound.
            UsageError: an empty argv, or a duplicate id.
        """
        spec.validate()
        limits = self._limits()
        # Read outside the lock (it reads the container), and only when the job has no size.
        default = self._guard.estimate(None) if spec.memory_estimate is None else 0
        estimate = spec.resolve_estimate(default)
        with self._lock:
            if self._closing:
                raise QueueFullError("the scheduler is shutting down", reason="closing")
            job_id = job_id or uuid.uuid4().hex[:12]
            if job_id in self._book:
                raise QueueFullError(f"job id {job_id!r} is already taken", reason="duplicate")
            self._queue.require_room(spec.owner, limits)
            now = self._clock()
            deadline = now + spec.timeout_s if spec.timeout_s is not None else None
            log_path = str(self._logs_dir / f"{job_id}.log")
            job = JobRecord(job_id, spec, log_path, now, deadline, estimate)
            self._book.add(job)
            self._queue.push(spec.owner, job)
            self._book.record(job, JobState.WAITING, SchedulerReason.QUEUED)
        self._book.flush()
        self._wake()
        return self.get(job_id)

    def cancel(self, job_id: str) -> JobView:
        """Cancel a waiting job (it will never launch) or stop a running one's whole tree.

        Raises:
            UnknownJobError: no job has that id.
        """
        with self._lock:
            job = self._book.find(job_id)
            if job.id in self._rounds.launching:
                # Its marker is being saved: the launch ends it, never started, once the save
                # is done (its end is then saved after the marker); the lock is let go meanwhile.
                self._rounds.withdraw(job, None)
                self._book.wait_while(lambda: job.id in self._rounds.launching)
            if job.state is JobState.WAITING:
                self._queue.remove(job.spec.owner, job)
                self._guard.release(job.id)  # in case it was being judged right now
                self._book.finish(job, JobState.CANCELLED, None)
            elif job.state.live:
                self._rounds.stop(job, JobState.STOPPED)
        self._book.flush()
        self._wake()
        return self.get(job_id)

    def flush(self) -> None:
        """Hand every change recorded so far to ``on_change`` now, in order (a round does it
        too, at its end): a caller about to act on a job's saved state waits for it so."""
        self._book.flush()

    def forget(self, job_id: str) -> bool:
        """Forget a job that has ended; False if this scheduler does not know it or it is live."""
        with self._lock:
            return self._book.forget(job_id)

    def get(self, job_id: str) -> JobView:
        """The job's current view.

        Raises:
            UnknownJobError: no job has that id.
        """
        return self._book.get(job_id)

    def jobs(self) -> list[JobView]:
        """Every job this scheduler knows, in submission order."""
        return self._book.jobs()

    def resend(self, job_id: str) -> bool:
        """Hand the job's current view to the change listener again, in order with every
        other change (a save of it failed); False when the job is no longer known."""
        self._book.flush()  # what is pending goes first
        return self._book.resend(job_id)

    def next_waiting(self) -> JobView | None:
        """The waiting job whose turn comes first (the head of the first owner's line)."""
        with self._lock:
            head = next(self._queue.heads(), None)
            return None if head is None else self._book.view(head[1])

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """Block until the job reaches a final state (or ``timeout`` passes); return its view."""
        return self._book.wait(job_id, timeout)

    def statistics(self) -> SchedulerStatistics:
        """Counts by state and owner, refusals by reason, launches."""
        with self._lock:
            running = self._rounds.running
            launching = list(self._rounds.launching.values())  # still waiting: not started yet
            owners = self._queue.owners() | {j.spec.owner for j in [*running.values(), *launching]}
            by_owner = {
                o: (
                    self._queue.waiting_of(o) + sum(1 for j in launching if j.spec.owner == o),
                    sum(1 for j in running.values() if j.spec.owner == o),
                )
                for o in sorted(owners)
            }
            first = self._queue.first()
            return SchedulerStatistics(
                waiting=self._queue.waiting() + len(launching),
                running=len(running),
                by_owner={o: c for o, c in by_owner.items() if c != (0, 0)},
                refusals=dict(self._rounds.refusals),
                launched=self._rounds.launched,
                ended=self._book.ended_counts(),
                last_refusal=self._rounds.last_refusal,
                waiting_reason=first.reason if first is not None else None,
                suspended=sum(1 for j in running.values() if j.state is JobState.SUSPENDED),
            )

    def waiting(self) -> int:
        """How many jobs wait, queued or being launched (statistics' ``waiting`` alone: cheap)."""
        with self._lock:
            return self._queue.waiting() + len(self._rounds.launching)

    def ended_counts(self) -> dict[str, int]:
        """How many jobs ended so far, by final state (statistics' ``ended`` alone: cheap)."""
        with self._lock:
            return self._book.ended_counts()

    def local_footprints(self) -> int:
        """What our running jobs here hold together now (their trees' memory)."""
        return self._rounds.local_footprints()

    def local_sessions(self) -> set[int]:
        """The sessions of our running jobs here: each leader starts its own."""
        return {h.pid for h in self._rounds.local_handles() if h.pid is not None}

    def jobserver_statistics(self) -> dict[str, JobserverStatistics]:
        """Each running job's jobserver, by job id: tokens out, step estimate, why no more."""
        return self._rounds.jobservers.statistics()

    def pressure_statistics(self) -> MonitorStatistics:
        """The pressure monitor's counts (holds, suspensions, stops, re-runs) and reaction times."""
        return self.monitor.statistics()

    # ------------------------------------------------------------- the round

    def tick(self) -> float | None:
        """Run one round now: reap ended jobs, enforce deadlines, launch what fits.

        Returns:
            Seconds until the next round is due without any event, or None
            when nothing is waiting on time.
        """
        with self._round:
            with self._lock:
                handles = self._rounds.reap()
                self._rounds.expire()
                ended = self._book.take_ended()
                self._rounds.prune()
            self._rounds.close_handles(handles)
            for view in ended:
                self._ended(view)
            self._rounds.launch_round()
            with self._lock:
                due = self._rounds.next_due()
        self._book.flush()
        return due

    def _ended(self, view: JobView) -> None:
        """Tell ``on_end``; keep the job's memory reserved while what it started is pending."""
        if self._on_end is None:
            return
        try:
            pending = self._on_end(view)
        except Exception:  # a failing hook must not stop the scheduler
            log.exception("the end-of-job hook failed for job %s", view.id)
            return
        if pending is None or pending.done():
            return
        self._guard.hold(view.id, view.estimate_bytes or 0)

        def offered_again(_: concurrent.futures.Future[Any]) -> None:
            self._guard.release(view.id)
            self._wake()  # the memory is free again: waiting work may fit now

        pending.add_done_callback(offered_again)

    # -------------------------------------------------------------- the loop

    def prepare(self) -> None:
        """Make this process ready to launch trees here (it adopts its jobs' orphans, and on
        cgroup v2 moves into a leaf so that job groups can be made); :meth:`start` and the
        first launch do it too.  Idempotent."""
        self._rounds.prepare()

    def start(self) -> None:
        """Run rounds on a thread until :meth:`close`."""
        self._rounds.start()
        if self._settings.pressure:
            self.monitor.start()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="roomkeeper-scheduler", daemon=True
            )
            self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        while not self._closing:
            try:
                due = self.tick()
            except Exception:  # the loop must outlive any one bad round
                log.exception("a scheduling round failed; trying again shortly")
                due = RETRY_SECONDS
            with self._lock:
                fds = [j.pidfd for j in self._rounds.running.values()]
                polling = any(fd < 0 for fd in fds)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            for fd in fds:
                if fd >= 0:
                    poller.register(fd, select.POLLIN)
            timeout = 0.05 if polling else due  # no pidfd: poll the processes instead
            poller.poll(None if timeout is None else max(1, int(timeout * 1000)))
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_r, 4096):
                    pass

    def close(self, *, grace: float | None = None, within: float | None = None) -> None:
        """Stop admitting, cancel waiting jobs, stop every running tree, and wait for them.

        Args:
            grace: SIGTERM to SIGKILL for each tree; the scheduler's own when None.
            within: the most seconds closing waits for the stopped trees to be
                reaped (a caller with a deadline of its own says it); the grace
                plus CLOSE_MARGIN_S when None.  Jobs not reaped by then are
                left to their lifeline and to the next start's recovery.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing = True
            handles = self._rounds.reap()  # a job that already ended is not "stopped"
            self._cancel_what_waits()
            stoppers = self._rounds.stop_all(grace)
        self._wake()
        # Every wait below has one deadline: a tree that cannot be reaped (a stuck
        # process, a lost node) must not keep a Ctrl-C or a shutdown from ending.
        allowed = (self._rounds.stop_grace + CLOSE_MARGIN_S) if within is None else within
        deadline = time.monotonic() + allowed
        self.monitor.close()  # before the trees stop: their end is no pressure to relieve
        if self._thread is not None:
            self._thread.join(timeout=_left(deadline))
        for stopper in stoppers:
            stopper.join(timeout=_left(deadline))
        self._rounds.close_handles(handles)
        while True:
            with self._lock:
                left = [*self._rounds.running, *self._rounds.launching]
            if not left:
                break
            if time.monotonic() >= deadline:
                log.warning(
                    "closing: %d job(s) did not end within %.1f s of their stop (%s); "
                    "their trees are left to their lifeline",
                    len(left),
                    allowed,
                    ", ".join(left[:5]),
                )
                break
            if not self._tick_before(deadline):
                break
            time.sleep(0.01)
        self._tick_before(deadline + 1.0)  # end-of-job hooks of jobs cancelled above
        self._rounds.close()
        self._book.flush()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _cancel_what_waits(self) -> None:
        """For a shutdown (lock held): cancel the waiting jobs now, and the launching ones once
        their marker's save is done; reason ``shutdown``, an orderly stop, not a person's
        cancel (recovery may defer it)."""
        for job in self._queue.take(lambda j: True):
            self._book.finish(job, JobState.CANCELLED, SchedulerReason.SHUTDOWN)
        for job in self._rounds.launching.values():
            self._rounds.withdraw(job, SchedulerReason.SHUTDOWN)

    def _tick_before(self, deadline: float) -> bool:
        """One round, unless the loop's thread is stuck in one past ``deadline``."""
        if not self._round.acquire(timeout=_left(deadline)):
            log.warning("closing: the scheduler's last round did not end; not waiting for it")
            return False
        self._round.release()
        self.tick()
        return True


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (monotonic), never negative."""
    return max(0.0, deadline - time.monotonic())

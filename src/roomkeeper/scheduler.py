"""The scheduler: a bounded, fair queue that launches only what the guard admits.

Seed 002's "admit work only when there is room": at most 32 jobs wait (8 per
owner) and 4 run (2 per owner); owner rotation keeps one owner from taking
every free slot; the guard is asked before every launch.  As in seed 000, a
refusal ends the launch round and the refused job keeps its place, so a
large job is not starved by smaller ones behind it.  The next round starts
when a job ends (the loop waits on the jobs' pidfds) and on a short timer,
because memory can come back without any of our jobs ending.

The core is :meth:`Scheduler.tick`, one synchronous round driven by an
injected clock, so every rule is tested without sleeping; :meth:`start`
runs it on a thread that sleeps until a job ends, a call arrives, or the
next deadline.

Cancellation and launch are linearized: the guard is asked without the
lock held, and the launch re-checks, under the lock, that the job is still
waiting.  A cancel that lands while the job is being judged therefore
removes its permission to launch; a cancel after the spawn stops its tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from roomkeeper.admission import Decision, Guard, Reason
from roomkeeper.config import QueueSettings, read_queue_settings
from roomkeeper.errors import QueueFullError, UnknownJobError
from roomkeeper.jobs import JobSpec, JobState, JobView, Transition
from roomkeeper.launch import LaunchSpec, launch
from roomkeeper.process import LaunchError, Lifeline, become_subreaper

log = logging.getLogger("roomkeeper")

RETRY_SECONDS = 0.5  # how soon a refused round is tried again without any job ending
STOP_GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL when roomkeeper stops a tree
CPU_READ_SECONDS = 0.25  # CPU pressure is read at most this often
KEEP_FINISHED = 1000  # finished jobs kept in memory; the journal keeps every one


class Handle(Protocol):
    """What the scheduler needs of a launched process tree (see :mod:`roomkeeper.process`)."""

    pid: int

    def poll(self) -> int | None: ...
    def footprint_bytes(self) -> int: ...
    def peak_bytes(self) -> int: ...
    def stop(self, grace: float = ...) -> int | None: ...
    def close(self) -> None: ...


Launcher = Callable[[str, LaunchSpec], Handle]


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one round.  ``None`` per-owner caps mean one owner (a batch)."""

    max_waiting: int
    max_waiting_per_owner: int | None
    max_running: int
    max_running_per_owner: int | None
    cpu_pressure_percent: float
    worker_nice: int
    hold: bool = False  # launch nothing (relief, recovery mode); waiting jobs say "held"

    @classmethod
    def from_settings(cls, s: QueueSettings) -> Limits:
        """The seed's bounds as the environment sets them."""
        return cls(
            s.max_waiting,
            s.max_waiting_per_owner,
            s.max_running,
            s.max_running_per_owner,
            s.cpu_pressure_percent,
            s.worker_nice,
        )


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
    waiting_reason: Reason | None  # why the next job in line waits, if one does


@dataclass(slots=True)
class _Job:
    id: str
    spec: JobSpec
    log_path: str
    submitted: float
    deadline: float | None
    state: JobState = JobState.WAITING
    reason: Reason | None = Reason.QUEUED
    handle: Handle | None = None
    pidfd: int = -1
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    peak_bytes: int | None = None
    error: str | None = None
    stop_cause: JobState | None = None
    stop_reason: Reason | None = None
    history: list[Transition] = field(default_factory=list)


def cpu_pressure_percent() -> float | None:
    """CPU pressure now: PSI ``cpu`` some avg10, else load per core x 100, else None."""
    from roomkeeper.resources import load_per_core, read_pressure

    pressure, _ = read_pressure("cpu")
    if pressure is not None:
        return pressure.some.avg10
    load = load_per_core()
    return None if load is None else load * 100


class Scheduler:
    """Owns the bounded queue and the running trees.

    Args:
        logs_dir: where each job's output file goes (``<id>.log``).
        guard: the admission guard; a new :class:`Guard` when omitted.
        limits: returns the bounds for a round; read from ``ROOMKEEPER_*`` on
            every round when omitted (no restart to reconfigure).
        launcher: starts a tree; :func:`roomkeeper.launch.launch` with a
            lifeline when omitted.
        cpu_percent: CPU pressure in percent, or None when unknown.
        clock: monotonic seconds (deadlines).
        wall: wall-clock seconds (timestamps people read).
        on_change: called with a job's view after each state change, outside the lock.
        on_end: called for each job that ended, outside the lock and before the
            next launch round (a release hook runs before its slot is offered).
        on_refusal: called with the job id and the guard's refusal (every refused round).
        before_launch: called with the job's view just before its spawn, lock held; it
            writes the durable pending marker (seed 002: save first).  If it
            raises, the job is not started and ends as failed.
        stop_grace: seconds between SIGTERM and SIGKILL when a tree is stopped.
    """

    def __init__(
        self,
        *,
        logs_dir: str | os.PathLike[str],
        guard: Guard | None = None,
        limits: Callable[[], Limits] | None = None,
        launcher: Launcher | None = None,
        cpu_percent: Callable[[], float | None] = cpu_pressure_percent,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_change: Callable[[JobView], None] | None = None,
        on_end: Callable[[JobView], None] | None = None,
        on_refusal: Callable[[str, Decision], None] | None = None,
        before_launch: Callable[[JobView], None] | None = None,
        stop_grace: float = STOP_GRACE_SECONDS,
    ) -> None:
        self._logs_dir = Path(logs_dir)
        self._guard = guard if guard is not None else Guard()
        self._limits = limits or (lambda: Limits.from_settings(read_queue_settings()))
        self._lifeline: Lifeline | None = None
        if launcher is None:
            # Orphans of our jobs reparent to us, so a tree stays findable.
            become_subreaper()
            self._lifeline = Lifeline()
            lifeline = self._lifeline
            launcher = lambda job_id, spec: launch(job_id, spec, lifeline=lifeline)  # noqa: E731
        self._launcher = launcher
        self._cpu_percent = cpu_percent
        self._cpu_value: float | None = None
        self._cpu_read_at = float("-inf")
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._on_end = on_end
        self._on_refusal = on_refusal
        self._before_launch = before_launch
        self._just_ended: list[JobView] = []
        self._stop_grace = stop_grace
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._round = threading.Lock()  # one round at a time
        self._flush_lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._queues: dict[str, deque[_Job]] = {}  # owner -> waiting jobs, oldest first
        self._turn: deque[str] = deque()  # owner rotation: the next owner to serve is first
        self._running: dict[str, _Job] = {}
        self._refusals: Counter[str] = Counter()
        self._ended: Counter[str] = Counter()
        self._launched = 0
        self._last_refusal: str | None = None
        self._pending_events: list[JobView] = []
        self._stoppers: list[threading.Thread] = []
        self._thread: threading.Thread | None = None
        self._closing = False
        self._closed = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # ----------------------------------------------------------------- calls

    def submit(self, spec: JobSpec, *, job_id: str | None = None) -> JobView:
        """Queue a job, or refuse it at once when a waiting bound is reached.

        Raises:
            QueueFullError: ``queue_full`` or ``owner_queue_full``, with the bound.
            UsageError: an empty argv, or a duplicate id.
        """
        spec.check()
        limits = self._limits()
        with self._lock:
            if self._closing:
                raise QueueFullError("the scheduler is shutting down", reason="closing")
            job_id = job_id or uuid.uuid4().hex[:12]
            if job_id in self._jobs:
                raise QueueFullError(f"job id {job_id!r} is already taken", reason="duplicate")
            waiting = sum(len(q) for q in self._queues.values())
            if waiting >= limits.max_waiting:
                raise QueueFullError(
                    f"{waiting} jobs are waiting, the most ROOMKEEPER_MAX_WAITING allows "
                    f"({limits.max_waiting}); try again when some have started",
                    reason=Reason.QUEUE_FULL.value,
                    owner=spec.owner,
                )
            queue = self._queues.setdefault(spec.owner, deque())
            if (
                limits.max_waiting_per_owner is not None
                and len(queue) >= limits.max_waiting_per_owner
            ):
                raise QueueFullError(
                    f"owner {spec.owner!r} has {len(queue)} jobs waiting, the most "
                    f"ROOMKEEPER_MAX_WAITING_PER_OWNER allows ({limits.max_waiting_per_owner})",
                    reason=Reason.OWNER_QUEUE_FULL.value,
                    owner=spec.owner,
                )
            now = self._clock()
            deadline = now + spec.timeout_s if spec.timeout_s is not None else None
            job = _Job(job_id, spec, str(self._logs_dir / f"{job_id}.log"), now, deadline)
            self._jobs[job_id] = job
            queue.append(job)
            if spec.owner not in self._turn:
                self._turn.append(spec.owner)
            self._record(job, JobState.WAITING, Reason.QUEUED)
        self._flush_events()
        self._wake()
        return self.get(job_id)

    def cancel(self, job_id: str) -> JobView:
        """Cancel a waiting job (it will never launch) or stop a running one's whole tree.

        Raises:
            UnknownJobError: no job has that id.
        """
        with self._lock:
            job = self._job(job_id)
            if job.state is JobState.WAITING:
                self._dequeue(job)
                self._guard.release(job.id)  # in case it was being judged right now
                self._finish(job, JobState.CANCELLED, None)
            elif job.state is JobState.RUNNING:
                self._begin_stop(job, JobState.STOPPED)
        self._flush_events()
        self._wake()
        return self.get(job_id)

    def get(self, job_id: str) -> JobView:
        """The job's current view.

        Raises:
            UnknownJobError: no job has that id.
        """
        with self._lock:
            return self._view(self._job(job_id))

    def jobs(self) -> list[JobView]:
        """Every job this scheduler knows, in submission order."""
        with self._lock:
            return [self._view(j) for j in self._jobs.values()]

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """Block until the job reaches a final state (or ``timeout`` passes); return its view."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            job = self._job(job_id)
            while not job.state.final:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            return self._view(job)

    def statistics(self) -> SchedulerStatistics:
        """Counts by state and owner, refusals by reason, launches."""
        with self._lock:
            owners = set(self._queues) | {j.spec.owner for j in self._running.values()}
            by_owner = {
                o: (
                    len(self._queues.get(o, ())),
                    sum(1 for j in self._running.values() if j.spec.owner == o),
                )
                for o in sorted(owners)
            }
            return SchedulerStatistics(
                waiting=sum(len(q) for q in self._queues.values()),
                running=len(self._running),
                by_owner={o: c for o, c in by_owner.items() if c != (0, 0)},
                refusals=dict(self._refusals),
                launched=self._launched,
                ended=dict(self._ended),
                last_refusal=self._last_refusal,
                waiting_reason=next((q[0].reason for q in self._queues.values() if q), None),
            )

    # ------------------------------------------------------------- the round

    def tick(self) -> float | None:
        """Run one round now: reap ended jobs, enforce deadlines, launch what fits.

        Returns:
            Seconds until the next round is due without any event, or None
            when nothing is waiting on time.
        """
        with self._round:
            with self._lock:
                handles = self._reap()
                self._expire()
                ended, self._just_ended = self._just_ended, []
                self._prune()
            self._close_handles(handles)
            if self._on_end is not None:
                for view in ended:
                    try:
                        self._on_end(view)
                    except Exception:  # a failing hook must not stop the scheduler
                        log.exception("the end-of-job hook failed for job %s", view.id)
            self._launch_round()
            with self._lock:
                due = self._next_due()
        self._flush_events()
        return due

    def _reap(self) -> list[Handle]:
        """Record jobs whose leader exited; return their handles, to close outside the lock."""
        ended: list[Handle] = []
        for job in list(self._running.values()):
            assert job.handle is not None
            code = job.handle.poll()
            if code is None:
                continue
            del self._running[job.id]
            job.exit_code = code
            with contextlib.suppress(Exception):
                job.peak_bytes = job.handle.peak_bytes()
            ended.append(job.handle)
            if job.pidfd >= 0:
                os.close(job.pidfd)
                job.pidfd = -1
            self._guard.release(job.id)
            self._finish(job, job.stop_cause or JobState.EXITED, job.stop_reason)
        return ended

    def _close_handles(self, handles: list[Handle]) -> None:
        # Closing waits for a stopping tree and removes its cgroup: never under the lock.
        for handle in handles:
            try:
                handle.close()
            except Exception:
                log.exception("closing a finished job's process tree failed")

    def _expire(self) -> None:
        now = self._clock()
        for queue in self._queues.values():
            for job in [j for j in queue if j.deadline is not None and now >= j.deadline]:
                queue.remove(job)
                self._finish(job, JobState.EXPIRED, None)
        for job in self._running.values():
            if job.deadline is not None and now >= job.deadline and job.stop_cause is None:
                self._begin_stop(job, JobState.TIMED_OUT)

    def _launch_round(self) -> None:
        limits = self._limits()
        while True:
            with self._lock:
                job, blocked = self._next_candidate(limits)
                if job is None:
                    self._explain(blocked)
                    return
                young = [j for j in self._running.values() if j.handle is not None]
            for other in young:  # measured reservations: never count a job twice
                with contextlib.suppress(Exception):
                    assert other.handle is not None
                    self._guard.report_measured(other.id, other.handle.footprint_bytes())
            decision = self._guard.admit(
                job.id, memory_bytes=job.spec.memory_bytes, disk_bytes=job.spec.disk_bytes
            )
            with self._lock:
                if job.state is not JobState.WAITING:  # cancelled while it was judged
                    self._guard.release(job.id)
                    continue
                if not decision.admit:
                    self._refusals[decision.reason.value] += 1
                    self._last_refusal = decision.summary
                    self._explain(decision.reason)
                    break
                self._start(job, limits)
                continue
            if self._on_refusal is not None:
                self._on_refusal(job.id, decision)
            return

    def _next_candidate(self, limits: Limits) -> tuple[_Job | None, Reason]:
        """The head of the next owner in turn that may launch, or why none may."""
        if limits.hold:
            return None, Reason.HELD
        if len(self._running) >= limits.max_running:
            return None, Reason.SLOTS
        blocked = Reason.QUEUED
        for owner in list(self._turn):
            queue = self._queues.get(owner)
            if not queue:
                continue
            running = sum(1 for j in self._running.values() if j.spec.owner == owner)
            if limits.max_running_per_owner is not None and running >= limits.max_running_per_owner:
                blocked = Reason.OWNER_SLOTS
                continue
            if self._running:
                cpu = self._cpu_now()
                if cpu is not None and cpu > limits.cpu_pressure_percent:
                    self._refusals[Reason.CPU.value] += 1
                    return None, Reason.CPU
            return queue[0], blocked
        return None, blocked

    def _cpu_now(self) -> float | None:
        """CPU pressure, read at most every CPU_READ_SECONDS.

        PSI's avg10 is itself a ten-second average: reading it again for
        every launch of a fast batch costs more than it tells.
        """
        now = self._clock()
        if now - self._cpu_read_at >= CPU_READ_SECONDS:
            self._cpu_value, self._cpu_read_at = self._cpu_percent(), now
        return self._cpu_value

    def _start(self, job: _Job, limits: Limits) -> None:
        """Spawn the job (lock held, so a cancel is either before or after this)."""
        self._dequeue(job)
        spec = LaunchSpec(
            argv=job.spec.argv,
            log_path=job.log_path,
            cwd=job.spec.cwd,
            env=job.spec.env,
            nice=limits.worker_nice,
            shell=job.spec.shell,
        )
        try:
            if self._before_launch is not None:
                try:
                    self._before_launch(self._view(job))
                except Exception as err:
                    raise LaunchError(
                        job.id, f"not started: its pending marker could not be saved ({err})"
                    ) from err
            Path(job.log_path).parent.mkdir(parents=True, exist_ok=True)
            handle = self._launcher(job.id, spec)
        except (LaunchError, OSError, ValueError) as err:
            self._guard.release(job.id)
            job.error = str(err)
            self._finish(job, JobState.FAILED, None)
            return
        job.handle = handle
        job.started = self._wall()
        try:
            job.pidfd = os.pidfd_open(handle.pid)
        except (AttributeError, OSError):
            job.pidfd = -1  # the loop falls back to polling
        self._running[job.id] = job
        self._launched += 1
        # Rotation: this owner goes to the back of the line.
        self._turn.remove(job.spec.owner)
        self._turn.append(job.spec.owner)
        self._record(job, JobState.RUNNING, None)

    def _explain(self, blocked: Reason) -> None:
        """Give every waiting job its current reason (state changes only are recorded)."""
        for queue in self._queues.values():
            for job in queue:
                job.reason = blocked

    def _prune(self) -> None:
        """Forget the oldest finished jobs beyond KEEP_FINISHED (the journal keeps them all)."""
        excess = len(self._jobs) - KEEP_FINISHED - len(self._running)
        if excess <= 0:
            return
        for job_id in [i for i, j in self._jobs.items() if j.state.final][:excess]:
            del self._jobs[job_id]
        for owner in [o for o, q in self._queues.items() if not q]:
            if not any(j.spec.owner == owner for j in self._running.values()):
                del self._queues[owner]
                self._turn.remove(owner)
        self._stoppers = [t for t in self._stoppers if t.is_alive()]

    def _next_due(self) -> float | None:
        now = self._clock()
        live = [*self._running.values(), *(j for q in self._queues.values() for j in q)]
        dues = [j.deadline - now for j in live if j.deadline is not None]
        if any(self._queues.values()):
            dues.append(RETRY_SECONDS)
        return max(0.0, min(dues)) if dues else None

    # ------------------------------------------------------------ helpers

    def _job(self, job_id: str) -> _Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id) from None

    def _dequeue(self, job: _Job) -> None:
        queue = self._queues.get(job.spec.owner)
        if queue is not None and job in queue:
            queue.remove(job)

    def _begin_stop(self, job: _Job, cause: JobState) -> None:
        """Stop the tree on a side thread (SIGTERM, grace, SIGKILL); the round reaps it."""
        if job.stop_cause is not None or job.handle is None:
            return
        job.stop_cause = cause
        handle = job.handle
        stopper = threading.Thread(
            target=handle.stop, args=(self._stop_grace,), name=f"stop-{job.id}", daemon=True
        )
        stopper.start()
        self._stoppers.append(stopper)

    def _finish(self, job: _Job, state: JobState, reason: Reason | None) -> None:
        job.ended = self._wall()
        self._ended[state.value] += 1
        self._record(job, state, reason)
        self._just_ended.append(self._view(job))

    def _record(self, job: _Job, state: JobState, reason: Reason | None) -> None:
        job.state, job.reason = state, reason
        job.history.append(Transition(state, self._wall(), reason))
        self._pending_events.append(self._view(job))
        self._changed.notify_all()

    def _flush_events(self) -> None:
        # One flusher at a time, so every job's changes reach on_change in order.
        with self._flush_lock:
            with self._lock:
                events, self._pending_events = self._pending_events, []
            if self._on_change is not None:
                for view in events:
                    self._on_change(view)

    def _view(self, job: _Job) -> JobView:
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
        )

    # -------------------------------------------------------------- the loop

    def start(self) -> None:
        """Run rounds on a thread until :meth:`close`."""
        if self._lifeline is not None:
            self._lifeline.start()  # now, so the first launch does not wait for it
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
                fds = [j.pidfd for j in self._running.values()]
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

    def close(self, *, grace: float | None = None) -> None:
        """Stop admitting, cancel waiting jobs, stop every running tree, and wait for them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing = True
            handles = self._reap()  # a job that already ended is not "stopped"
            # Reason "shutdown": an orderly stop, not a person's cancel (recovery may defer it).
            for queue in self._queues.values():
                for job in list(queue):
                    queue.remove(job)
                    self._finish(job, JobState.CANCELLED, Reason.SHUTDOWN)
            self._stop_grace = self._stop_grace if grace is None else grace
            for job in self._running.values():
                if job.stop_cause is None:
                    job.stop_reason = Reason.SHUTDOWN
                self._begin_stop(job, JobState.STOPPED)
            stoppers = list(self._stoppers)
        self._wake()
        if self._thread is not None:
            self._thread.join()
        for stopper in stoppers:
            stopper.join()
        self._close_handles(handles)
        while True:
            with self._lock:
                if not self._running:
                    break
            self.tick()
            time.sleep(0.01)
        self.tick()  # end-of-job hooks of jobs cancelled above
        if self._lifeline is not None:
            self._lifeline.close()
        self._flush_events()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def batch_limits(max_running: int, worker_nice: int, cpu_pressure_percent: float) -> Limits:
    """A batch is one owner: no per-owner caps, and lines are fed as room frees."""
    return Limits(
        max_waiting=10**9,
        max_waiting_per_owner=None,
        max_running=max_running,
        max_running_per_owner=None,
        cpu_pressure_percent=cpu_pressure_percent,
        worker_nice=worker_nice,
    )

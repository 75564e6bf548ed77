"""The scheduler's rounds: launch what the guard admits, then stop and reap what runs.

The guard is asked before every launch.  A refusal ends the
launch round and the refused job keeps its place, so a large job is not
starved by smaller ones behind it.  The running bounds (4 in all, 2 per
owner) and CPU pressure hold a round back before the guard is asked.

Cancellation and launch are linearized: the guard is asked without the
lock held, and the launch re-checks, under the lock, that the job is still
waiting.  A cancel that lands while the job is being judged therefore
removes its permission to launch; a cancel after the spawn stops its tree.

Save first, and no disk wait under the lock: an admitted job is taken out of
the queue and marked *launching* under the lock; its pending marker is saved
(``before_launch``, a journal commit that may take seconds on a slow disk)
without it, so the pressure monitor and the API never wait on the disk; then
the lock is taken again to spawn it.  A cancel or a shutdown that comes
while the marker is saved does not end the job itself (its end would be
saved before the marker, and the marker would outlive it): it marks the job,
and the launch ends it ``cancelled`` once the save is done, never started.

Disk is the one resource roomkeeper can free itself: a refusal
for disk gets one worktree prune first (``reclaim_disk``), which stops at the guard's
own line, and then the guard judges again.  A job that asked for a git
worktree gets it after admission and before its command starts
(``prepare``), outside the lock because git takes its time; a job cancelled
meanwhile does not start.

Jobs that run elsewhere (the Ray backend) come with a ``placement``,
asked instead of the guard; the gateway's own CPU pressure does not hold
them (they use other machines' CPUs).  A placement may set a job *aside*
(no node of the cluster is that large): it waits with that said, and the
jobs behind it, of its owner and of others, are judged meanwhile; it is
judged again every ``ASIDE_SECONDS``, so a node that joins is seen.  Their
handles may end in a
:class:`~roomkeeper.jobs.handle.Settlement`: refused by their node's guard
(the job goes back to the head of its owner's line and waits), lost with
their node (``uncertain``, never re-run), or failed to start there.

A :class:`LaunchRounds` owns the running jobs; the queue and the job book are the
scheduler's, shared with it, and so is the lock.  It takes the scheduler's
records (:mod:`roomkeeper.jobs.settings`) as they are.  When and how often rounds
run is :mod:`roomkeeper.jobs.scheduler`'s.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from roomkeeper.errors import LaunchError, WorktreeError
from roomkeeper.guard.admission import Guard, Rerun
from roomkeeper.guard.rule import Decision, Reason, Word
from roomkeeper.jobs.book import JobBook, JobRecord
from roomkeeper.jobs.cores import CoreUse
from roomkeeper.jobs.handle import Handle, RemoteEnd, Settlement
from roomkeeper.jobs.queue import FairQueue, Limits
from roomkeeper.jobs.reruns import is_last_run, queued_again, rerun_estimate, stopped_for_others
from roomkeeper.jobs.settings import (
    SchedulerClocks,
    SchedulerListeners,
    SchedulerParts,
    SchedulerSettings,
)
from roomkeeper.jobs.spec import Estimate, EstimateSource, JobState, JobView, SchedulerReason
from roomkeeper.jobserver.meter import Jobservers
from roomkeeper.jobserver.pool import JobserverError
from roomkeeper.kernel.delegation import prepare_job_groups
from roomkeeper.processes.launch import LaunchSpec, launch
from roomkeeper.processes.lifeline import Lifeline
from roomkeeper.processes.orphans import become_subreaper
from roomkeeper.relief.ladder import PressureReason
from roomkeeper.worktrees.request import Worktree

log = logging.getLogger("roomkeeper")

# How soon a refused round is tried again without any job ending (a round the cores held:
# when the first open window of a running job closes, CoreUse.next_window_in).
RETRY_SECONDS = 0.5
CPU_READ_SECONDS = 0.25  # CPU pressure is read at most this often
MEASURE_EVERY_S = 0.05  # a young job's footprint is read again for a launch at most this often
ASIDE_SECONDS = 2.0  # a job set aside (nothing that exists could hold it) is judged again after


class _Acted(enum.Enum):
    """What became of a judged job."""

    DONE = enum.auto()  # failed, or cancelled meanwhile: the round goes on
    LAUNCHING = enum.auto()  # admitted: its marker is saved next, then it starts
    REFUSED = enum.auto()  # it keeps its place (or waits aside)


class LaunchRounds:
    """Launches the queue's jobs the guard admits, and stops and reaps the running ones.

    Methods are called with the shared lock held, except :meth:`launch_round`
    (it takes the lock itself) and :meth:`close_handles` (never under it).
    Building one changes nothing outside it: :meth:`start` (or the first
    launch round) makes this process ready to launch trees here.

    Attributes:
        running: the running jobs by id, in launch order.
        launching: admitted jobs whose pending marker is being saved (out of the
            queue, still ``waiting``, not yet started).
        refusals: refused rounds by reason.
        launched: how many jobs were started.
        last_refusal: the guard's last refusal, in words.
    """

    def __init__(
        self,
        *,
        lock: threading.Lock,
        book: JobBook,
        queue: FairQueue[JobRecord],
        guard: Guard,
        settings: SchedulerSettings,
        parts: SchedulerParts,
        listeners: SchedulerListeners,
        clocks: SchedulerClocks,
    ) -> None:
        self._settings = settings
        self._parts = parts
        self._listeners = listeners
        self._clocks = clocks
        self._lock = lock
        self._book = book
        self._queue = queue
        self._guard = guard
        self._lifeline: Lifeline | None = None
        self._ready = parts.launcher is not None  # a launcher of the caller's needs nothing
        self._ready_lock = threading.Lock()
        launcher = parts.launcher
        if launcher is None:
            self._lifeline = Lifeline()
            lifeline = self._lifeline
            launcher = lambda job_id, spec: launch(job_id, spec, lifeline=lifeline)  # noqa: E731
        self._launcher = launcher
        self._cpu_value: float | None = None
        self._cpu_read_at = float("-inf")
        self._core_use = CoreUse(self._clocks.clock, self._clocks.cores)
        self._stop_grace = settings.stop_grace
        self.running: dict[str, JobRecord] = {}
        self.launching: dict[str, JobRecord] = {}
        self.refusals: Counter[str] = Counter()
        self.launched = 0
        self._aside: dict[str, float] = {}  # job id -> when it was set aside
        self.last_refusal: str | None = None
        self._stoppers: list[threading.Thread] = []
        self._measured_at: dict[str, float] = {}  # when each young job was last read for a launch
        # Local trees being stopped: a leader may die of its SIGTERM before the members that
        # hold the memory do, so its job can be reaped while memory is still going back.
        self._local_stoppers: list[threading.Thread] = []
        self.pressure_hold = False  # the relief ladder holds launches (reason "pressure")
        # The last launch round ended on a job refused for memory: it waits for room.
        self.memory_waits = False
        # This launch round was held by our running jobs' use of the cores (not by CPU
        # pressure, a ten-second average that nothing changes sooner than RETRY_SECONDS):
        # false at each round's start, and a round ends as soon as the cores hold it.
        self._held_by_cores = False
        # Every job's tokens are judged by this scheduler's one guard, beside its admissions;
        # while a job waits for memory, running builds take no more tokens (they would take
        # the room it waits for, one step at a time).
        self.jobservers = Jobservers(
            guard, pressure=lambda: self.pressure_hold, others_wait=lambda: self.memory_waits
        )
        self.reruns = 0  # restartable jobs queued again after a stop for pressure

    def start(self) -> None:
        """Make this process ready to launch trees here, and start the lifeline."""
        self.prepare()
        if self._lifeline is not None:
            self._lifeline.start()  # now, so the first launch does not wait for it

    def prepare(self) -> None:
        """Once, before the first launch here: adopt orphans, and set up job groups."""
        with self._ready_lock:  # held throughout: a second caller waits until it is done
            if self._ready:
                return
            # Orphans of our jobs reparent to us, so a tree stays findable.
            become_subreaper()
            # Now, before the guard's first decision says where job groups go
            # (cgroup v2: roomkeeper first moves into a leaf, where it may).
            prepare_job_groups()
            self._ready = True

    def close(self) -> None:
        """Remove every jobserver, and close the lifeline if this runner launches with one."""
        self.jobservers.shutdown()
        if self._lifeline is not None:
            self._lifeline.close()

    # ------------------------------------------------------------- the round

    def reap(self) -> list[Handle]:
        """Record jobs whose leader exited; return their handles, to close outside the lock."""
        ended: list[Handle] = []
        if len(self._measured_at) > len(self.running):  # only running jobs are read
            self._measured_at = {i: t for i, t in self._measured_at.items() if i in self.running}
        for job in list(self.running.values()):
            assert job.handle is not None
            code = job.handle.poll()
            if code is None:
                continue
            del self.running[job.id]
            ended.append(job.handle)
            if job.pidfd >= 0:
                os.close(job.pidfd)
                job.pidfd = -1
            # Only a run that ended on its own says what work like it holds.
            self._guard.release(job.id, ended_alone=job.stop_cause is None)
            if job.spec.jobserver:
                _say(job.log_path, self.jobservers.close(job.id))
            settled = job.handle.settlement()
            if settled is not None:
                self._settle(job, settled)
                continue
            job.exit_code = code
            with contextlib.suppress(Exception):
                peak = job.handle.peak()
                job.peak_bytes, job.peak_method = peak.bytes, peak.method
            if not self._rerun(job):
                self._book.finish(job, job.stop_cause or JobState.EXITED, job.stop_reason)
        return ended

    def _settle(self, job: JobRecord, settled: Settlement) -> None:
        """A remote tree that ended without an exit status of its own (lock held).

        Refused by the node's guard: the job never started, so it goes back to
        the head of its owner's line and waits, with the node's reason, unless a
        cancel or a deadline already ended it.  Lost mid-job: it may have done
        part of its work, so it is ``uncertain`` and never run again blindly.
        """
        if settled.end is RemoteEnd.PRESSURE:
            self._stopped_on_node(job, settled)
            return
        if settled.end is RemoteEnd.DEADLINE:  # its node's timer came first: same deadline
            self._book.finish(job, job.stop_cause or JobState.TIMED_OUT, job.stop_reason)
            return
        if settled.end is RemoteEnd.REFUSED and job.stop_cause is None:
            job.handle, job.started = None, None
            reason = settled.reason or Reason.MEMORY
            self.refusals[reason.value] += 1
            self.last_refusal = settled.summary
            self._queue.push_front(job.spec.owner, job)
            self._book.record(job, JobState.WAITING, reason)
            on_refusal = self._listeners.on_refusal
            if on_refusal is not None:
                on_refusal(job.id, Decision(job.id, False, reason, settled.summary))
            return
        if settled.end is RemoteEnd.REFUSED:  # cancelled or timed out before it could start
            state = JobState.CANCELLED if job.stop_cause is JobState.STOPPED else job.stop_cause
            self._book.finish(job, state or JobState.CANCELLED, job.stop_reason)
            return
        job.error = settled.summary
        if settled.end is RemoteEnd.FAILED:
            self._book.finish(job, JobState.FAILED, None)
        elif job.stop_cause is not None:  # its runner was ended to stop it: it is stopped
            self._book.finish(job, job.stop_cause, job.stop_reason)
        else:
            self._book.finish(job, JobState.UNCERTAIN, None)

    def _stopped_on_node(self, job: JobRecord, settled: Settlement) -> None:
        """Its node's ladder stopped it (lock held): as a local tree stopped for memory
        pressure, it is queued again with a grown estimate when it may run again, else it
        ends ``stopped`` with reason ``memory_pressure``."""
        with contextlib.suppress(Exception):
            assert job.handle is not None
            peak = job.handle.peak()
            job.peak_bytes, job.peak_method = peak.bytes, peak.method
        if job.stop_cause is None:  # not cancelled or timed out meanwhile
            job.stop_cause, job.stop_reason = JobState.STOPPED, PressureReason.MEMORY_PRESSURE
            job.stop_rate = settled.rate
        if settled.never_fits:
            job.error = settled.summary
        if not self._rerun(job):
            self._book.finish(job, job.stop_cause, job.stop_reason)

    def _rerun(self, job: JobRecord) -> bool:
        """Queue restartable work stopped for pressure again, at the head of its owner's line,
        with an estimate grown from what its run showed (:mod:`roomkeeper.jobs.reruns`).

        At most ROOMKEEPER_PRESSURE_RETRIES times; the last run is admitted with
        its worst case reserved.  Anything else is never re-run silently.
        """
        if (
            job.stop_reason is not PressureReason.MEMORY_PRESSURE
            or job.stop_cause is not JobState.STOPPED
            or job.error is not None  # it alone outgrows the container: never again
            or not queued_again(
                restartable=job.spec.restartable,
                reruns=job.reruns,
                retries=self._settings.retries(),
            )
        ):
            return False
        ran_s, _ = self._book.run_times(job)  # its growth's time: suspensions left out
        rate, peak = job.stop_rate, job.peak_bytes or 0
        estimate = rerun_estimate(
            failed=job.estimate.bytes,
            peak=peak,
            rate=rate,
            ran_s=ran_s,
            line=job.line_bytes,
            frozen=job.stop_frozen,
        )
        kept = stopped_for_others(frozen=job.stop_frozen, peak=peak, failed=job.estimate.bytes)
        job.spec = replace(job.spec, memory_bytes=estimate)
        job.estimate = Estimate(estimate, EstimateSource.RERUN)
        job.reruns += 1
        self.reruns += 1
        job.handle, job.started, job.exit_code = None, None, None
        job.stop_cause, job.stop_reason, job.stop_rate = None, None, 0.0
        job.stop_frozen, job.admitted_bytes = False, None
        # It had its turn and waited before: the jobs behind it do not go first.
        self._queue.push_front(job.spec.owner, job)
        self._book.record(job, JobState.WAITING, PressureReason.MEMORY_PRESSURE)
        last = is_last_run(job.reruns, self._settings.retries())
        log.warning(
            "job %s queued again after its stop for memory pressure (run %d of %d), "
            "estimate %.2f GB (peak %.2f GB, growing %.0f MB/s when stopped%s)%s",
            job.id,
            job.reruns + 1,
            self._settings.retries() + 1,
            estimate / 1e9,
            peak / 1e9,
            max(0.0, rate) / 1e6,
            "; frozen then, within its estimate: stopped for the others' growth" if kept else "",
            ": its last run waits for room for its worst case, alone if need be" if last else "",
        )
        return True

    def retries(self) -> int:
        """ROOMKEEPER_PRESSURE_RETRIES now: how many times restartable work runs again."""
        return self._settings.retries()

    def close_handles(self, handles: list[Handle]) -> None:
        """Close reaped trees' handles (without the lock)."""
        # Closing waits for a stopping tree and removes its cgroup: never under the lock.
        for handle in handles:
            try:
                handle.close()
            except Exception:
                log.exception("closing a finished job's process tree failed")

    def expire(self) -> None:
        """End waiting jobs past their deadline; stop running ones past theirs."""
        now = self._clocks.clock()
        for job in self._queue.take(lambda j: j.deadline is not None and now >= j.deadline):
            self._book.finish(job, JobState.EXPIRED, None)
        for job in self.running.values():
            if job.deadline is not None and now >= job.deadline and job.stop_cause is None:
                self.stop(job, JobState.TIMED_OUT)

    def launch_round(self) -> None:
        """Launch what fits, in the queue's order, until nothing may or the guard refuses."""
        limits = self._settings.limits()
        self._held_by_cores = False
        while True:
            with self._lock:
                job, blocked = self._next_candidate(limits)
                if job is None:
                    self._explain(blocked)
                    self.memory_waits = False
                    return
                young = [
                    j
                    for j in self.running.values()
                    if j.handle is not None and j.state is not JobState.SUSPENDED
                ]  # a suspended job's stillness is no settling
            self.prepare()  # before the first judgement: it says where job groups go
            now = self._clocks.clock()
            for other in young:  # measured reservations: never count a job twice
                if now - self._measured_at.get(other.id, float("-inf")) < MEASURE_EVERY_S:
                    continue  # read for the launch just before: a fast batch reads once
                self._measured_at[other.id] = now
                with contextlib.suppress(Exception):
                    assert other.handle is not None
                    self._guard.report_measured(other.id, other.handle.footprint_bytes())
            decision = self._judge(job)
            worktree, unprepared = self._make_worktree(job) if decision.admit else (None, None)
            with self._lock:
                acted = self._act(job, decision, worktree, unprepared)
            if acted is _Acted.LAUNCHING:
                self._launch(job, limits)
                continue
            if acted is _Acted.DONE:
                continue
            # Told outside the lock; a ``break`` above would skip this (it once did).
            on_refusal = self._listeners.on_refusal
            if on_refusal is not None:
                on_refusal(job.id, decision)
            if not decision.aside:  # the refused job keeps its place: the round ends
                self.memory_waits = decision.reason is Reason.MEMORY
                return

    def _act(
        self,
        job: JobRecord,
        decision: Decision,
        worktree: Worktree | None,
        unprepared: Exception | None,
    ) -> _Acted:
        """Take the judged job out of the queue to launch it, fail it or refuse it (lock held)."""
        if job.state is not JobState.WAITING:  # cancelled while it was judged
            self._guard.release(job.id)
            return _Acted.DONE
        if unprepared is not None:
            self._fail_unprepared(job, unprepared)
            return _Acted.DONE
        if decision.never_fits:  # waiting would be for ever: fail it, go on
            self._fail_never_fits(job, decision)
            return _Acted.DONE
        if decision.admit:
            job.worktree = worktree
            job.line_bytes = decision.memory_line_bytes  # what a re-run's estimate stays under
            job.admitted_bytes = decision.estimate_bytes  # what it reserved (a re-run: capped)
            self._queue.remove(job.spec.owner, job)
            self.launching[job.id] = job
            return _Acted.LAUNCHING
        self.refusals[decision.reason.value] += 1
        self.last_refusal = decision.summary
        if decision.aside:  # nothing could hold it now: the jobs behind it go on
            self._aside[job.id] = self._clocks.clock()
            job.reason = decision.reason
        else:
            self._explain(decision.reason)
        return _Acted.REFUSED

    def _launch(self, job: JobRecord, limits: Limits) -> None:
        """Save the launching job's pending marker without the lock, then start it under it."""
        with self._lock:
            view = self._book.view(job)
        failure = self._save_first(view)
        with self._lock:
            self._start(job, limits, failure)

    def _save_first(self, view: JobView) -> Exception | None:
        """The pending marker saved and the log's folder made (lock not held: both wait on the
        disk); what kept the job from starting, or None."""
        before_launch = self._listeners.before_launch
        if before_launch is not None:
            try:
                before_launch(view)
            except Exception as err:
                return LaunchError(
                    view.id, f"not started: its pending marker could not be saved ({err})"
                )
        try:
            Path(view.log_path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            return err
        return None

    def withdraw(self, job: JobRecord, reason: Word | None) -> None:
        """Keep a launching job from starting (lock held): it ends ``cancelled`` with ``reason``
        once its marker's save is done, so its end is saved after the marker and clears it."""
        if job.stop_cause is None:
            job.stop_cause, job.stop_reason = JobState.CANCELLED, reason
        self._guard.release(job.id)  # it will not start: its reservation goes now

    def _judge(self, job: JobRecord) -> Decision:
        """The guard's answer; a disk refusal gets one worktree prune first, then a second look."""
        decision = self._admit(job)
        if decision.admit or decision.reason is not Reason.DISK or decision.never_fits:
            return decision
        reclaim = self._parts.reclaim_disk
        if reclaim is None:
            return decision
        with self._lock:
            view = self._book.view(job)
        try:
            freed = reclaim(view, decision)
        except Exception:  # a failed prune leaves the refusal as it was
            log.exception("the worktree prune before refusing job %s failed", job.id)
            return decision
        return self._admit(job) if freed else decision

    def _admit(self, job: JobRecord) -> Decision:
        """The guard's decision or, when jobs run elsewhere, the placement's (lock not held)."""
        placement = self._parts.placement
        if placement is not None:
            return placement(job.id, job.estimate.bytes)
        return self._guard.admit(
            job.id,
            memory_bytes=job.estimate.known,
            disk_bytes=job.spec.disk_bytes,
            policy=job.spec.memory_policy,
            rerun=self._rerun_ask(job) if job.reruns else None,
            # Only a re-run reads the variable: a first run is never the last re-run.
            worst_case=bool(job.reruns) and is_last_run(job.reruns, self._settings.retries()),
            typical_bytes=job.spec.shape_bytes,
        )

    def _rerun_ask(self, job: JobRecord) -> Rerun:
        """What the guard needs of a re-run: its peak, and what our live jobs hold now (read
        from their trees; a re-run is rare, so this is no cost to a fast batch)."""
        return Rerun(peak=job.peak_bytes or 0, ours=self.local_footprints())

    def local_handles(self) -> list[Handle]:
        """The handles of the running jobs whose trees run here (not on another machine)."""
        with self._lock:
            handles = [j.handle for j in self.running.values() if j.handle is not None]
        # Memory on another machine is not in this container's reading.
        return [h for h in handles if h.local]

    def local_footprints(self) -> int:
        """What the running jobs here hold together now, read from their trees."""
        ours = 0
        for handle in self.local_handles():
            with contextlib.suppress(Exception):  # one broken handle never blinds a reading
                ours += handle.footprint_bytes()
        return ours

    def _make_worktree(self, job: JobRecord) -> tuple[Worktree | None, Exception | None]:
        """The job's git worktree, made or reused after admission (lock not held)."""
        if job.spec.worktree is None:
            return None, None
        prepare = self._parts.prepare
        if prepare is None:  # never run it elsewhere than the tree it asked for
            return None, WorktreeError(
                "this scheduler makes no worktrees (it was given no prepare); "
                "run the job without worktree, or through the gateway or batch",
                reason="worktree_failed",
                repo=job.spec.worktree.repo,
            )
        with self._lock:
            view = self._book.view(job)
        try:
            return prepare(view), None
        except (OSError, ValueError) as err:  # WorktreeError is a ValueError
            return None, err

    def _fail_unprepared(self, job: JobRecord, err: Exception) -> None:
        """Its tree could not be made: the job fails before anything starts (lock held)."""
        self._queue.remove(job.spec.owner, job)
        self._guard.release(job.id)
        job.error = f"not started: {err}"
        self._book.finish(job, JobState.FAILED, None)

    def _fail_never_fits(self, job: JobRecord, decision: Decision) -> None:
        """A job that could not fit even alone fails now with the guard's words (lock held)."""
        self.refusals[decision.reason.value] += 1
        self._queue.remove(job.spec.owner, job)
        job.error = decision.summary
        self._book.finish(job, JobState.FAILED, decision.reason)

    def _next_candidate(self, limits: Limits) -> tuple[JobRecord | None, Word]:
        """The head of the next owner in turn that may launch, or why none may."""
        if limits.hold:
            return None, SchedulerReason.HELD
        if self.pressure_hold:
            return None, PressureReason.PRESSURE
        if len(self.running) >= limits.max_running:
            return None, SchedulerReason.SLOTS
        blocked = SchedulerReason.QUEUED
        now = self._clocks.clock()
        self._aside = {
            i: at for i, at in self._aside.items() if now - at < ASIDE_SECONDS and i in self._book
        }
        for owner, head in self._queue.heads(skip=lambda j: j.id in self._aside):
            running = sum(1 for j in self.running.values() if j.spec.owner == owner)
            if limits.max_running_per_owner is not None and running >= limits.max_running_per_owner:
                blocked = SchedulerReason.OWNER_SLOTS
                continue
            # Jobs placed elsewhere use other machines' CPUs: our own pressure is no reason.
            local = self._parts.placement is None
            if local and self.running and self._cpu_holds(limits):
                self.refusals[SchedulerReason.CPU.value] += 1
                return None, SchedulerReason.CPU
            return head, blocked
        return None, blocked

    def _cpu_holds(self, limits: Limits) -> bool:
        """Whether the CPU holds the next launch while jobs run: pressure past
        ROOMKEEPER_CPU_PRESSURE_PERCENT, or (a batch given no count) our running jobs here
        keeping every core busy (:mod:`roomkeeper.jobs.cores`)."""
        if limits.cpu_pressure_percent is not None:
            cpu = self._cpu_now()
            if cpu is not None and cpu > limits.cpu_pressure_percent:
                return True
        if not limits.until_cores_free:
            return False
        handles = {
            j.id: j.handle for j in self.running.values() if j.handle is not None and j.handle.local
        }
        self._held_by_cores = self._core_use.full(handles)
        return self._held_by_cores

    def _cpu_now(self) -> float | None:
        """CPU pressure, read at most every CPU_READ_SECONDS.

        PSI's avg10 is itself a ten-second average: reading it again for
        every launch of a fast batch costs more than it tells.
        """
        now = self._clocks.clock()
        if now - self._cpu_read_at >= CPU_READ_SECONDS:
            self._cpu_value, self._cpu_read_at = self._clocks.cpu_percent(), now
        return self._cpu_value

    def _start(self, job: JobRecord, limits: Limits, failure: Exception | None) -> None:
        """Spawn the launching job, its marker saved (lock held, so a cancel is either before or
        after this); or end it: cancelled or shut down meanwhile, not saved, or past its
        deadline."""
        del self.launching[job.id]
        if job.stop_cause is not None:  # a cancel or a shutdown came while it was saved
            self._guard.release(job.id)
            self._book.finish(job, JobState.CANCELLED, job.stop_reason)
            return
        if failure is not None:
            self._guard.release(job.id)
            job.error = str(failure)
            self._book.finish(job, JobState.FAILED, None)
            return
        if job.deadline is not None and self._clocks.clock() >= job.deadline:
            self._guard.release(job.id)  # its time ran out while it was saved: never started
            self._book.finish(job, JobState.EXPIRED, None)
            return
        try:
            argv, env, fds = self._with_jobserver(job)
        except JobserverError as err:
            self._guard.release(job.id)
            job.error = str(err)
            self._book.finish(job, JobState.FAILED, None)
            return
        spec = LaunchSpec(
            argv=argv,
            log_path=job.log_path,
            cwd=job.worktree.path if job.worktree is not None else job.spec.cwd,
            env=env,
            pass_fds=fds,
            nice=limits.worker_nice,
            shell=job.spec.shell,
            user=self._parts.job_user,
            memory_bytes=job.estimate.bytes,
            disk_bytes=job.spec.disk_bytes,
            restartable=job.spec.restartable,
            last_run=is_last_run(job.reruns, self._settings.retries()),
            rerun_peak=(job.peak_bytes or 0) if job.reruns else None,
            runs_again=queued_again(
                restartable=job.spec.restartable,
                reruns=job.reruns,
                retries=self._settings.retries(),
            ),
            deadline_s=None
            if job.deadline is None
            else max(0.0, job.deadline - self._clocks.clock()),
        )
        try:
            handle = self._launcher(job.id, spec)
        except (LaunchError, OSError, ValueError) as err:
            self._guard.release(job.id)
            self.jobservers.close(job.id)
            job.error = str(err)
            self._book.finish(job, JobState.FAILED, None)
            return
        if job.spec.jobserver:
            self.jobservers.attach(job.id, _members(handle))
        job.handle = handle
        job.started = self._clocks.wall()
        try:
            job.pidfd = -1 if handle.pid is None else os.pidfd_open(handle.pid)
        except (AttributeError, OSError):
            job.pidfd = -1  # the loop falls back to polling
        self.running[job.id] = job
        self.launched += 1
        # Rotation: this owner goes to the back of the line.
        self._queue.rotate(job.spec.owner)
        self._book.record(job, JobState.RUNNING, None)

    def _with_jobserver(
        self, job: JobRecord
    ) -> tuple[Sequence[str], Mapping[str, str] | None, tuple[int, ...]]:
        """The argv, environment and inherited descriptors the job launches with: its own,
        or under a jobserver of its own when its spec asks for one (lock held)."""
        env = job.spec.environment()
        if not job.spec.jobserver:
            return job.spec.argv, env, ()
        command, fds = self.jobservers.open(
            job.id,
            job.spec.owner,
            job.spec.argv,
            os.environ if env is None else env,
            shell=job.spec.shell,
            cwd=job.worktree.path if job.worktree is not None else job.spec.cwd,
        )
        _say(job.log_path, command.notes)
        return command.argv, command.env, fds

    def _explain(self, blocked: Word) -> None:
        """Give every waiting job its current reason (state changes only are recorded)."""
        for job in self._queue:
            if job.id not in self._aside:  # an aside job keeps the reason it was given
                job.reason = blocked

    def prune(self) -> None:
        """Let go of stoppers that are done; forget the finished jobs that ended first beyond
        the book's bound, and then idle owners' lines."""
        # Every round, not only when the book is over its bound: jobs removed one by one
        # (forget) may keep it under the bound for ever, while stops go on.
        self._stoppers = [t for t in self._stoppers if t.is_alive()]
        if not self._book.prune():
            return
        live = [*self.running.values(), *self.launching.values()]
        self._queue.forget_idle({j.spec.owner for j in live})

    def next_due(self) -> float | None:
        """Seconds until a deadline or a retry is due, or None when nothing waits on time."""
        now = self._clocks.clock()
        live = [*self.running.values(), *self._queue]
        dues = [j.deadline - now for j in live if j.deadline is not None]
        if self._queue.waiting():
            dues.append(self._core_use.next_window_in() if self._held_by_cores else RETRY_SECONDS)
        return max(0.0, min(dues)) if dues else None

    # --------------------------------------------------------------- stopping

    def stop(self, job: JobRecord, cause: JobState) -> None:
        """Stop the tree on a side thread (SIGTERM, grace, SIGKILL); the round reaps it."""
        if job.stop_cause is not None or job.handle is None:
            return
        job.stop_cause = cause
        handle = job.handle
        # Steps its jobserver paused would sleep through SIGTERM to the SIGKILL after the grace.
        self.jobservers.release(job.id)
        stopper = threading.Thread(
            target=handle.stop, args=(self._stop_grace,), name=f"stop-{job.id}", daemon=True
        )
        stopper.start()
        self._stoppers.append(stopper)
        if handle.local:
            self._local_stoppers.append(stopper)

    def stop_in_progress(self) -> bool:
        """Whether a local tree is being stopped and is not gone yet (its job may have been
        reaped already: the stop returns only when every member of the tree is gone)."""
        self._local_stoppers = [t for t in self._local_stoppers if t.is_alive()]
        return bool(self._local_stoppers)

    @property
    def stop_grace(self) -> float:
        """SIGTERM to SIGKILL when a tree is stopped, in seconds."""
        return self._stop_grace

    def stop_all(self, grace: float | None) -> list[threading.Thread]:
        """Stop every running tree for a shutdown; the stopper threads to join."""
        self._stop_grace = self._stop_grace if grace is None else grace
        for job in self.running.values():
            if job.stop_cause is None:
                job.stop_reason = SchedulerReason.SHUTDOWN
            self.stop(job, JobState.STOPPED)
        return list(self._stoppers)


def _members(handle: Handle) -> Callable[[], Iterable[int]]:
    """The pids of a local tree, for its jobserver's census (none for a tree elsewhere)."""
    refresh = getattr(handle, "refresh", None)

    def members() -> Iterable[int]:
        if refresh is None or handle.pid is None:
            return ()
        return {handle.pid, *(p.pid for p in refresh())}

    return members


def _say(log_path: str, notes: Sequence[str]) -> None:
    """Write roomkeeper's notes on a job into its log, where its owner reads its output."""
    if not notes:
        return
    with contextlib.suppress(OSError), open(log_path, "a") as log_file:
        log_file.writelines(f"roomkeeper: {note}\n" for note in notes)

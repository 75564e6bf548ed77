"""The scheduler's side of the relief ladder: what the pressure monitor may do to its jobs.

:class:`SchedulerRelief` is the :class:`~roomkeeper.relief.monitor.Target`
the monitor acts through.  Every record changes under the scheduler's lock;
the kernel's part of a suspension or a resume (a freezer write, signals)
happens outside it, so an API call never waits on the freezer.  A stop goes
through the launch rounds' own stop (SIGTERM, grace, SIGKILL), keeps the job's
output, and ends the job ``stopped`` with reason ``memory_pressure``, unless
it is restartable and has runs left (:meth:`roomkeeper.jobs.rounds.LaunchRounds.reap`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from roomkeeper.errors import SuspendError
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.rule import Word
from roomkeeper.jobs.book import JobBook, JobRecord
from roomkeeper.jobs.handle import Handle
from roomkeeper.jobs.reruns import is_last_run, queued_again
from roomkeeper.jobs.rounds import LaunchRounds
from roomkeeper.jobs.spec import JobState
from roomkeeper.kernel.freezer import FreezeMethod
from roomkeeper.relief.ladder import Live, PressureReason, Step
from roomkeeper.units import MIB

log = logging.getLogger("roomkeeper")

SUSPEND_TIMEOUT_S = 2.0  # a tree that does not freeze in this time is let go on and stopped


# A job whose reports rise this fast still grows, though by less than the ladder's noise
# between two readings (one MiB a tenth of a second, less when it reads faster near the line).
GROWING_RATE = 1 * MIB


@dataclass(frozen=True, slots=True)
class _Seen:
    """What the ladder needs of one live job, copied under the scheduler's lock."""

    job_id: str
    handle: Handle
    started: float
    estimate: int
    state: JobState
    reason: Word | None
    restartable: bool
    stopping: bool
    last_run: bool
    runs_again: bool
    ran_s: float
    suspended_s: float


class SchedulerRelief:
    """Suspends, resumes and stops the scheduler's own jobs for the monitor.

    Args:
        lock: the scheduler's lock.
        book: its job book.
        rounds: its launch rounds (the running jobs, the launch hold, the stop).
        guard: told each job's footprint, and asked which jobs are on trial.
        wake: wakes the scheduler's loop (launches may go on again).
        flush: hands recorded changes to ``on_change``, outside the lock.
    """

    def __init__(
        self,
        *,
        lock: threading.Lock,
        book: JobBook,
        rounds: LaunchRounds,
        guard: Guard,
        wake: Callable[[], None],
        flush: Callable[[], None],
    ) -> None:
        self._lock = lock
        self._book = book
        self._rounds = rounds
        self._guard = guard
        self._wake = wake
        self._flush = flush

    def live_jobs(self) -> list[Live]:
        """Every running or suspended job here with its footprint now, oldest first.

        A job on another machine (the Ray backend) is not in this container's
        reading: its own node's guard watches it, and ours never touches it.
        What the ladder needs of each job is copied under the lock: a job
        stopped and queued again meanwhile loses its handle, and a reading must
        not trip over that (it reads the handle it copied, which is closed at
        worst: its footprint is then 0).
        """
        retries = self._rounds.retries()  # once per reading: it reads the environment
        with self._lock:
            seen = [
                _Seen(
                    j.id,
                    j.handle,
                    j.started or 0.0,
                    # What it was admitted with: a re-run's grown estimate may be more
                    # than it reserved, and resuming it judges what it reserved.
                    j.admitted_bytes if j.admitted_bytes is not None else j.estimate.bytes,
                    j.state,
                    j.reason,
                    j.spec.restartable,
                    j.stop_cause is not None,
                    is_last_run(j.reruns, retries),
                    queued_again(restartable=j.spec.restartable, reruns=j.reruns, retries=retries),
                    *self._book.run_times(j),
                )
                for j in self._rounds.running.values()
                if j.handle is not None and j.handle.local
            ]
        on_trial = set(self._guard.trials())
        oldest = min(seen, key=lambda j: j.started, default=None)  # as the ladder ranks
        if oldest is not None and oldest.job_id in on_trial:  # the oldest is never paused
            self._guard.end_trial(oldest.job_id)
            on_trial.discard(oldest.job_id)
        return [self._live(job, on_trial) for job in seen]

    def _live(self, job: _Seen, on_trial: set[str]) -> Live:
        """One job as the ladder sees it, its footprint read now (outside the lock: it reads
        kernel files)."""
        footprint, suspendable = 0, False
        suspended = job.state is JobState.SUSPENDED
        with contextlib.suppress(Exception):  # one broken handle never blinds the monitor
            suspendable = job.handle.suspendable
        with contextlib.suppress(Exception):
            footprint = job.handle.footprint_bytes()
            # Every reading tells the guard: the claims a job on trial is paused and
            # resumed against must move while launches are held (no round reports then).
            # A suspended job's stillness is no settling: it is not reported.
            if not suspended:
                self._guard.report_measured(job.job_id, footprint)
        trial = job.job_id in on_trial or (suspended and job.reason is PressureReason.ON_TRIAL)
        return Live(
            job_id=job.job_id,
            started=job.started,
            footprint=footprint,
            estimate=job.estimate,
            suspended=suspended,
            suspendable=suspendable,
            restartable=job.restartable,
            stopping=job.stopping,
            # Passed over as a victim only while it keeps to what it reserved: a last run
            # that outgrows its own reservation is the one outgrowing, not someone else.
            last_run=job.last_run and footprint <= job.estimate,
            # Paused on trial, it stays the trial rule's to resume even if its
            # trial ended meanwhile: a pause is not a ladder suspension.
            trial=trial,
            # Only a trial's growth is asked of the guard: the ladder judges no other by it.
            growing=trial and not suspended and self._guard.growth_rate(job.job_id) >= GROWING_RATE,
            runs_again=job.runs_again,
            ran_s=job.ran_s,
            suspended_s=job.suspended_s,
        )

    def hold_for_pressure(self, hold: bool) -> None:
        """Hold launches (reason ``pressure``), or let them go and wake the scheduler."""
        with self._lock:
            was, self._rounds.pressure_hold = self._rounds.pressure_hold, hold
        if was and not hold:
            self._wake()

    def suspend_for_pressure(self, job_id: str, *, trial: bool = False) -> bool:
        """Suspend the job's whole tree; its state becomes ``suspended``, with reason
        ``memory_pressure``, or ``on_trial`` for the pause of a job on trial."""
        found = self._suspendable(job_id)
        return found is not None and self._suspend(job_id, *found, trial=trial)

    def suspend_all_for_pressure(self, job_ids: list[str]) -> list[str]:
        """Suspend several trees, each as :meth:`suspend_for_pressure` does; the ones suspended.

        Every tree is halted first (the processes known already get SIGSTOP, no
        walk of ``/proc``), then each is suspended in full: on a busy machine a
        walk takes long, and the last tree would otherwise grow through the
        walks of all the others.
        """
        found = [(job_id, f) for job_id in job_ids if (f := self._suspendable(job_id)) is not None]
        for _, (_, handle) in found:
            with contextlib.suppress(Exception):  # a halt only speeds the suspension up
                handle.halt()
        return [job_id for job_id, f in found if self._suspend(job_id, *f, trial=False)]

    def _suspendable(self, job_id: str) -> tuple[JobRecord, Handle] | None:
        """The running job and its handle, when its tree can be suspended now."""
        found = self._running(job_id)
        if found is None or found[0].state is JobState.SUSPENDED or not found[1].suspendable:
            return None
        return found

    def _suspend(self, job_id: str, job: JobRecord, handle: Handle, *, trial: bool) -> bool:
        """Suspend one tree found suspendable, and record it (a halted tree always comes here:
        a failed suspension lets it go on)."""
        try:
            method = handle.suspend(timeout=SUSPEND_TIMEOUT_S)
        except SuspendError as err:
            log.warning("memory pressure: job %s could not be suspended: %s", job_id, err)
            return False
        # How, in words: a job group's freezer, or SIGSTOP to every process of the tree.
        way = method.value if isinstance(method, FreezeMethod) else str(method)
        log.info("job %s frozen by %s", job_id, way)
        with self._lock:
            if job.handle is not handle:  # stopped and queued again meanwhile: a new run
                return False
            if job.state is not JobState.RUNNING or job.stop_cause is not None:
                return True  # it ended or is being stopped meanwhile: the stop resumes it
            reason = PressureReason.ON_TRIAL if trial else PressureReason.MEMORY_PRESSURE
            self._book.record(job, JobState.SUSPENDED, reason)
        self._flush()
        return True

    def resume_after_pressure(self, job_id: str) -> bool:
        """Let a suspended tree go on; its state is ``running`` again."""
        found = self._running(job_id)
        if found is None or found[0].state is not JobState.SUSPENDED:
            return False
        job, handle = found
        if not handle.suspendable:
            return False
        try:
            handle.resume()
        except SuspendError as err:
            log.warning("job %s could not be resumed: %s", job_id, err)
            return False
        with self._lock:
            if job.state is JobState.SUSPENDED and job.handle is handle:
                self._book.record(job, JobState.RUNNING, None)
        self._flush()
        return True

    def note_remote_step(self, job_id: str, step: Step) -> bool:
        """A Ray node's own ladder suspended or resumed one of our jobs there: its state
        says so (``suspended`` with reason ``memory_pressure``, or ``running`` again).
        Whether the job's record changed; a stop comes back through the job's handle."""
        with self._lock:
            job = self._rounds.running.get(job_id)
            if job is None or job.handle is None or job.handle.local or job.stop_cause:
                return False
            if step is Step.SUSPEND and job.state is JobState.RUNNING:
                self._book.record(job, JobState.SUSPENDED, PressureReason.MEMORY_PRESSURE)
            elif step is Step.RESUME and job.state is JobState.SUSPENDED:
                self._book.record(job, JobState.RUNNING, None)
            else:
                return False
        self._flush()
        return True

    def stop_in_progress(self) -> bool:
        """Whether a stopped tree here is still going, its job listed or not."""
        with self._lock:
            return self._rounds.stop_in_progress()

    def stop_for_pressure(self, job_id: str, why: str, *, never_fits: bool) -> bool:
        """Stop the job's tree (output kept); ``stopped`` with reason ``memory_pressure``.

        How fast it was growing is kept: a re-run's estimate grows from it.
        """
        rate = self._guard.growth_rate(job_id)
        with self._lock:
            job = self._rounds.running.get(job_id)
            if job is None or job.stop_cause is not None:
                return False
            job.stop_reason, job.stop_rate = PressureReason.MEMORY_PRESSURE, rate
            # A frozen tree was stopped for the others: its own growth had been halted.
            job.stop_frozen = job.state is JobState.SUSPENDED
            if never_fits:
                job.error = f"it alone outgrows the container, so it can never fit here: {why}"
            self._rounds.stop(job, JobState.STOPPED)
        self._wake()  # the round reaps it as soon as it is gone
        return True

    def _running(self, job_id: str) -> tuple[JobRecord, Handle] | None:
        """The running job and its handle as they are now, both taken under the lock."""
        with self._lock:
            job = self._rounds.running.get(job_id)
            if job is None or job.handle is None:
                return None
            return job, job.handle

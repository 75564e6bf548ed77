"""Every change of a job, saved: the scheduler's listeners that write the journal.

A job's row and pending marker are durable before it is spawned; each change
of state is recorded (its log synced first once it has ended), with its peak
kept under its kind's key once it has ended; each step of the relief ladder
goes into the recovery history, numbers only.  A save that fails is kept, so
that a submit sees it and answers 507, and the job is saved again until a
save of it succeeds.

The changes come in order under the job book's flush lock, which the pressure
monitor's suspensions and resumes also take: nothing here waits on the disk
there.  An ended job's log is fsynced on a thread of its own, and only then
is its outcome handed to the journal (logs before the index); the future the
change is known by resolves once that outcome is saved.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import queue
import threading
import time

import psutil

from roomkeeper.gateway.context import GatewayContext
from roomkeeper.gateway.waits import WaitTimes
from roomkeeper.jobs.sizes import shape_key, size_key
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.relief.ladder import Step
from roomkeeper.relief.monitor import ReliefEvent

MARKER_TIMEOUT_S = 30.0
_RELIEF_CODES = {
    Step.HOLD: RecoveryCode.PRESSURE_HOLD,
    Step.SUSPEND: RecoveryCode.PRESSURE_SUSPENDED,
    Step.RESUME: RecoveryCode.PRESSURE_RESUMED,
    Step.STOP: RecoveryCode.PRESSURE_STOPPED,
    Step.RELIEVE: RecoveryCode.PRESSURE_RELIEVE,
}


def _fsync_file(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _settle(saved: concurrent.futures.Future[None], write: concurrent.futures.Future[None]) -> None:
    """``saved`` ends as the journal's ``write`` did."""
    if write.cancelled():
        saved.cancel()
    elif write.exception() is not None:
        saved.set_exception(write.exception())
    else:
        saved.set_result(None)


class JobRecords:
    """What the journal keeps of each job as the scheduler changes it.

    Args:
        context: the gateway's journal and the watch on its writes.
        waits: the histogram each started job's wait goes into.

    Attributes:
        writes: the latest journal write of each job; a failed one is kept.
        unsaved: jobs whose latest change failed to save, and since when.
    """

    def __init__(self, context: GatewayContext, *, waits: WaitTimes) -> None:
        self._journal = context.journal
        self._watch = context.watch
        self._waits = waits
        self.writes: dict[str, concurrent.futures.Future[None]] = {}
        self.unsaved: dict[str, float] = {}
        self._withdrawn: set[str] = set()  # jobs answered 507 (not saved): never saved
        # Ended jobs whose log is fsynced before their outcome is saved, in the order they ended.
        self._to_sync: queue.SimpleQueue[tuple[JobView, concurrent.futures.Future[None]]] = (
            queue.SimpleQueue()
        )
        self._syncer: threading.Thread | None = None
        self._syncer_lock = threading.Lock()

    def mark_launch(self, view: JobView) -> None:
        """The job's row and its pending marker, durable before the spawn (scheduler thread)."""
        write = self._journal.record_launch(view)
        self._watch(write)
        write.result(timeout=MARKER_TIMEOUT_S)  # a stuck disk fails the launch, not the scheduler

    def _learn(self, spec: JobSpec, peak_bytes: int, *, ran_to_its_end: bool) -> None:
        """Keep an ended job's peak: the next job of its kind that states no estimate starts
        from it, and, once it ran to its own end (what a run cut short held would pull the
        median down), the next of its command shape that nothing is known of is sized by it."""
        self._watch(self._journal.record_peak(size_key(spec), peak_bytes))
        shape = shape_key(spec) if ran_to_its_end else None
        if shape is not None:
            self._watch(self._journal.record_peak(shape, peak_bytes))

    def changed(self, view: JobView) -> None:
        """Save the job's new state (its log first once it has ended) and, once it has ended,
        its peak under its kind's key; count its wait once it starts."""
        if view.id in self._withdrawn:
            return  # answered 507: it never was
        pid_started = None
        if view.state is JobState.RUNNING and view.pid is not None:
            with contextlib.suppress(psutil.Error):
                pid_started = psutil.Process(view.pid).create_time()
        if view.state.final:
            write = self._after_its_log(view)  # logs before the index, off this thread
        else:
            write = self._journal.record_job(view, pid_started=pid_started)
        self._watch(write)
        self.writes[view.id] = write
        if view.state.final and view.peak_bytes is not None:
            self._learn(view.spec, view.peak_bytes, ran_to_its_end=view.state is JobState.EXITED)
        job_id = view.id

        def forget(done: concurrent.futures.Future[None]) -> None:
            # A failed write is kept: DurableJobs.submit must see it and answer 507, and
            # the job is saved again (retry_unsaved) until a save of it succeeds.
            if self.writes.get(job_id) is not done or done.cancelled():
                return
            if done.exception() is None:
                self.writes.pop(job_id, None)
                self.unsaved.pop(job_id, None)
            else:
                self.unsaved[job_id] = time.time()

        write.add_done_callback(forget)
        if view.state is JobState.RUNNING and view.started_at is not None:
            self._waits.add(max(0.0, view.started_at - view.submitted_at))

    def _after_its_log(self, view: JobView) -> concurrent.futures.Future[None]:
        """The ended job's outcome, saved once its log is fsynced (on the log-sync thread).

        A final state is a job's last change in this run (an ended job never changes
        again; a job in doubt run again is one of an earlier run, saved before), so no
        later change of it can reach the journal before this one.
        """
        saved: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._syncer_lock:
            if self._syncer is None:
                self._syncer = threading.Thread(
                    target=self._sync_logs, name="roomkeeper-log-sync", daemon=True
                )
                self._syncer.start()
        self._to_sync.put((view, saved))
        return saved

    def _sync_logs(self) -> None:
        """Fsync each ended job's log, then hand its outcome to the journal, in order."""
        while True:
            view, saved = self._to_sync.get()
            _fsync_file(view.log_path)
            try:
                write = self._journal.record_job(view)
            except Exception as err:  # the thread must outlive any one failed save
                saved.set_exception(err)
                continue
            write.add_done_callback(functools.partial(_settle, saved))

    def relief_step(self, event: ReliefEvent, node: str | None = None) -> None:
        """A step of the relief ladder in the recovery history, numbers only (monitor thread);
        ``node``: the Ray node whose own ladder took it (its id), None for this machine's."""
        code = _RELIEF_CODES[event.step]
        if event.step is Step.STOP and event.never_fits:
            code = RecoveryCode.PRESSURE_NEVER_FITS
        numbers: dict[str, int | float] = {
            "used_bytes": event.used_bytes,
            "limit_bytes": event.limit_bytes,
        }
        if event.job_id is not None:
            numbers["footprint_bytes"] = event.footprint_bytes
        if event.reaction_s is not None:
            numbers["reaction_ms"] = round(event.reaction_s * 1000, 1)
        event_out = HistoryEvent(time.time(), code, numbers, node)
        self._watch(self._journal.record_history(event_out))

    def withdraw(self, job_id: str) -> None:
        """Save none of the job's changes from now on: it was answered 507, so it never was."""
        self._withdrawn.add(job_id)

    def forget(self, job_id: str) -> None:
        """Drop what is kept of the job's saves (a withdrawn job's, once it is cancelled)."""
        self.writes.pop(job_id, None)
        self.unsaved.pop(job_id, None)

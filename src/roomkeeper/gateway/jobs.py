"""Jobs made durable: the gateway's scheduler, with the journal behind every change.

A submit is answered once its record is durable, and a cancel once the
request is; a job whose record could not be saved is answered 507 and never
runs (503 when the journal did not answer within the save deadline: then a
row that lands later is taken back).  A cancel stops the tree whatever the
disk does; one not saved is answered so, and saved again until it is.  The
parts: :mod:`~roomkeeper.gateway.job_records` saves each change
(the scheduler's listeners), :mod:`~roomkeeper.gateway.job_hooks` makes each
job's release hook when it ends, :mod:`~roomkeeper.gateway.waits` counts how
long jobs waited; the refusals are kept for the Health page.  Work a crash
left in doubt is :mod:`~roomkeeper.gateway.doubt`'s.

Learned sizes: a job that states no memory estimate is submitted with the
highest of the last five peaks of its kind (its ``kind``, else a hash of its
argv and cwd), and every ended job's peak is recorded under that key.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sqlite3
import uuid
from collections import deque

from roomkeeper.errors import (
    NotEndedError,
    PersistenceError,
    SaveTimeoutError,
    UnknownJobError,
    UnrunnableError,
    UsageError,
)
from roomkeeper.gateway.context import GatewayContext
from roomkeeper.gateway.job_hooks import NOT_RUN, JobHooks
from roomkeeper.gateway.job_records import JobRecords
from roomkeeper.gateway.persistence import FREE_SPACE, awaited, saved
from roomkeeper.gateway.refusals import Refusal
from roomkeeper.gateway.waits import WaitTimes
from roomkeeper.guard.rule import Decision
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerListeners, SchedulerParts, SchedulerSettings
from roomkeeper.jobs.sizes import (
    shape_key,
    size_key,
    sized_by_shape,
    typical_size,
    with_learned_size,
    with_shape_size,
)
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.loopback.hook_calls import HookRunner
from roomkeeper.loopback.hooks import ReleaseHook

log = logging.getLogger("roomkeeper")


class DurableJobs:
    """The gateway's scheduler and what it records of each job.

    Args:
        context: the gateway's journal, the watch on its writes, and whether it closes.
        settings: the scheduler's settings (its logs directory, its bounds with the
            gateway's holds on top, the pressure variables of the gateway's environment).
        parts: the scheduler's parts: the guard it asks, the job user, the worktrees'
            prepare and prune, and the launcher and placement of the Ray backend.
        hooks: the pool release hooks run on, never the scheduler's thread: a hung
            hook holds only its own job's memory, until its deadline.
        refusals: recent refusals for the Health page (shared with the gateway).

    Attributes:
        scheduler: the scheduler; its listeners are the parts below and the refusals.
        records: each job's saves, and which failed.
        hooks: each job's release hook.
        waits: how long jobs waited before their start.
    """

    def __init__(
        self,
        context: GatewayContext,
        *,
        settings: SchedulerSettings,
        parts: SchedulerParts,
        hooks: HookRunner,
        refusals: deque[Refusal],
    ) -> None:
        self._journal = context.journal
        self._watch = context.watch
        self._closing = context.closing
        self._refusals = refusals
        self.waits = WaitTimes()
        self.records = JobRecords(context, waits=self.waits)
        self.hooks = JobHooks(context, runner=hooks)
        listeners = SchedulerListeners(
            on_change=self.records.changed,
            on_end=self.hooks.ended,
            on_refusal=self._job_refused,
            before_launch=self.records.mark_launch,
            on_relief=self.records.relief_step,
        )
        self.scheduler = Scheduler(settings, parts=parts, listeners=listeners)
        self._guard = self.scheduler.guard

    @property
    def unsaved(self) -> dict[str, float]:
        """Jobs whose latest change failed to save, and since when."""
        return self.records.unsaved

    def pending_writes(self) -> list[concurrent.futures.Future[None]]:
        """The journal writes of jobs' changes not done yet (a shutdown waits for them)."""
        return [f for f in self.records.writes.values() if not f.done()]

    def _job_refused(self, job_id: str, decision: Decision) -> None:
        """Keep a refusal for the Health page once, not once per retried round."""
        last = self._refusals[-1] if self._refusals else None
        if last is None or (last.reason, last.subject) != (decision.reason, job_id):
            self._refusals.append(Refusal.of(decision, job_id))

    async def submit(self, spec: JobSpec, release: ReleaseHook | None) -> JobView:
        """Queue a job; returns once its record is durable.  Never blocks the event loop."""
        if self._closing():
            raise UsageError("the gateway is shutting down", name="shutdown")
        spec = await asyncio.to_thread(self.learned, spec)
        spec = await self._refuse_what_never_fits(spec)
        job_id = uuid.uuid4().hex[:12]
        if release is not None:
            # Saved before the job is: a crash from here on leaves a hook owed, not lost.
            try:
                await self.hooks.keep(job_id, release)
            except SaveTimeoutError:  # its row may land yet: taken back after it, in order
                self._watch(self._journal.withdraw_job(job_id))
                raise
        try:
            view = await asyncio.to_thread(self.scheduler.submit, spec, job_id=job_id)
        except BaseException:
            self.hooks.forget(job_id)
            raise
        write = self.records.writes.get(job_id)
        if write is not None:
            try:
                await awaited(write, "the job", then=NOT_RUN)
            except SaveTimeoutError:  # its row may land yet: taken back after it, in order
                await asyncio.to_thread(self._withdraw, job_id)
                self._watch(self._journal.withdraw_job(job_id))
                raise
            except Exception:  # not saved: it must not run, and must not look saved
                await asyncio.to_thread(self._withdraw, job_id)
                raise
        return view

    def learned(self, spec: JobSpec) -> JobSpec:
        """``spec`` with the learned size of its kind, when it states no estimate, else with
        its command shape's typical peak, when one is known (off the loop)."""
        if spec.memory_bytes is not None:
            return spec
        learned = self._journal.learned_size(size_key(spec))
        shape = shape_key(spec) if learned is None and sized_by_shape(spec) else None
        if shape is not None:
            return with_shape_size(spec, typical_size(self._journal.recent_peaks(shape)))
        line = self._guard.check(memory_bytes=0).memory_line_bytes if learned else None
        return with_learned_size(spec, learned, line)

    async def _refuse_what_never_fits(self, spec: JobSpec) -> JobSpec:
        """A job that could not fit even with nothing else running is refused now (422),
        never accepted to wait for ever.

        Returns:
            The spec to queue.

        Raises:
            UnrunnableError: its memory estimate is above the guard's line, or its disk need
                above the volume's total; the guard's numbers say by how much.
        """
        decision = await asyncio.to_thread(
            self._guard.check, memory_bytes=spec.memory_estimate, disk_bytes=spec.disk_bytes
        )
        if decision.never_fits:
            raise UnrunnableError(
                f"refused: {decision.summary}; ask for less (memory_bytes, disk_bytes)",
                reason="never_fits",
                name=decision.reason.value,
            )
        return spec

    def cancel(self, job_id: str) -> JobView:
        """Cancel or stop a job; the request is durable before it is acknowledged or signalled.

        A crash right after the answer must not turn a person's cancel into a
        deferred job that runs again.  The tree is stopped whatever the disk does.

        Raises:
            PersistenceError: the cancel holds in this run but is not saved yet.
            SaveTimeoutError: the same, the journal not answering within the deadline.
        """
        view = self.scheduler.get(job_id)
        what = f"job {job_id!r}'s cancel"
        unsaved: PersistenceError | None = None
        if not view.state.final:
            asked = self._journal.request_stop(job_id)
            self._watch(asked)
            try:
                saved(asked, what, then="")
            except PersistenceError as err:
                # The tree is stopped all the same (a full or hung disk must not keep it
                # running); its end is saved once the journal can (a failed save is retried).
                log.error("%s; stopping it", err)
                unsaved = err
        view = self.scheduler.cancel(job_id)
        write = self.records.writes.get(job_id)
        if write is not None and view.state.final:
            try:  # failed: kept unsaved, retried, reported
                saved(write, what, then="", timeout_s=0 if unsaved else None)
            except PersistenceError as err:
                unsaved = unsaved or err
        if unsaved is not None:
            kind = SaveTimeoutError if isinstance(unsaved, SaveTimeoutError) else PersistenceError
            raise kind(
                f"{unsaved}; the cancel holds in this run (a running tree is stopped) and is "
                f"saved as soon as the journal takes it; {FREE_SPACE}"
            ) from unsaved
        return view

    def _withdraw(self, job_id: str) -> None:
        """A job answered 507: cancelled before it can run, then forgotten, so it is never
        listed (as failed or cancelled) nor saved later by a retry."""
        self.records.withdraw(job_id)
        self.hooks.forget(job_id)  # before the cancel: a job that never was has no hook
        self.scheduler.cancel(job_id)
        with contextlib.suppress(UnknownJobError, NotEndedError):
            self.scheduler.forget(job_id)
        self.records.forget(job_id)
        self.hooks.forget(job_id)

    def retry_unsaved(self) -> int:
        """Save again each job whose latest change could not be saved; how many still are not.

        Called on a timer: a job that ended while the disk was full is saved as ended once
        the disk takes it, never left ``running`` in the journal.
        """
        for job_id in list(self.unsaved):
            write = self.records.writes.get(job_id)
            if write is not None and not write.done():
                continue  # a save is on its way
            if not self.scheduler.resend(job_id):  # in order with the scheduler's own saves
                self.unsaved.pop(job_id, None)
        return len(self.unsaved)

    def remove(self, job_id: str) -> None:
        """Forget an ended job: its record, its state changes and its kept output.

        Work in doubt is never forgotten this way: it is resolved first.

        Raises:
            UnknownJobError: no job has that id.
            NotEndedError: ``not_ended`` while it waits or runs, ``in_doubt`` while it is
                uncertain or deferred.
        """
        state, log_path = self._state_and_log(job_id)
        if not state.final:
            raise NotEndedError(
                f"job {job_id!r} is {state.value}: cancel it first "
                f"(POST /v1/jobs/{job_id}/cancel), then remove it once it has ended",
                work_id=job_id,
                reason="not_ended",
            )
        if state in (JobState.UNCERTAIN, JobState.DEFERRED):
            raise NotEndedError(
                f"job {job_id!r} is {state.value}: what it did is not known; resolve it "
                f"first (POST /v1/jobs/{job_id}/resolve)",
                work_id=job_id,
                reason="in_doubt",
            )
        # Its final state saved first: the scheduler may not have handed it on yet, and a
        # write still queued would bring the row back.
        self.scheduler.flush()
        write = self.records.writes.get(job_id)
        if write is not None:
            with contextlib.suppress(PersistenceError):  # kept unsaved: the 409 below says so
                saved(write, f"job {job_id!r}'s end", then="")
        if job_id in self.unsaved:
            raise NotEndedError(
                f"job {job_id!r} is not saved as ended yet; try again in a moment",
                work_id=job_id,
                reason="not_ended",
            )
        what, then = f"job {job_id!r}'s removal", f"the job stays; try again; {FREE_SPACE}"
        try:
            forgotten = saved(self._journal.forget_job(job_id), what, then=then)
        except SaveTimeoutError:
            raise
        except PersistenceError as err:
            if not isinstance(err.__cause__, sqlite3.OperationalError):
                raise
            # A full disk: its output goes first, freeing the space the delete needs.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_path)
            forgotten = saved(self._journal.forget_job(job_id), what, then=then)
        if not forgotten:
            raise NotEndedError(
                f"job {job_id!r} is not saved as ended yet; try again in a moment",
                work_id=job_id,
                reason="not_ended",
            )
        self.scheduler.forget(job_id)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log_path)

    def _state_and_log(self, job_id: str) -> tuple[JobState, str]:
        """The job's state (this run's view over the journal's) and its output file.

        Raises:
            UnknownJobError: no job has that id.
        """
        with contextlib.suppress(UnknownJobError):
            view = self.scheduler.get(job_id)
            return view.state, view.log_path
        row = self._journal.job(job_id)
        if row is None:
            raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id)
        return JobState(row.state), row.log_path

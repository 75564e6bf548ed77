"""Jobs made durable: the gateway's scheduler, with the journal behind every change.

A job's row and pending marker are durable before it is spawned; each change
of state is recorded (its log synced first once it has ended); a submit is
answered once its record is durable, and a cancel once the request is.  Work
a crash left in doubt runs again from its saved spec: deferred jobs one at a
time, uncertain ones when a person says so.  The scheduler's callbacks also
keep the refusals for the Health page, the histogram of waiting times for
``GET /metrics``, and run a job's release hook when it ends.

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
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from roomkeeper.config import PressureSettings, read_pressure_settings
from roomkeeper.errors import (
    NotEndedError,
    PersistenceError,
    UnknownJobError,
    UnrunnableError,
    UsageError,
)
from roomkeeper.gateway.refusals import Refusal
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.guard.rule import Decision
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import (
    Launcher,
    Placement,
    SchedulerListeners,
    SchedulerParts,
    SchedulerSettings,
)
from roomkeeper.jobs.sizes import size_key, with_learned_size
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.loopback.hooks import HOOK_DUE, HookRunner, ReleaseHook
from roomkeeper.processes.job_user import JobUser
from roomkeeper.relief.ladder import Step
from roomkeeper.relief.monitor import ReliefEvent
from roomkeeper.worktrees.request import WorktreeRequest
from roomkeeper.worktrees.service import Worktrees

log = logging.getLogger("roomkeeper")

MARKER_TIMEOUT_S = 30.0
_RELIEF_CODES = {
    Step.HOLD: RecoveryCode.PRESSURE_HOLD,
    Step.SUSPEND: RecoveryCode.PRESSURE_SUSPENDED,
    Step.RESUME: RecoveryCode.PRESSURE_RESUMED,
    Step.STOP: RecoveryCode.PRESSURE_STOPPED,
    Step.RELIEVE: RecoveryCode.PRESSURE_RELIEVE,
}
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)


def _fsync_file(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class DurableJobs:
    """The gateway's scheduler and what it records of each job.

    Args:
        logs_dir: where the jobs' output is kept.
        guard: the admission guard the scheduler asks.
        limits: the scheduler's bounds, with the gateway's holds on top.
        journal: where each job and each change of state is recorded.
        refusals: recent refusals for the Health page (shared with the gateway).
        closing: whether the gateway is shutting down (no new job).
        watch: told of every journal write, to report one that fails.
        hooks: the pool release hooks run on, never the scheduler's thread: a hung
            hook holds only its own job's memory, until its deadline.
        job_user: the user jobs run as; None for the gateway's own.
        pressure_settings: the ROOMKEEPER_PRESSURE_* variables of the gateway's environment.
        worktrees: makes jobs' git worktrees and prunes finished ones (the guard's
            disk refusal gets one prune first); None: jobs cannot ask for a tree.
        launcher: starts a job's tree elsewhere (the Ray backend); None: here.
        placement: asked instead of ``guard`` when ``launcher`` runs jobs elsewhere.
    """

    def __init__(
        self,
        *,
        logs_dir: Path,
        guard: Guard,
        limits: Callable[[], Limits],
        journal: Journal,
        refusals: deque[Refusal],
        closing: Callable[[], bool],
        watch: Callable[[concurrent.futures.Future[None]], None],
        hooks: HookRunner,
        job_user: JobUser | None = None,
        pressure_settings: Callable[[], PressureSettings] = read_pressure_settings,
        worktrees: Worktrees | None = None,
        launcher: Launcher | None = None,
        placement: Placement | None = None,
    ) -> None:
        self._journal = journal
        self._hooks = hooks
        self._guard = guard
        self._refusals = refusals
        self._closing = closing
        self._watch = watch
        self._resuming: str | None = None  # the deferred job resumed now (one at a time)
        self.hooks: dict[str, ReleaseHook] = {}
        self.unsaved: dict[str, float] = {}  # jobs whose latest change failed to save, since
        self._withdrawn: set[str] = (
            set()
        )  # jobs answered 507 (not saved): never listed, never saved
        # Cumulative, as Prometheus histograms must be: counts per bucket, sum, count.
        self.wait_buckets = [0] * len(WAIT_BUCKETS)
        self.wait_sum = 0.0
        self.wait_count = 0
        # The latest journal write of each job; a failed one is kept (see _job_changed).
        self.writes: dict[str, concurrent.futures.Future[None]] = {}
        self.scheduler = Scheduler(
            SchedulerSettings(
                logs_dir=logs_dir, limits=limits, pressure_settings=pressure_settings
            ),
            parts=SchedulerParts(
                guard=guard,
                job_user=job_user,
                prepare=worktrees.prepare if worktrees is not None else None,
                reclaim_disk=worktrees.reclaim if worktrees is not None else None,
                launcher=launcher,
                placement=placement,
            ),
            listeners=SchedulerListeners(
                on_change=self._job_changed,
                on_end=self._job_ended,
                on_refusal=self._job_refused,
                before_launch=self._mark_launch,
                on_relief=self._relief_step,
            ),
        )

    def _relief_step(self, event: ReliefEvent) -> None:
        """A step of the relief ladder in the recovery history, numbers only (monitor thread)."""
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
        self._watch(self._journal.record_history(HistoryEvent(time.time(), code, numbers)))

    def _mark_launch(self, view: JobView) -> None:
        """The job's row and its pending marker, durable before the spawn (scheduler thread)."""
        write = self._journal.record_launch(view)
        self._watch(write)
        write.result(timeout=MARKER_TIMEOUT_S)  # a stuck disk fails the launch, not the scheduler

    def _job_changed(self, view: JobView) -> None:
        if view.id in self._withdrawn:
            return  # answered 507: it never was
        pid_started = None
        if view.state is JobState.RUNNING and view.pid is not None:
            with contextlib.suppress(psutil.Error):
                pid_started = psutil.Process(view.pid).create_time()
        if view.state.final:
            _fsync_file(view.log_path)  # logs before the index
        write = self._journal.record_job(view, pid_started=pid_started)
        self._watch(write)
        self.writes[view.id] = write
        if view.state.final and view.peak_bytes is not None:
            # Learned sizes: the next job of this kind that states none starts from this.
            self._watch(self._journal.record_peak(size_key(view.spec), view.peak_bytes))
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
            self._count_wait(max(0.0, view.started_at - view.submitted_at))

    def _count_wait(self, wait: float) -> None:
        """One job's wait before its start, into the histogram /metrics shows."""
        self.wait_sum += wait
        self.wait_count += 1
        for i, bound in enumerate(WAIT_BUCKETS):
            if wait <= bound:
                self.wait_buckets[i] += 1

    def _job_refused(self, job_id: str, decision: Decision) -> None:
        """Keep a refusal for the Health page once, not once per retried round."""
        last = self._refusals[-1] if self._refusals else None
        if last is None or (last.reason, last.subject) != (decision.reason, job_id):
            self._refusals.append(Refusal.of(decision, job_id))

    def _job_ended(self, view: JobView) -> concurrent.futures.Future[str] | None:
        """Start the job's release hook on the hook pool (called on the scheduler thread).

        Returns the hook's future: the scheduler keeps the job's memory reserved
        until it resolves (the hook runs before that memory is offered again),
        while every other launch goes on.
        """
        hook = self.hooks.pop(view.id, None)
        if hook is None:
            return None
        return self._make_hook(view.id, hook)

    def _make_hook(self, job_id: str, hook: ReleaseHook) -> concurrent.futures.Future[str]:
        """Save the hook as due, make the call (keyed by the job) on the hook pool, and save
        its outcome.  The journal writes in order, so ``due`` is never saved after it."""
        self._watch(self._journal.settle_job_hook(job_id, HOOK_DUE))
        pending = self._hooks.submit(replace(hook, key=f"job-{job_id}"))

        def report(done: concurrent.futures.Future[str]) -> None:
            outcome = done.result() if done.exception() is None else f"failed: {done.exception()}"
            self._watch(self._journal.settle_job_hook(job_id, outcome))
            if not outcome.startswith("ok"):
                log.warning("release hook of job %s %s", job_id, outcome)

        pending.add_done_callback(report)
        return pending

    def restore_hooks(self) -> list[tuple[str, ReleaseHook]]:
        """At start: hooks of jobs that will run again go back with them; the hooks owed by
        jobs that ended (or a crash ended) are returned, to be made now."""
        due = []
        for job_id, hook, state in self._journal.job_hooks_owed():
            if state is JobState.DEFERRED or not state.final:
                self.hooks[job_id] = hook
            else:
                due.append((job_id, hook))
        return due

    async def run_due_hooks(self, due: list[tuple[str, ReleaseHook]]) -> None:
        """Make the hooks owed since before this start, once each, recording each outcome."""
        for job_id, hook in due:
            outcome = await asyncio.wrap_future(self._make_hook(job_id, hook))
            log.warning(
                "job %s: its release hook, due since before this start, ran: %s", job_id, outcome
            )

    async def submit(self, spec: JobSpec, release: ReleaseHook | None) -> JobView:
        """Queue a job; returns once its record is durable.  Never blocks the event loop."""
        if self._closing():
            raise UsageError("the gateway is shutting down", name="shutdown")
        spec = await asyncio.to_thread(self.learned, spec)
        spec = await self._refuse_what_never_fits(spec)
        job_id = uuid.uuid4().hex[:12]
        if release is not None:
            # Saved before the job is: a crash from here on leaves a hook owed, not lost.
            saved = self._journal.save_job_hook(job_id, release)
            self._watch(saved)
            await asyncio.wrap_future(saved)
            self.hooks[job_id] = release  # before the job exists: it may end at once
        try:
            view = await asyncio.to_thread(self.scheduler.submit, spec, job_id=job_id)
        except BaseException:
            self.hooks.pop(job_id, None)
            raise
        write = self.writes.get(job_id)
        if write is not None:
            try:
                await asyncio.wrap_future(write)
            except Exception as err:  # not saved: it must not run, and must not look saved
                await asyncio.to_thread(self._withdraw, job_id)
                raise PersistenceError(f"the job was not saved, so it will not run: {err}") from err
        return view

    def learned(self, spec: JobSpec) -> JobSpec:
        """``spec`` with the learned size of its kind, when it states no estimate (off the loop)."""
        if spec.memory_bytes is not None:
            return spec
        learned = self._journal.learned_size(size_key(spec))
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
        deferred job that runs again.
        """
        view = self.scheduler.get(job_id)
        if not view.state.final:
            asked = self._journal.request_stop(job_id)
            self._watch(asked)
            try:
                asked.result()
            except Exception as err:
                # The tree is stopped all the same (a full disk must not keep it running);
                # its end is saved once the journal can (a failed save is retried).
                log.error(
                    "job %s: its cancel could not be saved first (%s); stopping it", job_id, err
                )
        view = self.scheduler.cancel(job_id)
        write = self.writes.get(job_id)
        if write is not None and view.state.final:
            with contextlib.suppress(Exception):  # failed: kept unsaved, retried, reported
                write.result(timeout=MARKER_TIMEOUT_S)
        return view

    def _withdraw(self, job_id: str) -> None:
        """A job answered 507: cancelled before it can run, then forgotten, so it is never
        listed (as failed or cancelled) nor saved later by a retry."""
        self._withdrawn.add(job_id)
        self.hooks.pop(job_id, None)  # before the cancel: a job that never was has no hook
        self.scheduler.cancel(job_id)
        with contextlib.suppress(UnknownJobError, NotEndedError):
            self.scheduler.forget(job_id)
        self.writes.pop(job_id, None)
        self.unsaved.pop(job_id, None)
        self.hooks.pop(job_id, None)

    def retry_unsaved(self) -> int:
        """Save again each job whose latest change could not be saved; how many still are not.

        Called on a timer: a job that ended while the disk was full is saved as ended once
        the disk takes it, never left ``running`` in the journal.
        """
        for job_id in list(self.unsaved):
            write = self.writes.get(job_id)
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
        write = self.writes.get(job_id)
        if write is not None:
            write.result(timeout=MARKER_TIMEOUT_S)
        if job_id in self.unsaved:
            raise NotEndedError(
                f"job {job_id!r} is not saved as ended yet; try again in a moment",
                work_id=job_id,
                reason="not_ended",
            )
        try:
            forgotten = self._journal.forget_job(job_id).result()
        except sqlite3.OperationalError:
            # A full disk: its output goes first, freeing the space the delete needs.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_path)
            forgotten = self._journal.forget_job(job_id).result()
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

    def spec_from_row(self, spec: dict[str, Any], owner: str, resumable: bool) -> JobSpec:
        """The job as it was asked for, to run it again (its deadline counts from now)."""
        return JobSpec(
            argv=spec["argv"],
            owner=owner,
            cwd=spec.get("cwd"),
            # A row without the flag is from before it: its env is whole when given.
            env=spec.get("env"),
            inherit_env=bool(spec.get("inherit_env", spec.get("env") is None)),
            memory_bytes=spec.get("memory_bytes"),
            disk_bytes=spec.get("disk_bytes"),
            timeout_s=spec.get("timeout_s"),
            shell=bool(spec.get("shell")),
            resumable=resumable,
            restartable=bool(spec.get("restartable")),
            worktree=_worktree_from_row(spec.get("worktree")),
            memory_policy=MemoryPolicy(spec.get("memory_policy", MemoryPolicy.STRICT.value)),
            kind=spec.get("kind"),
            learned_bytes=spec.get("learned_bytes"),
        )

    def resume_next(self) -> str | None:
        """Resume the oldest deferred job if none is resuming now (one at a time).

        The gateway asks only while nothing holds automatic work.
        """
        if self._resuming is not None:
            with contextlib.suppress(UnknownJobError):
                if not self.scheduler.get(self._resuming).state.final:
                    return None
        self._resuming = None
        row = self._journal.next_deferred()
        if row is None:
            return None
        self.scheduler.submit(self.spec_from_row(row.spec, row.owner, row.resumable), job_id=row.id)
        self._resuming = row.id
        self._watch(
            self._journal.record_history(
                HistoryEvent(time.time(), RecoveryCode.RESUMED, {"jobs": 1})
            )
        )
        return row.id

    def resolve(self, job_id: str, resolution: str) -> str:
        """Settle an uncertain job: succeeded or failed, or run it again now."""
        row = self._journal.job(job_id)
        if row is None:
            raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id)
        if row.state != JobState.UNCERTAIN.value:
            raise UsageError(f"job {job_id!r} is {row.state}, not uncertain", name="state")
        now = time.time()
        if resolution == "rerun":
            self.scheduler.submit(
                self.spec_from_row(row.spec, row.owner, row.resumable), job_id=job_id
            )
        elif not self._journal.resolve_job(job_id, resolution=resolution, at=now).result():
            raise UsageError(f"job {job_id!r} is no longer uncertain", name="state")
        self._watch(
            self._journal.record_history(HistoryEvent(now, RecoveryCode.RESOLVED, {"jobs": 1}))
        )
        return resolution


def _worktree_from_row(saved: Any) -> WorktreeRequest | None:
    """The saved ask for a worktree (a row saved before worktrees existed has none)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("repo"), str):
        return None
    branch = saved.get("branch")
    return WorktreeRequest(saved["repo"], branch if isinstance(branch, str) else None)

"""Jobs' release hooks: saved with the job, made on the hook pool when it ends.

A job's hook is saved before the job is, so a crash leaves a hook owed,
never lost.  It is made on the hook pool, never the scheduler's thread: a
hung hook holds only its own job's memory, until its deadline.  Its outcome
is saved; hooks owed since before a start are made once the gateway serves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import replace

from roomkeeper.gateway.context import GatewayContext
from roomkeeper.gateway.persistence import FREE_SPACE, awaited
from roomkeeper.jobs.spec import JobState, JobView
from roomkeeper.loopback.hook_calls import HookRunner
from roomkeeper.loopback.hooks import HOOK_DUE, ReleaseHook

log = logging.getLogger("roomkeeper")

NOT_RUN = f"the job is not queued and will not run: submit it again once it saves; {FREE_SPACE}"


class JobHooks:
    """The release hooks of this run's jobs, and the pool they are made on.

    Args:
        context: the gateway's journal and the watch on its writes.
        runner: the pool release hooks run on, each within its deadline.
    """

    def __init__(self, context: GatewayContext, *, runner: HookRunner) -> None:
        self._journal = context.journal
        self._watch = context.watch
        self._runner = runner
        self._pending: dict[str, ReleaseHook] = {}  # job id -> its hook, until it ends

    async def keep(self, job_id: str, hook: ReleaseHook) -> None:
        """Save the job's hook, then keep it for the job's end (before the job exists: it
        may end at once).

        Raises:
            PersistenceError: not saved, so the job is not queued.
            SaveTimeoutError: the same, the journal not answering within the deadline.
        """
        saved = self._journal.save_job_hook(job_id, hook)
        self._watch(saved)
        await awaited(saved, "the job's release hook", then=NOT_RUN)
        self._pending[job_id] = hook

    def forget(self, job_id: str) -> None:
        """The job never was (it was not queued, or answered 507): it has no hook."""
        self._pending.pop(job_id, None)

    def ended(self, view: JobView) -> concurrent.futures.Future[str] | None:
        """Start the job's release hook on the hook pool (called on the scheduler thread).

        Returns the hook's future: the scheduler keeps the job's memory reserved
        until it resolves (the hook runs before that memory is offered again),
        while every other launch goes on.
        """
        hook = self._pending.pop(view.id, None)
        if hook is None:
            return None
        return self._make(view.id, hook)

    def _make(self, job_id: str, hook: ReleaseHook) -> concurrent.futures.Future[str]:
        """Save the hook as due, make the call (keyed by the job) on the hook pool, and save
        its outcome.  The journal writes in order, so ``due`` is never saved after it."""
        self._watch(self._journal.settle_job_hook(job_id, HOOK_DUE))
        pending = self._runner.submit(replace(hook, key=f"job-{job_id}"))

        def report(done: concurrent.futures.Future[str]) -> None:
            outcome = done.result() if done.exception() is None else f"failed: {done.exception()}"
            self._watch(self._journal.settle_job_hook(job_id, outcome))
            if not outcome.startswith("ok"):
                log.warning("release hook of job %s %s", job_id, outcome)

        pending.add_done_callback(report)
        return pending

    def restore(self) -> list[tuple[str, ReleaseHook]]:
        """At start: hooks of jobs that will run again go back with them; the hooks owed by
        jobs that ended (or a crash ended) are returned, to be made now."""
        due = []
        for job_id, hook, state in self._journal.job_hooks_owed():
            if state is JobState.DEFERRED or not state.final:
                self._pending[job_id] = hook
            else:
                due.append((job_id, hook))
        return due

    async def run_due(self, due: list[tuple[str, ReleaseHook]]) -> None:
        """Make the hooks owed since before this start, once each, recording each outcome."""
        for job_id, hook in due:
            outcome = await asyncio.wrap_future(self._make(job_id, hook))
            log.warning(
                "job %s: its release hook, due since before this start, ran: %s", job_id, outcome
            )

"""Work in doubt: what a crash left deferred or uncertain, run again from its saved spec.

Deferred jobs (resumable, or not yet started when the gateway stopped) are
resumed one at a time, while nothing holds automatic work; an uncertain job
waits for a person to say it succeeded, failed, or should run again.  Either
way it runs again from the spec its row saved, its deadline counting from now.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from roomkeeper.errors import StateConflictError, UnknownJobError
from roomkeeper.gateway.context import GatewayContext
from roomkeeper.gateway.persistence import FREE_SPACE, saved
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.spec import JobSpec, JobState
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.worktrees.request import WorktreeRequest


class WorkInDoubt:
    """Resumes deferred jobs one at a time, and settles uncertain ones as a person says.

    Args:
        context: the gateway's journal and the watch on its writes.
        scheduler: where resumed and re-run jobs are queued.
    """

    def __init__(self, context: GatewayContext, *, scheduler: Scheduler) -> None:
        self._journal = context.journal
        self._watch = context.watch
        self._scheduler = scheduler
        self._resuming: str | None = None  # the deferred job resumed now (one at a time)

    def resume_next(self) -> str | None:
        """Resume the oldest deferred job if none is resuming now (one at a time).

        The gateway asks only while nothing holds automatic work.
        """
        if self._resuming is not None:
            with contextlib.suppress(UnknownJobError):
                if not self._scheduler.get(self._resuming).state.final:
                    return None
        self._resuming = None
        row = self._journal.next_deferred()
        if row is None:
            return None
        self._scheduler.submit(spec_from_row(row.spec, row.owner, row.resumable), job_id=row.id)
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
            raise StateConflictError(
                f"job {job_id!r} is {row.state}, not uncertain: only a job whose end is in "
                "doubt can be resolved",
                work_id=job_id,
                reason="not_uncertain",
            )
        now = time.time()
        if resolution == "rerun":
            self._scheduler.submit(spec_from_row(row.spec, row.owner, row.resumable), job_id=job_id)
        elif not self._resolved(job_id, resolution, now):
            raise StateConflictError(
                f"job {job_id!r} is no longer uncertain", work_id=job_id, reason="not_uncertain"
            )
        self._watch(
            self._journal.record_history(HistoryEvent(now, RecoveryCode.RESOLVED, {"jobs": 1}))
        )
        return resolution

    def _resolved(self, job_id: str, resolution: str, at: float) -> bool:
        """Save a person's word on an uncertain job, within the save deadline; False when the
        job was no longer uncertain.

        Raises:
            PersistenceError: the journal refused it.
            SaveTimeoutError: the journal did not answer in time.
        """
        write = self._journal.resolve_job(job_id, resolution=resolution, at=at)
        self._watch(write)
        return saved(write, f"job {job_id!r}'s resolution", then=f"ask again; {FREE_SPACE}")


def spec_from_row(spec: dict[str, Any], owner: str, resumable: bool) -> JobSpec:
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
        shape_bytes=spec.get("shape_bytes"),  # a row from before shapes has none
        jobserver=bool(spec.get("jobserver")),  # a row from before jobservers has none
    )


def _worktree_from_row(saved: Any) -> WorktreeRequest | None:
    """The saved ask for a worktree (a row saved before worktrees existed has none)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("repo"), str):
        return None
    branch = saved.get("branch")
    return WorktreeRequest(saved["repo"], branch if isinstance(branch, str) else None)

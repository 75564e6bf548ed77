"""The work routes of the HTTP API: jobs, registered calls and the recovery history.

:func:`work_routes` builds them for one gateway; :func:`roomkeeper.api.app.create_app`
includes them with its token check on every one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, params

from roomkeeper.api.models import NAME, CallIn, Id, JobIn, OutcomeIn, ResolveIn
from roomkeeper.api.output import output_routes
from roomkeeper.api.paging import (
    DEFAULT_LIMIT,
    PAGED_RESPONSES,
    Cursor,
    Limit,
    SortKey,
    decode_cursor,
    newest_first_page,
    say_next,
)
from roomkeeper.api.responses import SENT_AS_BUILT, CallOut, HistoryEventOut, JobCreated, JobOut
from roomkeeper.api.views import job_json, row_json
from roomkeeper.errors import PersistenceError, UnknownJobError, UsageError
from roomkeeper.gateway.calls import CallState
from roomkeeper.gateway.service import Gateway
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.jobs.spec import JobSpec, JobState, validate_runnable
from roomkeeper.worktrees.request import WorktreeRequest
from roomkeeper.worktrees.service import validate_worktree


def work_routes(gateway: Gateway, auth: Sequence[params.Depends]) -> APIRouter:
    """``/v1/jobs``, ``/v1/calls`` and ``/v1/history`` for ``gateway``, each behind ``auth``."""
    router = APIRouter()
    _job_routes(router, gateway, auth)
    output_routes(router, gateway, auth, _find_job)
    _call_routes(router, gateway, auth)
    _call_ending_routes(router, gateway, auth)
    _history_route(router, gateway, auth)
    return router


# ------------------------------------------------------------------ jobs


def _job_routes(router: APIRouter, gateway: Gateway, auth: Sequence[params.Depends]) -> None:
    """Submit, list, read, follow, cancel and resolve jobs."""

    @router.post(
        "/v1/jobs",
        status_code=201,
        dependencies=auth,
        response_model=JobCreated,
        **SENT_AS_BUILT,
    )
    async def submit_job(body: JobIn) -> dict[str, Any]:
        """Queue a job; 429 with the reason when a queue bound is reached; 507 while the
        journal cannot save, or start-up recovery it refused is still owed."""
        gateway.startup.refuse_new_work_while_owed()
        view = await gateway.durable_jobs.submit(
            _job_spec(gateway, body), body.release.hook() if body.release else None
        )
        return {"id": view.id, "state": view.state.value}

    @router.get(
        "/v1/jobs",
        dependencies=auth,
        response_model=list[JobOut],
        responses=PAGED_RESPONSES,
        **SENT_AS_BUILT,
    )
    def list_jobs(
        response: Response,
        owner: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME)] = None,
        state: JobState | None = None,
        limit: Limit = DEFAULT_LIMIT,
        cursor: Cursor = None,
    ) -> list[dict[str, Any]]:
        """Jobs of this run and earlier ones, newest first, ``limit`` a page; when more
        follow, ``X-Next-Cursor`` and ``Link`` name the next page."""
        chosen = state.value if state else None
        page, next_key = _listed_jobs(
            gateway, owner=owner, state=chosen, limit=limit, after=decode_cursor(cursor)
        )
        query = {"owner": owner, "state": chosen, "limit": limit}
        say_next(response, "/v1/jobs", query, next_key)
        return page

    @router.get("/v1/jobs/{job_id}", dependencies=auth, response_model=JobOut, **SENT_AS_BUILT)
    def get_job(job_id: Id) -> dict[str, Any]:
        """One job, live or from an earlier run."""
        return _find_job(gateway, job_id)

    @router.post(
        "/v1/jobs/{job_id}/cancel", dependencies=auth, response_model=JobOut, **SENT_AS_BUILT
    )
    def cancel_job(job_id: Id) -> dict[str, Any]:
        """Cancel a waiting job or stop a running one's whole tree (saved before it is answered).

        The job and its record stay (a cancel of an ended job changes nothing): remove
        the record with ``DELETE`` once it has ended."""
        return job_json(gateway.durable_jobs.cancel(job_id))

    @router.delete("/v1/jobs/{job_id}", status_code=204, dependencies=auth)
    def remove_job(job_id: Id) -> None:
        """Remove an ended job's record and its kept output; afterwards the job is 404.

        409 ``not_ended`` while it waits or runs (cancel it first), 409 ``in_doubt``
        while it is uncertain or deferred (resolve it first)."""
        gateway.durable_jobs.remove(job_id)

    @router.post(
        "/v1/jobs/{job_id}/resolve", dependencies=auth, response_model=JobOut, **SENT_AS_BUILT
    )
    def resolve_job(job_id: Id, body: ResolveIn) -> dict[str, Any]:
        """Settle an uncertain job: succeeded, failed, or run it again.

        409 ``not_uncertain`` when the job is in any other state (its end is known)."""
        _require_saving(gateway)
        gateway.doubt.resolve(job_id, body.resolution)
        return _find_job(gateway, job_id)


def _job_spec(gateway: Gateway, body: JobIn) -> JobSpec:
    """The job a request asks for; without a ``cwd`` it runs in the workspace (made if need be).

    A job with a ``worktree`` runs in its own tree, made after admission; what
    would stop that tree being made (no repository, a branch checked out
    elsewhere, a dirty base) is a 422 now, before anything is queued.
    """
    worktree = None
    if body.worktree is not None:
        worktree = WorktreeRequest(body.worktree.repo, body.worktree.branch)
        validate_worktree(worktree, gateway.workspace)
    spec = JobSpec(
        argv=body.argv,
        owner=body.owner,
        cwd=body.cwd or str(gateway.workspace),
        env=body.env,
        inherit_env=True,  # the gateway's own variables are added at launch, never stored
        memory_bytes=body.memory_bytes,
        disk_bytes=body.disk_bytes,
        timeout_s=body.timeout_s,
        resumable=body.resumable,
        restartable=body.restartable,
        worktree=worktree,
        memory_policy=MemoryPolicy(body.memory_policy),
        kind=body.kind,
        jobserver=body.jobserver,
    )
    if body.cwd is None:
        gateway.ensure_workspace()
    program = spec.argv[0]
    if worktree is None or "/" not in program or program.startswith("/"):
        # (a relative path in a worktree job is found in its tree, which is made later)
        validate_runnable(spec)  # 422 saying which, before anything is queued
    return spec


def _listed_jobs(
    gateway: Gateway,
    *,
    owner: str | None,
    state: str | None,
    limit: int = DEFAULT_LIMIT,
    after: SortKey | None = None,
) -> tuple[list[dict[str, Any]], SortKey | None]:
    """One page of this run's jobs over the journal's rows of the same ids, filtered,
    newest first; and the next page's key, if more follow."""
    tokens = gateway.scheduler.jobserver_statistics()
    live = {v.id: job_json(v, tokens.get(v.id)) for v in gateway.scheduler.jobs()}
    found = gateway.journal.jobs(owner=owner, state=state, limit=limit + 1, before=after)
    rows = {r.id: row_json(r) for r in found}
    rows.update(
        {
            i: j
            for i, j in live.items()
            if (owner is None or j["owner"] == owner) and (state is None or j["state"] == state)
        }
    )
    # A journal row whose live job is now in another state (one the filter leaves out) is stale.
    for i in [i for i, j in rows.items() if i in live and live[i]["state"] != j["state"]]:
        del rows[i]
    page, next_key = newest_first_page(list(rows.values()), "submitted_at", limit, after)
    if next_key is None and len(found) > limit:  # the journal holds more than this page
        if page:
            next_key = (float(page[-1]["submitted_at"]), str(page[-1]["id"]))
        else:  # every row read was stale: go on past the last one read
            next_key = (found[-2].submitted_at, found[-2].id)
    return page, next_key


def _find_job(gateway: Gateway, job_id: str) -> dict[str, Any]:
    """One job as the API shows it: live if this run has it, else from the journal.

    Raises:
        UnknownJobError: no job has that id (404).
    """
    with contextlib.suppress(UnknownJobError):
        tokens = gateway.scheduler.jobserver_statistics().get(job_id)
        return job_json(gateway.scheduler.get(job_id), tokens)
    row = gateway.journal.job(job_id)
    if row is None:
        raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id)
    return row_json(row)


# ----------------------------------------------------------------- calls


def _call_routes(router: APIRouter, gateway: Gateway, auth: Sequence[params.Depends]) -> None:
    """Register side-effecting calls, list and read them, save their outcomes."""

    @router.post(
        "/v1/calls", status_code=201, dependencies=auth, response_model=CallOut, **SENT_AS_BUILT
    )
    def register_call(body: CallIn) -> dict[str, Any]:
        """Register a side-effecting call; answered once its pending marker is durable."""
        if gateway.closing:
            raise UsageError("the gateway is shutting down", name="shutdown")
        # Owed recovery marks every pending call uncertain: this run's would be taken too.
        gateway.startup.refuse_new_work_while_owed()
        return gateway.calls.register(body.kind, body.owner, resumable=body.resumable).to_json()

    @router.get("/v1/calls", dependencies=auth, response_model=list[CallOut], **SENT_AS_BUILT)
    def list_calls(state: CallState | None = None) -> list[dict[str, Any]]:
        """Registered calls, newest first."""
        return [c.to_json() for c in gateway.calls.list(state=state.value if state else None)]

    @router.get("/v1/calls/{call_id}", dependencies=auth, response_model=CallOut, **SENT_AS_BUILT)
    def get_call(call_id: Id) -> dict[str, Any]:
        """One registered call."""
        return gateway.calls.get(call_id).to_json()

    @router.post(
        "/v1/calls/{call_id}/outcome", dependencies=auth, response_model=CallOut, **SENT_AS_BUILT
    )
    def call_outcome(call_id: Id, body: OutcomeIn) -> dict[str, Any]:
        """Save a call's outcome; only then is its pending marker cleared."""
        return gateway.calls.outcome(
            call_id,
            succeeded=body.outcome == "succeeded",
            numbers=body.numbers,
            error=body.error,
        ).to_json()


def _call_ending_routes(
    router: APIRouter, gateway: Gateway, auth: Sequence[params.Depends]
) -> None:
    """Cancel, remove and resolve registered calls."""

    @router.post(
        "/v1/calls/{call_id}/cancel", dependencies=auth, response_model=CallOut, **SENT_AS_BUILT
    )
    def cancel_call(call_id: Id) -> dict[str, Any]:
        """Cancel a pending call; a result arriving later cannot retire its marker."""
        return gateway.calls.cancel(call_id).to_json()

    @router.delete("/v1/calls/{call_id}", status_code=204, dependencies=auth)
    def remove_call(call_id: Id) -> None:
        """Remove a call whose outcome is saved; afterwards the call is 404.

        409 ``not_ended`` while it is pending, 409 ``in_doubt`` while it is uncertain
        or cancelled (resolve it first)."""
        gateway.calls.remove(call_id)

    @router.post(
        "/v1/calls/{call_id}/resolve", dependencies=auth, response_model=CallOut, **SENT_AS_BUILT
    )
    def resolve_call(call_id: Id, body: ResolveIn) -> dict[str, Any]:
        """Settle an uncertain call: succeeded, failed, or pending again (rerun)."""
        return gateway.calls.resolve(call_id, body.resolution).to_json()


def _require_saving(gateway: Gateway) -> None:
    """Refuse a change the journal cannot save now (507)."""
    if gateway.persistence_error is not None:
        raise PersistenceError(f"the journal cannot save: {gateway.persistence_error}")


# --------------------------------------------------------------- history


def _history_route(router: APIRouter, gateway: Gateway, auth: Sequence[params.Depends]) -> None:
    """The recovery history."""

    @router.get(
        "/v1/history", dependencies=auth, response_model=list[HistoryEventOut], **SENT_AS_BUILT
    )
    def history() -> list[dict[str, Any]]:
        """Recovery events, newest first: timestamps, reason codes and numbers only."""
        return [
            {"at": e.at, "code": e.code.value, "numbers": dict(e.numbers), "node": e.node}
            for e in gateway.journal.history()
        ]

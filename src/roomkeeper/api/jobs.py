"""The work routes of the HTTP API: jobs, registered calls and the recovery history.

:func:`work_routes` builds them for one gateway; :func:`roomkeeper.api.app.create_app`
includes them with its token check on every one.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, params

from roomkeeper.api.models import NAME, CallIn, Id, JobIn, OutcomeIn, ResolveIn
from roomkeeper.api.output import output_routes
from roomkeeper.api.views import job_json, row_json
from roomkeeper.errors import PersistenceError, UnknownJobError, UsageError
from roomkeeper.gateway.calls import CallState
from roomkeeper.gateway.service import Gateway
from roomkeeper.jobs.spec import JobSpec, JobState, check_runnable


def work_routes(gateway: Gateway, auth: Sequence[params.Depends]) -> APIRouter:
    """``/v1/jobs``, ``/v1/calls`` and ``/v1/history`` for ``gateway``, each behind ``auth``."""
    router = APIRouter()
    _job_routes(router, gateway, auth)
    output_routes(router, gateway, auth, _find_job)
    _call_routes(router, gateway, auth)
    _history_route(router, gateway, auth)
    return router


# ------------------------------------------------------------------ jobs


def _job_routes(router: APIRouter, gateway: Gateway, auth: Sequence[params.Depends]) -> None:
    """Submit, list, read, follow, cancel and resolve jobs."""

    @router.post("/v1/jobs", status_code=201, dependencies=auth)
    async def submit_job(body: JobIn) -> dict[str, Any]:
        """Queue a job; 429 with the reason when a queue bound is reached."""
        view = await gateway.durable_jobs.submit(
            _job_spec(gateway, body), body.release.hook() if body.release else None
        )
        return {"id": view.id, "state": view.state.value}

    @router.get("/v1/jobs", dependencies=auth)
    def list_jobs(
        owner: Annotated[str | None, Query(min_length=1, max_length=200, pattern=NAME)] = None,
        state: JobState | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs of this run and earlier ones, newest first."""
        return _listed_jobs(gateway, owner=owner, state=state.value if state else None)

    @router.get("/v1/jobs/{job_id}", dependencies=auth)
    def get_job(job_id: Id) -> dict[str, Any]:
        """One job, live or from an earlier run."""
        return _find_job(gateway, job_id)

    @router.delete("/v1/jobs/{job_id}", dependencies=auth)
    def cancel_job(job_id: Id) -> dict[str, Any]:
        """Cancel a waiting job or stop a running one's whole tree (saved before it is answered)."""
        return job_json(gateway.durable_jobs.cancel(job_id))

    @router.post("/v1/jobs/{job_id}/resolve", dependencies=auth)
    def resolve_job(job_id: Id, body: ResolveIn) -> dict[str, Any]:
        """Settle an uncertain job: succeeded, failed, or run it again."""
        _require_saving(gateway)
        gateway.durable_jobs.resolve(job_id, body.resolution)
        return _find_job(gateway, job_id)


def _job_spec(gateway: Gateway, body: JobIn) -> JobSpec:
    """The job a request asks for; without a ``cwd`` it runs in the workspace (made if need be)."""
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
    )
    if body.cwd is None:
        gateway.ensure_workspace()
    check_runnable(spec)  # 422 saying which, before anything is queued
    return spec


def _listed_jobs(gateway: Gateway, *, owner: str | None, state: str | None) -> list[dict[str, Any]]:
    """This run's jobs over the journal's rows of the same ids, filtered, newest first."""
    live = {v.id: job_json(v) for v in gateway.scheduler.jobs()}
    rows = {r.id: row_json(r) for r in gateway.journal.jobs(owner=owner, state=state)}
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
    return sorted(rows.values(), key=lambda j: j["submitted_at"], reverse=True)


def _find_job(gateway: Gateway, job_id: str) -> dict[str, Any]:
    """One job as the API shows it: live if this run has it, else from the journal.

    Raises:
        UnknownJobError: no job has that id (404).
    """
    with contextlib.suppress(UnknownJobError):
        return job_json(gateway.scheduler.get(job_id))
    row = gateway.journal.job(job_id)
    if row is None:
        raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id)
    return row_json(row)


# ----------------------------------------------------------------- calls


def _call_routes(router: APIRouter, gateway: Gateway, auth: Sequence[params.Depends]) -> None:
    """Register side-effecting calls, save their outcomes, cancel and resolve them."""

    @router.post("/v1/calls", status_code=201, dependencies=auth)
    def register_call(body: CallIn) -> dict[str, Any]:
        """Register a side-effecting call; answered once its pending marker is durable."""
        if gateway.closing:
            raise UsageError("the gateway is shutting down", name="shutdown")
        try:
            return gateway.calls.register(body.kind, body.owner, resumable=body.resumable).to_json()
        except sqlite3.Error as err:
            raise PersistenceError(f"the call was not registered: {err}") from err

    @router.get("/v1/calls", dependencies=auth)
    def list_calls(state: CallState | None = None) -> list[dict[str, Any]]:
        """Registered calls, newest first."""
        return [c.to_json() for c in gateway.calls.list(state=state.value if state else None)]

    @router.get("/v1/calls/{call_id}", dependencies=auth)
    def get_call(call_id: Id) -> dict[str, Any]:
        """One registered call."""
        return gateway.calls.get(call_id).to_json()

    @router.post("/v1/calls/{call_id}/outcome", dependencies=auth)
    def call_outcome(call_id: Id, body: OutcomeIn) -> dict[str, Any]:
        """Save a call's outcome; only then is its pending marker cleared."""
        try:
            return gateway.calls.outcome(
                call_id,
                succeeded=body.outcome == "succeeded",
                numbers=body.numbers,
                error=body.error,
            ).to_json()
        except sqlite3.Error as err:
            raise PersistenceError(f"the outcome was not saved: {err}") from err

    @router.delete("/v1/calls/{call_id}", dependencies=auth)
    def cancel_call(call_id: Id) -> dict[str, Any]:
        """Cancel a pending call; a result arriving later cannot retire its marker."""
        return gateway.calls.cancel(call_id).to_json()

    @router.post("/v1/calls/{call_id}/resolve", dependencies=auth)
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

    @router.get("/v1/history", dependencies=auth)
    def history() -> list[dict[str, Any]]:
        """Recovery events, newest first: timestamps, reason codes and numbers only."""
        return [
            {"at": e.at, "code": e.code.value, "numbers": dict(e.numbers)}
            for e in gateway.journal.history()
        ]

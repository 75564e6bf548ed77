"""The HTTP API over :class:`roomkeeper.gateway.Gateway` (FastAPI, versioned under /v1).

Every call needs ``Authorization: Bearer <token>`` except ``GET /health``,
``GET /metrics``, the Health page (``GET /``) and its feed (``GET /v1/feed``),
which carry no command line, path, environment or output.  Sizes are bytes,
durations seconds.  Bad input gets a 4xx saying what was wrong; a crafted or
oversized body never produces a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from importlib import resources as package_files
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from roomkeeper import __version__
from roomkeeper.api_models import (
    CallIn,
    HeartbeatIn,
    JobIn,
    LeaseIn,
    OutcomeIn,
    ResolveIn,
)
from roomkeeper.bodylimit import BodyLimit
from roomkeeper.calls import CallStateError
from roomkeeper.errors import PersistenceError, QueueFullError, UnknownJobError, UsageError
from roomkeeper.gateway import HEADLINES, Gateway, job_environment
from roomkeeper.jobs import JobSpec, JobState, JobView
from roomkeeper.journal import JobRow
from roomkeeper.leases import LeaseView
from roomkeeper.metrics import render_metrics

MAX_BODY_BYTES = 1024 * 1024
LAST_OUTPUT_BYTES = 500
JOB_FIELDS = (
    "id",
    "owner",
    "state",
    "reason",
    "exit_code",
    "argv",
    "submitted_at",
    "started_at",
    "ended_at",
    "peak_bytes",
    "error",
)
RUNNING_STATES = frozenset({JobState.WAITING.value, JobState.RUNNING.value})
BEARER = HTTPBearer(auto_error=False)
# Module-level so FastAPI can resolve them (this module postpones annotations).
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
Id = Annotated[str, PathParam(max_length=200)]


def job_json(view: JobView) -> dict[str, Any]:
    """A live job as the API shows it (the same fields as a journal row)."""
    return {
        "id": view.id,
        "owner": view.owner,
        "state": view.state.value,
        "reason": view.reason.value if view.reason else None,
        "exit_code": view.exit_code,
        "argv": list(view.spec.argv),
        "submitted_at": view.submitted_at,
        "started_at": view.started_at,
        "ended_at": view.ended_at,
        "peak_bytes": view.peak_bytes,
        "error": view.error,
    }


def row_json(row: JobRow) -> dict[str, Any]:
    """A job of an earlier run, from the journal."""
    fields = {k: getattr(row, k) for k in JOB_FIELDS if k != "argv"}
    answer = {**fields, "argv": row.spec.get("argv", []), "resolution": row.resolution}
    if row.state == JobState.UNCERTAIN.value:
        answer["last_output"] = _tail(row.log_path)  # what is known of work in doubt
    return answer


def _tail(path: str, size: int = LAST_OUTPUT_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def lease_json(lease: LeaseView) -> dict[str, Any]:
    """A lease as the API shows it."""
    return {
        "id": lease.id,
        "owner": lease.owner,
        "state": lease.state.value,
        "memory_bytes": lease.memory_bytes,
        "disk_bytes": lease.disk_bytes,
        "ttl_s": lease.ttl_s,
        "granted_at": lease.granted_at,
        "expires_at": lease.expires_at,
        "ended_at": lease.ended_at,
        "release": lease.release.to_json() if lease.release else None,
        "hook_outcome": lease.hook_outcome,
    }


def _page() -> str:
    try:
        return (package_files.files("roomkeeper") / "web" / "health.html").read_text()
    except (FileNotFoundError, OSError):
        return "<!doctype html><title>roomkeeper</title><p>The Health page is not installed."


def create_app(gateway: Gateway, *, port: int | None = None, socket: str | None = None) -> FastAPI:
    """The FastAPI application for one gateway (``port``/``socket`` are written for the CLI)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start(port=port, socket=socket)
        try:
            yield
        finally:
            await gateway.shutdown()

    app = FastAPI(title="roomkeeper", version=__version__, lifespan=lifespan)
    page = _page()

    def authorized(credentials: Credentials) -> None:
        given = credentials.credentials if credentials else ""
        if not hmac.compare_digest(given.encode(), gateway.token.encode()):
            raise HTTPException(
                401,
                "a valid token is required: Authorization: Bearer <ROOMKEEPER_HOME/token>",
                headers={"WWW-Authenticate": "Bearer"},
            )

    auth = [Depends(authorized)]

    @app.exception_handler(UsageError)
    async def usage_error(request: Request, err: UsageError) -> JSONResponse:
        status = 503 if err.name == "shutdown" else 422
        return JSONResponse({"detail": str(err)}, status)

    @app.exception_handler(UnknownJobError)
    async def unknown(request: Request, err: UnknownJobError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, 404)

    @app.exception_handler(PersistenceError)
    async def not_saved(request: Request, err: PersistenceError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, 507)

    @app.exception_handler(sqlite3.Error)
    async def journal_error(request: Request, err: sqlite3.Error) -> JSONResponse:
        # A journal that cannot save is reported as such, never as a success or a 500.
        gateway.persistence_error = str(err)
        return JSONResponse({"detail": f"not saved: the journal could not write ({err})"}, 507)

    @app.exception_handler(CallStateError)
    async def call_state(request: Request, err: CallStateError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, 409)

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, err: QueueFullError) -> JSONResponse:
        return JSONResponse({"reason": err.reason, "detail": str(err)}, 429)

    # ------------------------------------------------------------ open

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness for a probe, answered from the event loop without touching disk."""
        return {"boot_id": gateway.boot_id, "uptime_s": gateway.uptime()}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def health_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus text exposition."""
        body, content_type = render_metrics(gateway)
        return Response(body, media_type=content_type)

    @app.get("/v1/feed")
    def feed() -> dict[str, Any]:
        """What the Health page shows: ids, owners, states, reasons and numbers only."""
        decision = gateway.check()
        memory = decision.memory
        latest = gateway.samples[-1] if gateway.samples else gateway.sample()
        stats = gateway.scheduler.statistics()
        jobs = sorted(gateway.scheduler.jobs(), key=lambda v: v.submitted_at, reverse=True)[:50]
        live = {v.id for v in jobs}
        # Work in doubt from an earlier run lives only in the journal: show it too.
        in_doubt = [
            r
            for state in (JobState.UNCERTAIN.value, JobState.DEFERRED.value)
            for r in gateway.journal.jobs(state=state, limit=25)
            if r.id not in live
        ]
        return {
            "boot_id": gateway.boot_id,
            "uptime_s": gateway.uptime(),
            "now": time.time(),
            "guard": {
                "admit": decision.admit,
                "reason": decision.reason.value,
                "headline": HEADLINES.get(decision.reason, "ok"),
                "summary": decision.summary,
            },
            "memory": {
                "used_bytes": memory.used_bytes if memory else None,
                "limit_bytes": memory.limit_bytes if memory else None,
                "line_bytes": latest.line_bytes,
                "source": memory.source.value if memory else "not read",
            },
            "disk": {"free_bytes": latest.disk_free_bytes, "total_bytes": latest.disk_total_bytes},
            "history": [
                {
                    "at": s.at,
                    "used_bytes": s.used_bytes,
                    "limit_bytes": s.limit_bytes,
                    "line_bytes": s.line_bytes,
                    "disk_free_bytes": s.disk_free_bytes,
                    "disk_total_bytes": s.disk_total_bytes,
                    "running": s.running,
                    "waiting": s.waiting,
                }
                for s in list(gateway.samples)
            ],
            "owners": {o: {"waiting": w, "running": r} for o, (w, r) in stats.by_owner.items()},
            "jobs": [
                {
                    "id": v.id,
                    "owner": v.owner,
                    "state": v.state.value,
                    "reason": v.reason.value if v.reason else None,
                    "exit_code": v.exit_code,
                    "submitted_at": v.submitted_at,
                    "started_at": v.started_at,
                    "ended_at": v.ended_at,
                }
                for v in jobs
            ]
            + [
                {
                    "id": r.id,
                    "owner": r.owner,
                    "state": r.state,
                    "reason": None,
                    "exit_code": r.exit_code,
                    "submitted_at": r.submitted_at,
                    "started_at": r.started_at,
                    "ended_at": r.ended_at,
                }
                for r in in_doubt
            ]
            + [
                {
                    "id": c.id,
                    "owner": c.owner,
                    "state": c.state.value,
                    "reason": None,
                    "exit_code": None,
                    "submitted_at": c.created_at,
                    "started_at": c.created_at,
                    "ended_at": None,
                }
                for c in gateway.calls.list(state="uncertain")[:25]
            ],
            "refusals": [
                {"at": at, "reason": reason, "summary": summary}
                for at, reason, summary, _ in reversed(gateway.refusals)
            ],
            "recoveries": [
                {"at": e.at, "reason": e.code.value} for e in gateway.journal.history(limit=20)
            ],
            "leases": gateway.leases.counts(),
        }

    # ------------------------------------------------------------ jobs

    @app.post("/v1/jobs", status_code=201, dependencies=auth)
    async def submit_job(body: JobIn) -> dict[str, Any]:
        """Queue a job; 429 with the reason when a queue bound is reached."""
        spec = JobSpec(
            argv=body.argv,
            owner=body.owner,
            cwd=body.cwd or str(gateway.workspace),
            env=job_environment(body.env),
            memory_bytes=body.memory_bytes,
            disk_bytes=body.disk_bytes,
            timeout_s=body.timeout_s,
            resumable=body.resumable,
        )
        if body.cwd is None:
            gateway.workspace.mkdir(parents=True, exist_ok=True)
        view = await gateway.submit_job(spec, body.release.hook() if body.release else None)
        return {"id": view.id, "state": view.state.value}

    @app.get("/v1/jobs", dependencies=auth)
    def list_jobs(
        owner: Annotated[str | None, Query(max_length=200)] = None,
        state: Annotated[str | None, Query(max_length=40)] = None,
    ) -> list[dict[str, Any]]:
        """Jobs of this run and earlier ones, newest first."""
        live = {v.id: job_json(v) for v in gateway.scheduler.jobs()}
        rows = {r.id: row_json(r) for r in gateway.journal.jobs(owner=owner, state=state)}
        rows.update(
            {
                i: j
                for i, j in live.items()
                if (owner is None or j["owner"] == owner) and (state is None or j["state"] == state)
            }
        )
        for i in [i for i, j in rows.items() if i in live and live[i]["state"] != j["state"]]:
            del rows[i]
        return sorted(rows.values(), key=lambda j: j["submitted_at"], reverse=True)

    def _find(job_id: str) -> dict[str, Any]:
        with contextlib.suppress(UnknownJobError):
            return job_json(gateway.scheduler.get(job_id))
        row = gateway.journal.job(job_id)
        if row is None:
            raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id)
        return row_json(row)

    @app.get("/v1/jobs/{job_id}", dependencies=auth)
    def get_job(job_id: Id) -> dict[str, Any]:
        """One job, live or from an earlier run."""
        return _find(job_id)

    @app.get("/v1/jobs/{job_id}/output", dependencies=auth, response_model=None)
    async def job_output(job_id: Id, follow: bool = False) -> Response:
        """The job's kept output; ``follow=true`` streams it until the job ends."""
        job = await asyncio.to_thread(_find, job_id)
        row = await asyncio.to_thread(gateway.journal.job, job_id)
        path = Path(row.log_path if row else gateway.home / "logs" / f"{job_id}.log")
        if not follow:
            data = await asyncio.to_thread(lambda: path.read_bytes() if path.exists() else b"")
            return Response(data, media_type="text/plain")

        async def stream() -> AsyncIterator[bytes]:
            offset = 0
            while True:
                data = await asyncio.to_thread(_read_from, path, offset)
                offset += len(data)
                if data:
                    yield data
                state = (await asyncio.to_thread(_find, job_id))["state"]
                if state not in RUNNING_STATES or gateway.closing:
                    tail = await asyncio.to_thread(_read_from, path, offset)
                    if tail:
                        yield tail
                    return
                await asyncio.sleep(0.2)

        del job
        return StreamingResponse(stream(), media_type="text/plain")

    @app.delete("/v1/jobs/{job_id}", dependencies=auth)
    def cancel_job(job_id: Id) -> dict[str, Any]:
        """Cancel a waiting job or stop a running one's whole tree (saved before it is answered)."""
        return job_json(gateway.cancel_job(job_id))

    @app.post("/v1/jobs/{job_id}/resolve", dependencies=auth)
    def resolve_job(job_id: Id, body: ResolveIn) -> dict[str, Any]:
        """Settle an uncertain job: succeeded, failed, or run it again."""
        _guard_saving()
        gateway.resolve_job(job_id, body.resolution)
        return _find(job_id)

    # ------------------------------------------------------------ calls

    def _guard_saving() -> None:
        if gateway.persistence_error is not None:
            raise PersistenceError(f"the journal cannot save: {gateway.persistence_error}")

    @app.post("/v1/calls", status_code=201, dependencies=auth)
    def register_call(body: CallIn) -> dict[str, Any]:
        """Register a side-effecting call; answered once its pending marker is durable."""
        if gateway.closing:
            raise UsageError("the gateway is shutting down", name="shutdown")
        try:
            return gateway.calls.register(body.kind, body.owner, resumable=body.resumable).to_json()
        except sqlite3.Error as err:
            raise PersistenceError(f"the call was not registered: {err}") from err

    @app.get("/v1/calls", dependencies=auth)
    def list_calls(
        state: Annotated[str | None, Query(max_length=40)] = None,
    ) -> list[dict[str, Any]]:
        """Registered calls, newest first."""
        return [c.to_json() for c in gateway.calls.list(state=state)]

    @app.get("/v1/calls/{call_id}", dependencies=auth)
    def get_call(call_id: Id) -> dict[str, Any]:
        """One registered call."""
        return gateway.calls.get(call_id).to_json()

    @app.post("/v1/calls/{call_id}/outcome", dependencies=auth)
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

    @app.delete("/v1/calls/{call_id}", dependencies=auth)
    def cancel_call(call_id: Id) -> dict[str, Any]:
        """Cancel a pending call; a result arriving later cannot retire its marker."""
        return gateway.calls.cancel(call_id).to_json()

    @app.post("/v1/calls/{call_id}/resolve", dependencies=auth)
    def resolve_call(call_id: Id, body: ResolveIn) -> dict[str, Any]:
        """Settle an uncertain call: succeeded, failed, or pending again (rerun)."""
        return gateway.calls.resolve(call_id, body.resolution).to_json()

    @app.get("/v1/history", dependencies=auth)
    def history() -> list[dict[str, Any]]:
        """Recovery events, newest first: timestamps, reason codes and numbers only."""
        return [
            {"at": e.at, "code": e.code.value, "numbers": dict(e.numbers)}
            for e in gateway.journal.history()
        ]

    # ----------------------------------------------------------- leases

    @app.post("/v1/leases", status_code=201, dependencies=auth, response_model=None)
    async def grant_lease(body: LeaseIn) -> Response:
        """Grant a lease (201; 200 for a retried id) or refuse it (409 with the guard's reason)."""
        lease, decision, created = await gateway.grant_lease(
            body.id,
            owner=body.owner,
            memory_bytes=body.memory_bytes,
            disk_bytes=body.disk_bytes,
            ttl_s=body.ttl_s,
            wait_s=body.wait_s,
            release=body.release.hook() if body.release else None,
        )
        if lease is None:
            assert decision is not None
            return JSONResponse({"reason": decision.reason.value, "summary": decision.summary}, 409)
        return JSONResponse(lease_json(lease), 201 if created else 200)

    @app.delete("/v1/leases/{lease_id}", dependencies=auth)
    async def release_lease(lease_id: Id) -> dict[str, Any]:
        """Release a lease: its hook runs, then its memory is given back."""
        return lease_json(await gateway.end_lease(lease_id))

    @app.post("/v1/leases/{lease_id}/heartbeat", dependencies=auth)
    async def heartbeat(lease_id: Id, body: HeartbeatIn | None = None) -> dict[str, Any]:
        """Extend a lease's ttl from now."""
        return lease_json(await gateway.heartbeat(lease_id, body.ttl_s if body else None))

    @app.get("/v1/leases", dependencies=auth)
    def list_leases() -> list[dict[str, Any]]:
        """Leases of this run."""
        return [lease_json(v) for v in gateway.leases.views()]

    # ----------------------------------------------------------- status

    @app.get("/v1/status", dependencies=auth)
    def status() -> dict[str, Any]:
        """The guard's reading and last decision, queue and running counts per owner, holds."""
        decision = gateway.check()
        memory, disk = decision.memory, decision.disk
        stats = gateway.scheduler.statistics()
        guard_stats = gateway.guard.statistics()
        last = guard_stats.last_decision
        return {
            "boot_id": gateway.boot_id,
            "uptime_s": gateway.uptime(),
            "guard": {
                "admit": decision.admit,
                "reason": decision.reason.value,
                "summary": decision.summary,
                "young": guard_stats.young,
                "reserved_bytes": guard_stats.reserved_bytes,
                "last_decision": None
                if last is None
                else {"admit": last.admit, "reason": last.reason.value, "summary": last.summary},
            },
            "memory": {
                "used_bytes": memory.used_bytes if memory else None,
                "limit_bytes": memory.limit_bytes if memory else None,
                "source": memory.source.value if memory else None,
            },
            "disk": {
                "free_bytes": disk.free_bytes if disk else None,
                "total_bytes": disk.total_bytes if disk else None,
            },
            "queue": {
                "waiting": stats.waiting,
                "running": stats.running,
                "by_owner": {
                    o: {"waiting": w, "running": r} for o, (w, r) in stats.by_owner.items()
                },
                "refusals": stats.refusals,
            },
            "leases": gateway.leases.counts(),
            "holds": [
                word
                for word, on in (
                    ("shutting down", gateway.closing),
                    ("recovery mode", gateway.recovery_mode),
                    ("relief", time.monotonic() < gateway.relief_until),
                )
                if on
            ],
        }

    @app.get("/v1/needs-you", dependencies=auth)
    def needs_you() -> dict[str, str]:
        """A headline from a closed vocabulary, and the guard's summary."""
        return gateway.needs_you()

    @app.post("/v1/shutdown", dependencies=auth)
    async def shutdown() -> dict[str, str]:
        """Stop the service (not a restart): the same path as SIGTERM, through both layers."""
        gateway.closing = True  # stop admitting now, before connections drain
        gateway.tell_supervisor("stop")  # an explicit stop is never taken for a crash
        if gateway.server is not None:
            gateway.server.should_exit = True
        else:
            asyncio.get_running_loop().create_task(gateway.shutdown())
        return {"state": "stopping"}

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    @app.post("/v1/restart", dependencies=auth)
    async def restart() -> JSONResponse:
        """A fast restart by the supervisor (409 when the gateway runs alone)."""
        if not gateway.tell_supervisor("restart"):
            return JSONResponse(
                {"detail": "no supervisor: restarts need `roomkeeper serve`"},
                409,
            )
        gateway.closing = True
        if gateway.server is not None:
            gateway.server.should_exit = True
        return JSONResponse({"state": "restarting"})

    @app.post("/v1/repair", dependencies=auth)
    async def repair() -> dict[str, Any]:
        """Check responsiveness and headroom, then release held work gradually."""
        return await gateway.repair()

    return app


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(1024 * 1024)
    except FileNotFoundError:
        return b""

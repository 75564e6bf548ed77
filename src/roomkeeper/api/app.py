"""The HTTP API over :class:`roomkeeper.gateway.service.Gateway` (FastAPI, versioned under /v1).

Every call needs ``Authorization: Bearer <token>`` except ``GET /health``,
``GET /metrics``, the Health page (``GET /``) and its feed (``GET /v1/feed``),
which carry no command line, path, environment or output.  Sizes are bytes,
durations seconds.  Bad input gets a 4xx saying what was wrong; a crafted or
oversized body never produces a 500.

This module builds the application: the token check, the answers for errors, the
body limit, the open routes and the service's own (status, shutdown, restart,
repair).  The work routes are in :mod:`roomkeeper.api.jobs`, the lease routes in
:mod:`roomkeeper.api.leases`, and the JSON they answer with in
:mod:`roomkeeper.api.views`.
"""

from __future__ import annotations

import contextlib
import hmac
import sqlite3
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from importlib import resources as package_files
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from roomkeeper import __version__
from roomkeeper.api.agent_hooks import agent_hook_routes
from roomkeeper.api.bodylimit import BodyLimit
from roomkeeper.api.contract import allowed_methods, install_links, no_unknown_query
from roomkeeper.api.health_first import HealthFirst
from roomkeeper.api.hosts import LoopbackOnly
from roomkeeper.api.jobs import work_routes
from roomkeeper.api.leases import lease_routes
from roomkeeper.api.metrics import render_metrics
from roomkeeper.api.models import ERRORS
from roomkeeper.api.responses import (
    SENT_AS_BUILT,
    FeedOut,
    HealthOut,
    NeedsYouOut,
    RepairOut,
    RestartOut,
    ShutdownOut,
    StatusOut,
)
from roomkeeper.api.views import feed_json, status_json
from roomkeeper.api.words import embed_words
from roomkeeper.api.worktrees import worktree_routes
from roomkeeper.errors import (
    AlreadyEndedError,
    CallStateError,
    NotEndedError,
    PersistenceError,
    QueueFullError,
    SaveTimeoutError,
    StateConflictError,
    UnknownJobError,
    UnrunnableError,
    UsageError,
)
from roomkeeper.gateway.service import Gateway

MAX_BODY_BYTES = 1024 * 1024
BEARER = HTTPBearer(auto_error=False)
# Module-level so FastAPI can resolve it (this module postpones annotations).
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


def _page() -> str:
    """The Health page, with the words it shows for each reason filled in from their owners."""
    try:
        page = (package_files.files("roomkeeper.api") / "web" / "health.html").read_text()
    except (FileNotFoundError, OSError):
        return "<!doctype html><title>roomkeeper</title><p>The Health page is not installed."
    return embed_words(page)


def create_app(gateway: Gateway, *, port: int | None = None, socket: str | None = None) -> FastAPI:
    """The FastAPI application for one gateway (``port``/``socket`` are written for the CLI)."""
    # No /docs nor /redoc: FastAPI's pages load swagger-ui from a public CDN into our own
    # origin, and fail with no network.  /openapi.json stays for generated clients.
    app = FastAPI(
        responses=ERRORS,  # every route declares the error answers, one shape for all
        dependencies=[Depends(no_unknown_query)],
        title="roomkeeper",
        version=__version__,
        lifespan=_lifespan(gateway, port, socket),
        docs_url=None,
        redoc_url=None,
    )
    auth = [Depends(_token_check(gateway))]
    _add_error_answers(app, gateway)
    _add_open_routes(app, gateway)
    app.include_router(work_routes(gateway, auth))
    app.include_router(lease_routes(gateway, auth))
    app.include_router(agent_hook_routes(gateway, auth))
    app.include_router(worktree_routes(gateway, auth))
    _add_service_routes(app, gateway, auth)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(HealthFirst, health=lambda: health_body(gateway))
    app.add_middleware(LoopbackOnly)  # outermost: a rebound page is refused before anything
    install_links(app)
    return app


def _lifespan(
    gateway: Gateway, port: int | None, socket: str | None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Start the gateway with the server; run its stop steps when the server has drained."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start(port=port, socket=socket)
        try:
            yield
        finally:
            await gateway.shutdown_path.run()

    return lifespan


def _token_check(gateway: Gateway) -> Callable[[Credentials], Coroutine[Any, Any, None]]:
    """The dependency every authorized route has: the gateway's bearer token, or 401."""

    async def authorized(credentials: Credentials) -> None:  # on the loop: no thread hop
        given = credentials.credentials if credentials else ""
        if not hmac.compare_digest(given.encode(), gateway.token.encode()):
            raise HTTPException(
                401,
                "a valid token is required: Authorization: Bearer <ROOMKEEPER_HOME/token>",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authorized


def validation_details(err: RequestValidationError) -> list[dict[str, Any]] | str:
    """What was wrong with a request, as plain JSON that cannot fail to encode.

    FastAPI's own answer echoes the offending input back, and an input of
    ``NaN`` or ``Infinity`` cannot be written as JSON (a 500 instead of the 422):
    only where, what and which kind go back, as strings and ints.
    """
    try:
        return [
            {
                "loc": [p if isinstance(p, int) else str(p) for p in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in err.errors()
        ]
    except Exception:  # never a 500 for a bad request
        return "the request is not valid"


RETRY_AFTER_S = 1
"""The ``Retry-After`` of a 429: queues and lease caps free as work ends, seconds apart."""


def error(status: int, reason: str, detail: str, **extra: Any) -> JSONResponse:
    """The one error shape: ``reason`` (from :data:`ERROR_REASONS`) beside the human ``detail``."""
    return JSONResponse({"reason": reason, "detail": detail, **extra}, status)


_STATUS_REASONS = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}


def _add_request_errors(app: FastAPI) -> None:
    """Starlette's own errors (401, 404, 405) and invalid requests (422), in our one shape."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        answer = error(
            err.status_code,
            _STATUS_REASONS.get(err.status_code, "invalid_request"),
            str(err.detail),
        )
        for name, value in (err.headers or {}).items():
            answer.headers[name] = value
        allowed = allowed_methods(request.app, request.url.path) if err.status_code == 405 else []
        if allowed:  # every method served at this path, not one route's
            answer.headers["Allow"] = ", ".join(allowed)
        return answer

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        items = validation_details(err)
        if isinstance(items, str):
            return error(422, "invalid_request", items)
        said = "; ".join(f"{'.'.join(map(str, i['loc']))}: {i['msg']}" for i in items[:5])
        return error(422, "invalid_request", said or "the request is not valid", errors=items)


def _add_conflict_answers(app: FastAPI) -> None:
    """409s: the state of the lease, job or call asked about does not allow this."""

    @app.exception_handler(AlreadyEndedError)
    async def already_ended(request: Request, err: AlreadyEndedError) -> JSONResponse:
        return error(409, "already_ended", str(err))

    @app.exception_handler(NotEndedError)
    async def not_ended(request: Request, err: NotEndedError) -> JSONResponse:
        return error(409, err.reason, str(err))

    @app.exception_handler(StateConflictError)
    async def state_conflict(request: Request, err: StateConflictError) -> JSONResponse:
        return error(409, err.reason, str(err))

    @app.exception_handler(CallStateError)
    async def call_state(request: Request, err: CallStateError) -> JSONResponse:
        return error(409, "call_state", str(err))


def _add_error_answers(app: FastAPI, gateway: Gateway) -> None:
    """A 4xx, 503 or 507 saying what was wrong for each of our errors, never a 500."""

    _add_request_errors(app)
    _add_conflict_answers(app)

    @app.exception_handler(UsageError)
    async def usage_error(request: Request, err: UsageError) -> JSONResponse:
        if err.name == "shutdown":
            return error(503, "shutting_down", str(err))
        if isinstance(err, UnrunnableError):  # valid by the schema, not runnable here
            return error(422, err.reason, str(err))
        return error(422, "invalid_request", str(err))

    @app.exception_handler(UnknownJobError)
    async def unknown(request: Request, err: UnknownJobError) -> JSONResponse:
        return error(404, "not_found", str(err))

    @app.exception_handler(PersistenceError)
    async def not_saved(request: Request, err: PersistenceError) -> JSONResponse:
        if isinstance(err, SaveTimeoutError):  # a hung disk: reported until a write lands
            gateway.persistence.note(err)
            return error(503, "not_saved_in_time", str(err))
        return error(507, "not_saved", str(err))

    @app.exception_handler(sqlite3.Error)
    async def journal_error(request: Request, err: sqlite3.Error) -> JSONResponse:
        # A journal that cannot save is reported as such, never as a success or a 500.
        gateway.persistence.note(err)
        return error(507, "not_saved", f"not saved: the journal could not write ({err})")

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, err: QueueFullError) -> JSONResponse:
        # Nothing was queued or granted: a client may ask again, and is told when.
        answer = error(429, err.reason, str(err))
        answer.headers["Retry-After"] = str(RETRY_AFTER_S)
        return answer


def health_body(gateway: Gateway) -> dict[str, Any]:
    """``GET /health``'s answer, from the event loop, without touching disk."""
    return {"boot_id": gateway.boot_id, "uptime_s": gateway.uptime()}


def _add_open_routes(app: FastAPI, gateway: Gateway) -> None:
    """The routes without a token: they carry no command line, path, environment or output."""
    page = _page()

    @app.get("/health", response_model=HealthOut, **SENT_AS_BUILT)
    async def health() -> dict[str, Any]:
        """Liveness for a probe; a plain GET is answered by HealthFirst, ahead of the router."""
        return health_body(gateway)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def health_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus text exposition."""
        body, content_type = render_metrics(gateway)
        return Response(body, media_type=content_type)

    @app.get("/v1/feed", response_model=FeedOut, **SENT_AS_BUILT)
    def feed() -> dict[str, Any]:
        """What the Health page shows: ids, owners, states, reasons and numbers only."""
        return feed_json(gateway)


def _add_service_routes(app: FastAPI, gateway: Gateway, auth: Sequence[params.Depends]) -> None:
    """The service's own routes, behind ``auth``: status, needs-you, shutdown, restart, repair."""

    @app.get("/v1/status", dependencies=auth, response_model=StatusOut, **SENT_AS_BUILT)
    def status() -> dict[str, Any]:
        """The guard's reading and last decision, queue and running counts per owner, holds."""
        return status_json(gateway)

    @app.get("/v1/needs-you", dependencies=auth, response_model=NeedsYouOut, **SENT_AS_BUILT)
    def needs_you() -> dict[str, str]:
        """A headline from a closed vocabulary, and the guard's summary."""
        return gateway.headlines.needs_you()

    @app.post("/v1/shutdown", dependencies=auth, response_model=ShutdownOut, **SENT_AS_BUILT)
    async def shutdown() -> dict[str, str]:
        """Stop the service (not a restart): the same path as SIGTERM, through both layers."""
        gateway.shutdown_path.request_stop()
        return {"state": "stopping"}

    @app.post("/v1/restart", dependencies=auth, response_model=RestartOut, **SENT_AS_BUILT)
    async def restart() -> dict[str, str] | JSONResponse:
        """A fast restart by the supervisor (409 when the gateway runs alone)."""
        if not gateway.shutdown_path.request_restart():
            return error(409, "no_supervisor", "no supervisor: restarts need `roomkeeper serve`")
        return {"state": "restarting"}

    @app.post("/v1/repair", dependencies=auth, response_model=RepairOut, **SENT_AS_BUILT)
    async def repair() -> dict[str, Any]:
        """Check responsiveness and headroom, then release held work gradually."""
        return await gateway.link.repair()

"""The lease routes of the HTTP API: grant, release, heartbeat and list memory leases.

:func:`lease_routes` builds them for one gateway; :func:`roomkeeper.api.app.create_app`
includes them with its token check on every one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request, params
from fastapi.responses import JSONResponse, Response

from roomkeeper.api.health_first import pause_of
from roomkeeper.api.models import HeartbeatIn, Id, LeaseIn
from roomkeeper.api.paging import (
    DEFAULT_LIMIT,
    PAGED_RESPONSES,
    Cursor,
    Limit,
    decode_cursor,
    newest_first_page,
    say_next,
)
from roomkeeper.api.responses import SENT_AS_BUILT, LeaseOut
from roomkeeper.api.views import lease_json
from roomkeeper.gateway.service import Gateway


def lease_routes(gateway: Gateway, auth: Sequence[params.Depends]) -> APIRouter:
    """``/v1/leases`` for ``gateway``, each route behind ``auth``."""
    router = APIRouter()

    @router.post(
        "/v1/leases",
        status_code=201,
        dependencies=auth,
        response_model=LeaseOut,
        responses={200: {"model": LeaseOut, "description": "The lease already granted (a retry)"}},
        **SENT_AS_BUILT,
    )
    async def grant_lease(
        body: LeaseIn, answer: Response, request: Request
    ) -> dict[str, Any] | JSONResponse:
        """Grant a lease (201; 200 for a retried id) or refuse it (409 with the guard's reason).

        With ``wait_s`` it waits for room, giving its place in the API's line back between
        its tries."""
        lease, decision, created = await gateway.durable_leases.grant(
            body.id, body.terms(), wait_s=body.wait_s, pause=pause_of(request.scope)
        )
        if lease is None:
            assert decision is not None
            refusal = {"reason": decision.reason.value, "summary": decision.summary}
            return JSONResponse({**refusal, "detail": f"refused: {decision.summary}"}, 409)
        answer.status_code = 201 if created else 200
        return lease_json(lease)

    @router.delete(
        "/v1/leases/{lease_id}", dependencies=auth, response_model=LeaseOut, **SENT_AS_BUILT
    )
    async def release_lease(lease_id: Id) -> dict[str, Any]:
        """Release a lease: its hook runs, then its memory is given back."""
        return lease_json(await gateway.durable_leases.end(lease_id))

    @router.post(
        "/v1/leases/{lease_id}/heartbeat",
        dependencies=auth,
        response_model=LeaseOut,
        **SENT_AS_BUILT,
    )
    async def heartbeat(lease_id: Id, body: HeartbeatIn | None = None) -> dict[str, Any]:
        """Extend a lease's ttl from now."""
        return lease_json(
            await gateway.durable_leases.heartbeat(lease_id, body.ttl_s if body else None)
        )

    @router.get(
        "/v1/leases",
        dependencies=auth,
        response_model=list[LeaseOut],
        responses=PAGED_RESPONSES,
        **SENT_AS_BUILT,
    )
    def list_leases(
        response: Response, limit: Limit = DEFAULT_LIMIT, cursor: Cursor = None
    ) -> list[dict[str, Any]]:
        """Leases of this run, newest first, ``limit`` a page; when more follow,
        ``X-Next-Cursor`` and ``Link`` name the next page."""
        leases = [lease_json(v) for v in gateway.leases.views()]
        page, next_key = newest_first_page(leases, "granted_at", limit, decode_cursor(cursor))
        say_next(response, "/v1/leases", {"limit": limit}, next_key)
        return page

    return router

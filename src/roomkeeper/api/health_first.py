"""Health first: the API's work waits its turn, ``/health`` never does.

Under a flood of API requests the event loop would otherwise hold hundreds of
them at once, each a slice of Python work on the one loop, and a health
probe's answer would wait behind all of them.  This ASGI middleware lets at
most :data:`API_AT_ONCE` API requests be worked on at once; the rest wait in
line costing nothing.  ``/health``, the Health page itself, and lease releases
and heartbeats pass straight through (the page's feed and ``/metrics`` do a
guard reading each, so they take their turn like any API request).  A request's turn
ends when its answer starts, so a long output stream holds no place in line
while it streams; a lease grant that waits for room (``wait_s``) does hold
its place while it waits, bounded by that wait, and the releases that make
that room never wait behind it.

A plain ``GET /health`` (no query) is answered by the middleware itself: the
router, the dependencies and the response model would each add turns of the
loop, and under a flood every turn of the loop is long.  Anything else sent
to ``/health`` goes the ordinary way (a query string gets the router's 422,
as on any route).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse

API_AT_ONCE = 4  # API requests worked on at once; more wait in line (16: p99 of /health +15 ms)
FIRST = frozenset({"/health", "/"})  # never wait
# Releases and heartbeats of leases never wait either: a release frees the room that lease
# grants waiting with ``wait_s`` (holding their turns) wait for.
FIRST_PREFIXES = ("/v1/leases/",)


class HealthFirst:
    """Bound how many API requests are worked on at once; ``/health`` goes first."""

    def __init__(
        self,
        app: Any,
        *,
        at_once: int = API_AT_ONCE,
        health: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.app = app
        self.at_once = at_once
        self.health = health  # the body of a plain GET /health, answered here when given
        self._turns: asyncio.Semaphore | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if self.health is not None and _plain_health_get(scope):
            await JSONResponse(self.health())(scope, receive, send)
            return
        if scope["type"] != "http" or path in FIRST or path.startswith(FIRST_PREFIXES):
            await self.app(scope, receive, send)
            return
        if self._turns is None:  # made on the serving loop, at its first request
            self._turns = asyncio.Semaphore(self.at_once)
        turns = self._turns
        await turns.acquire()
        held = True

        async def answering(message: Any) -> None:
            nonlocal held
            if held and message["type"] == "http.response.start":
                held = False
                turns.release()  # the answer is on its way: the next request's turn
            await send(message)

        try:
            await self.app(scope, receive, answering)
        finally:
            if held:
                turns.release()


def _plain_health_get(scope: Any) -> bool:
    return bool(
        scope["type"] == "http"
        and scope.get("path") == "/health"
        and scope.get("method") == "GET"
        and not scope.get("query_string")
    )

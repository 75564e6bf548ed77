"""Health first: the API's work waits its turn, ``/health`` never does.

Under a flood of API requests the event loop would otherwise hold hundreds of
them at once, each a slice of Python work on the one loop, and a health
probe's answer would wait behind all of them.  This ASGI middleware lets at
most :data:`API_AT_ONCE` API requests be worked on at once; the rest wait in
line costing nothing.  ``/health``, the Health page itself, lease releases and
heartbeats, job cancels (what frees room never waits behind other work) and
the service's way out (shutdown, restart) pass straight through (the page's
feed and ``/metrics`` do a guard reading each, so they take their turn like
any API request).

A request holds its :class:`Turn` while it is worked on, not while it waits:
its turn ends when its answer starts, so a long output stream holds no place
in line while it streams, and a lease grant that waits for room (``wait_s``)
gives its turn back between its tries (:meth:`Turn.pause`) and takes one
again for each try and for its answer.  Waiting for a save holds a turn for at
most the save deadline.

A plain ``GET /health`` (no query) is answered by the middleware itself: the
router, the dependencies and the response model would each add turns of the
loop, and under a flood every turn of the loop is long.  Anything else sent
to ``/health`` goes the ordinary way (a query string gets the router's 422,
as on any route).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import JSONResponse

from roomkeeper.gateway.leases import Pause, sleep_or_woken

API_AT_ONCE = 4  # API requests worked on at once; more wait in line (16: p99 of /health +15 ms)
FIRST = frozenset({"/health", "/", "/v1/shutdown", "/v1/restart"})  # never wait
# Releases and heartbeats of leases never wait either: a release frees the room that lease
# grants waiting with ``wait_s`` wait for.
FIRST_PREFIXES = ("/v1/leases/",)
TURN = "roomkeeper.turn"  # the request's Turn, in the scope's ``extensions``


class Turn:
    """One API request's place among the :data:`API_AT_ONCE` worked on at once.

    Args:
        turns: the line's places.
    """

    def __init__(self, turns: asyncio.Semaphore) -> None:
        self._turns = turns
        self.held = False

    async def take(self) -> None:
        """Wait in line for a place, unless this request holds one."""
        if not self.held:
            await self._turns.acquire()
            self.held = True

    def give_back(self) -> None:
        """Give the place back (the answer has started, or the request waits)."""
        if self.held:
            self.held = False
            self._turns.release()

    async def pause(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Wait ``seconds`` (less once ``wake`` is set) without a place in line, then take
        one again."""
        self.give_back()
        await sleep_or_woken(seconds, wake)
        await self.take()


def pause_of(scope: Mapping[str, Any]) -> Pause:
    """How the request of ``scope`` waits without holding a place in line (a plain sleep where
    it has none)."""
    turn = (scope.get("extensions") or {}).get(TURN)
    return turn.pause if isinstance(turn, Turn) else sleep_or_woken


def goes_first(path: str) -> bool:
    """Whether a request for ``path`` never waits in line."""
    if path in FIRST or path.startswith(FIRST_PREFIXES):
        return True
    # A job's cancel frees room (and stops a tree a person wants stopped): never behind work.
    return path.startswith("/v1/jobs/") and path.endswith("/cancel") and path.count("/") == 4


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
        if self.health is not None and _plain_health_get(scope):
            await JSONResponse(self.health())(scope, receive, send)
            return
        if scope["type"] != "http" or goes_first(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        if self._turns is None:  # made on the serving loop, at its first request
            self._turns = asyncio.Semaphore(self.at_once)
        turn = Turn(self._turns)
        await turn.take()
        scope = {**scope, "extensions": {**(scope.get("extensions") or {}), TURN: turn}}

        async def answering(message: Any) -> None:
            if message["type"] == "http.response.start":
                turn.give_back()  # the answer is on its way: the next request's turn
            await send(message)

        try:
            await self.app(scope, receive, answering)
        finally:
            turn.give_back()


def _plain_health_get(scope: Any) -> bool:
    return bool(
        scope["type"] == "http"
        and scope.get("path") == "/health"
        and scope.get("method") == "GET"
        and not scope.get("query_string")
    )

"""Health first: API requests take turns, /health never waits for one."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from roomkeeper.api.health_first import HealthFirst, goes_first, pause_of
from roomkeeper.api.serve import YOUNG_OBJECTS_PER_COLLECTION
from tests.gateways import free_port, gateway_env, stop_process, wait_answering


def app_with_gate(gate: asyncio.Event, started: list[str]) -> Any:
    """An ASGI app whose /slow waits on ``gate`` before it answers and /stream answers at
    once and then streams until ``gate`` is set."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        path = scope["path"]
        started.append(path)
        if path == "/slow":
            await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if path == "/stream":
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
            await gate.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def _scenario() -> tuple[list[str], list[str]]:
    gate, started = asyncio.Event(), []
    fair = HealthFirst(app_with_gate(gate, started), at_once=1)
    transport = httpx.ASGITransport(app=fair)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        slow = asyncio.create_task(client.get("/slow"))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(client.get("/v1/status"))
        await asyncio.sleep(0.05)
        health = await asyncio.wait_for(client.get("/health"), timeout=1)
        assert health.status_code == 200
        before = list(started)  # /v1/status still waits for /slow's turn
        gate.set()
        await asyncio.wait_for(asyncio.gather(slow, waiting), timeout=2)
        return before, list(started)


def test_health_passes_while_the_api_waits_its_turn() -> None:
    before, after = asyncio.run(_scenario())
    assert before == ["/slow", "/health"]
    assert after == ["/slow", "/health", "/v1/status"]


async def _stream_then_request() -> list[str]:
    gate, started = asyncio.Event(), []
    fair = HealthFirst(app_with_gate(gate, started), at_once=1)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    def scope(path: str) -> dict[str, Any]:
        return {"type": "http", "path": path, "method": "GET", "headers": []}

    streaming = asyncio.create_task(fair(scope("/stream"), receive, send))
    await asyncio.sleep(0.05)
    assert sent and sent[0]["type"] == "http.response.start"  # its answer has begun
    # ... so its turn is over while it streams: the next request goes in at once.
    await asyncio.wait_for(fair(scope("/v1/jobs"), receive, send), timeout=1)
    gate.set()
    await asyncio.wait_for(streaming, timeout=1)
    return started


def test_a_streaming_answer_gives_its_turn_back_when_it_starts() -> None:
    assert asyncio.run(_stream_then_request()) == ["/stream", "/v1/jobs"]


async def _wait_beside_a_request() -> tuple[list[str], float]:
    """One request waits (as a lease grant waits for room) in a line of one place; another
    comes; the waiting one ends only once the other has been answered."""
    answered, done = asyncio.Event(), []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/wait":
            pause = pause_of(scope)
            while not answered.is_set():
                await pause(0.05)  # its place in line is given back while it waits
        done.append(scope["path"])
        if scope["path"] == "/v1/status":
            answered.set()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    fair = HealthFirst(app, at_once=1)
    transport = httpx.ASGITransport(app=fair)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        waiting = asyncio.create_task(client.get("/wait"))
        await asyncio.sleep(0.1)
        start = asyncio.get_running_loop().time()
        await asyncio.wait_for(client.get("/v1/status"), timeout=2)
        took = asyncio.get_running_loop().time() - start
        await asyncio.wait_for(waiting, timeout=2)
    return done, took


def test_a_request_that_waits_gives_its_place_in_line_back() -> None:
    """With one place in line, a request pausing in a loop does not hold it: the next
    request is answered at once, and the waiting one takes a place again to answer."""
    done, took = asyncio.run(_wait_beside_a_request())
    assert done == ["/v1/status", "/wait"]
    assert took < 1.0


def test_cancels_and_the_way_out_never_wait_in_line() -> None:
    """A job's cancel, a lease's release, shutdown and restart pass the line; work does not."""
    first = ["/v1/jobs/abc/cancel", "/v1/leases/x", "/v1/shutdown", "/v1/restart", "/health"]
    assert all(goes_first(path) for path in first)
    work = ["/v1/jobs", "/v1/jobs/abc", "/v1/status", "/v1/calls/abc/cancel", "/v1/leases"]
    assert not any(goes_first(path) for path in work)


async def _health_asks(fair: HealthFirst) -> dict[str, httpx.Response]:
    transport = httpx.ASGITransport(app=fair)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return {
            "plain": await client.get("/health"),
            "query": await client.get("/health", params={"x": "1"}),
            "head": await client.head("/health"),
        }


def test_a_plain_health_get_is_answered_ahead_of_the_router() -> None:
    """The middleware answers a plain GET /health itself; anything else reaches the app."""
    gate, started = asyncio.Event(), []
    gate.set()
    fair = HealthFirst(app_with_gate(gate, started), health=lambda: {"boot_id": "b", "up": 1.5})
    answers = asyncio.run(_health_asks(fair))
    assert answers["plain"].status_code == 200
    assert answers["plain"].json() == {"boot_id": "b", "up": 1.5}
    assert answers["plain"].headers["content-type"] == "application/json"
    # A query string or another method is the router's to judge (its 422, its 405).
    assert answers["query"].text == "ok"
    assert started == ["/health", "/health"]


# The real gateway, with one extra route that says how its garbage collector is set.
COLLECTOR_GATEWAY = """
import gc, sys
import roomkeeper.api.serve as gateway_main
from roomkeeper.api import app as api

def create_app(gateway, **kw):
    app = api.create_app(gateway, **kw)

    @app.get("/test-collector")
    async def collector() -> dict:
        return {"frozen": gc.get_freeze_count(), "threshold": list(gc.get_threshold())}

    return app

gateway_main.create_app = create_app
gateway_main.run_gateway(int(sys.argv[1]), None)
"""


def test_the_serving_gateway_keeps_its_start_up_heap_out_of_collections(tmp_path: Path) -> None:
    """Full collections walking the libraries' objects paused /health under a flood: the
    gateway freezes what it holds at start and collects young objects less often."""
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", COLLECTOR_GATEWAY, str(port)],
            env=gateway_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_answering(url, proc, log)
        found = httpx.get(f"{url}/test-collector", timeout=30).json()
    finally:
        stop_process(proc)
    assert found["frozen"] > 10_000  # FastAPI, pydantic and our own modules, at least
    assert found["threshold"][0] == YOUNG_OBJECTS_PER_COLLECTION

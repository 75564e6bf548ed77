"""Health first: API requests take turns, /health never waits for one."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from roomkeeper.api.fairway import HealthFirst


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

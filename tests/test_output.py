"""A job's output is streamed, never loaded whole; ``tail`` and bounded ``follow`` streams."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from roomkeeper.api.output import MAX_FOLLOWERS
from tests.gateways import RunningGateway, wait_until

pytestmark = pytest.mark.kernel

LOG_BYTES = 150_000_000


def finished(gw: RunningGateway, argv: list[str]) -> str:
    job = gw.client.post("/v1/jobs", json={"argv": argv}).json()["id"]
    wait_until(
        lambda: gw.client.get(f"/v1/jobs/{job}").json()["state"] == "exited", "the job ending", 60
    )
    return str(job)


def test_a_150_mb_log_is_streamed_without_growing_the_gateway(gw: RunningGateway) -> None:
    """Four clients read a 150 MB log whole at once: the gateway's RSS grows by < 20 MB."""
    job = finished(gw, ["sh", "-c", f"head -c {LOG_BYTES} /dev/zero | tr '\\0' x"])
    gateway = psutil.Process(gw.proc.pid)
    before = gateway.memory_info().rss
    peak = before
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, gateway.memory_info().rss)
            time.sleep(0.01)

    def read_all(_: int) -> int:
        with gw.client.stream("GET", f"/v1/jobs/{job}/output", timeout=120) as answer:
            return sum(len(chunk) for chunk in answer.iter_bytes())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            sizes = list(pool.map(read_all, range(4)))
    finally:
        stop.set()
        sampler.join()
    assert sizes == [LOG_BYTES] * 4
    assert peak - before < 20_000_000, f"grew by {(peak - before) / 1e6:.1f} MB"


def test_tail_gives_the_last_bytes(gw: RunningGateway) -> None:
    """``?tail=N`` answers the last N bytes; more than the file gives it all."""
    job = finished(gw, ["sh", "-c", "printf 'one\\ntwo\\nthree\\n'"])
    assert gw.client.get(f"/v1/jobs/{job}/output", params={"tail": 6}).text == "three\n"
    assert gw.client.get(f"/v1/jobs/{job}/output", params={"tail": 999}).text == "one\ntwo\nthree\n"
    assert gw.client.get(f"/v1/jobs/{job}/output", params={"tail": -1}).status_code == 422


def test_follow_streams_are_bounded_with_a_clear_429(gw: RunningGateway) -> None:
    """Past the bound a follow is refused with the reason; when one ends a place frees up."""
    job = gw.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
    url = f"{gw.url}/v1/jobs/{job}/output"
    headers = gw.client.headers
    with contextlib.ExitStack() as streams:
        clients = [streams.enter_context(httpx.Client(timeout=30)) for _ in range(MAX_FOLLOWERS)]
        for client in clients:
            answer = streams.enter_context(
                client.stream("GET", url, params={"follow": "true"}, headers=headers)
            )
            assert answer.status_code == 200
        refused = gw.client.get(url, params={"follow": "true"})
        assert refused.status_code == 429
        assert refused.json()["reason"] == "followers_full"
        assert gw.client.get(url).status_code == 200  # a plain read is not a follower

    def place_free() -> bool:
        with gw.client.stream("GET", url, params={"follow": "true", "tail": 0}) as answer:
            return answer.status_code == 200

    wait_until(place_free, "a follower's place coming free once the streams closed")


class _Journal:
    def job(self, job_id: str) -> None:
        return None


class _Gateway:
    """What the output route reads of a gateway: its journal, home and whether it closes."""

    def __init__(self, home: Path) -> None:
        self.journal, self.home, self.closing = _Journal(), home, False


def test_a_follower_gone_before_its_answer_never_keeps_a_place(tmp_path: Path) -> None:
    """Twice the bound of follows whose clients are gone when the answer starts (the server
    cannot send it): none keeps a place, and a follow is still answered 200, not 429."""
    from fastapi import APIRouter, FastAPI
    from starlette.requests import ClientDisconnect

    from roomkeeper.api.output import output_routes

    router = APIRouter()
    running = lambda gw, job: {"state": "running"}  # noqa: E731 - the route's find_job
    output_routes(router, _Gateway(tmp_path), [], running)  # type: ignore[arg-type]
    app = FastAPI()
    app.include_router(router)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/jobs/j1/output",
        "raw_path": b"/v1/jobs/j1/output",
        "query_string": b"follow=true",
        "root_path": "",
        "headers": [],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }

    kept: list[BaseException] = []

    async def status_of_a_follow(gone: bool, spec: str) -> int:
        sent: list[dict[str, object]] = []

        async def receive() -> dict[str, object]:
            if not gone:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}  # the client is gone already

        async def send(message: dict[str, object]) -> None:
            sent.append(message)
            if gone or message["type"] == "http.response.start":
                raise OSError("the client reset the connection")  # as a server says it

        asgi = {"version": "3.0", "spec_version": spec}
        try:
            await asyncio.wait_for(app({**scope, "asgi": asgi}, receive, send), 10)
        except (OSError, ClientDisconnect) as err:
            # Kept, as a server's error report keeps it: its traceback holds the route's
            # frames, so nothing the route left open is closed by the garbage collector.
            kept.append(err)
        return int(sent[0]["status"]) if sent else 0  # type: ignore[call-overload]

    async def story() -> int:
        for spec in ("2.3", "2.4"):  # a server that reports a disconnect, and one that raises
            for _ in range(MAX_FOLLOWERS):
                await status_of_a_follow(gone=True, spec=spec)
        return await status_of_a_follow(gone=False, spec="2.4")

    assert asyncio.run(story()) == 200

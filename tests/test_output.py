"""A job's output is streamed, never loaded whole; ``tail`` and bounded ``follow`` streams."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time

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

"""Half-open connections cannot take the gateway down or keep /health from answering."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from roomkeeper.api.connections import HEADER_TIMEOUT_S
from tests.gateways import RunningGateway

pytestmark = pytest.mark.kernel

HALF_OPEN = 500


@contextlib.contextmanager
def half_open(url: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections that each send half a request's headers, then nothing."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            sockets.append(s)
        yield sockets
    finally:
        for s in sockets:
            s.close()


def closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_half_open_connections_neither_stop_health_nor_stay_for_ever(gw: RunningGateway) -> None:
    """500 connections stopped mid-headers: /health answers meanwhile, and each is closed
    once its header deadline passes."""
    with half_open(gw.url, HALF_OPEN) as sockets:
        started = time.monotonic()
        answers = [gw.anonymous.get("/health", timeout=5) for _ in range(20)]
        assert [a.status_code for a in answers] == [200] * 20
        assert time.monotonic() - started < 5
        # Each is closed once its header deadline passes: soon after, on a busy machine.
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 30
        still_open = sockets
        while still_open and time.monotonic() < deadline:
            still_open = [s for s in still_open if not closed_by_peer(s)]
            time.sleep(0.1)
        assert still_open == [], f"{len(still_open)} of {HALF_OPEN} still held open"
        assert gw.anonymous.get("/health", timeout=5).status_code == 200
    assert gw.proc.poll() is None

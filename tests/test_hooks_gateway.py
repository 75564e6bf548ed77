"""A hung release hook holds only its own reservation: every other launch and request goes on."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.gateways import RunningGateway, wait_until

pytestmark = pytest.mark.kernel


class DripServer:
    """A loopback server that answers every request a byte at a time and never finishes.

    It records when each connection arrived and when the client cut it off (within a few
    milliseconds: it watches the socket while it waits between bytes).
    """

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(32)
        self.port = self.listener.getsockname()[1]
        self.opened: list[float] = []
        self.closed: list[float] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with self._lock:
            self.opened.append(time.time())
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"." * 1000:
                if self._stop.is_set():
                    break
                conn.sendall(bytes([byte]))
                # Wait for the next byte's turn, or for the client's cut-off: its FIN reads
                # as an empty recv at once, so ``closed`` is when the hook was cut off.
                readable, _, _ = select.select([conn], [], [], 0.25)
                if readable and not conn.recv(1):
                    break
        with self._lock:
            self.closed.append(time.time())

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer()
    yield server
    server.close()


def test_a_hung_job_hook_does_not_hold_up_the_next_launch(
    gw: RunningGateway, drip: DripServer
) -> None:
    """Job A's hook drips until its deadline; job B starts and ends while A's hook still hangs."""
    a = gw.client.post(
        "/v1/jobs", json={"argv": ["true"], "release": {"url": drip.url("/chat/a")}}
    ).json()["id"]
    wait_until(lambda: len(drip.opened) == 1, "job A's hook reaching its server")
    b = gw.client.post("/v1/jobs", json={"argv": ["true"]}).json()["id"]
    wait_until(lambda: gw.client.get(f"/v1/jobs/{b}").json()["state"] == "exited", "job B ending")
    b_ended = gw.client.get(f"/v1/jobs/{b}").json()["ended_at"]
    wait_until(lambda: len(drip.closed) == 1, "A's hook cut off at its deadline", timeout=10)
    # A's hook hangs for its whole 3 s deadline: B must have ended before it was cut off (on
    # a busy machine B's own start can take seconds, so no tighter bound is fair).
    assert b_ended < drip.closed[0], f"B ended {b_ended - drip.closed[0]:.1f} s after A's hook"
    assert drip.closed[0] - drip.opened[0] < 4.5  # one 3 s deadline for the whole call
    assert gw.client.get(f"/v1/jobs/{a}").json()["state"] == "exited"


# More hung hooks than asyncio's default executor has threads (six on two cores): were
# hooks run there, every request that reads the journal off the event loop would wait.
HUNG = max(6, min(32, (os.cpu_count() or 1) + 4) + 2)


def test_hung_lease_hooks_do_not_slow_other_requests(gw: RunningGateway, drip: DripServer) -> None:
    """Leases released at once, each hook hanging: job submissions answer meanwhile."""
    for n in range(HUNG):
        granted = gw.client.post(
            "/v1/leases",
            json={"id": f"l{n}", "memory_bytes": 0, "release": {"url": drip.url(f"/chat/{n}")}},
        )
        assert granted.status_code == 201, granted.text
    with concurrent.futures.ThreadPoolExecutor(HUNG) as pool:
        releases = [pool.submit(gw.client.delete, f"/v1/leases/l{n}") for n in range(HUNG)]
        wait_until(lambda: len(drip.opened) >= 6, "the hooks reaching their server")
        started = time.time()
        submitted = gw.client.post("/v1/jobs", json={"argv": ["true"]}, timeout=30)
        listed = gw.client.get("/v1/jobs", timeout=30)
        answered, hanging = time.time(), not drip.closed
        assert submitted.status_code == 201 and listed.status_code == 200
        # Each hook hangs for its whole 3 s deadline: the requests must have been answered
        # while every hook still hung, not after the first was cut off.
        assert hanging, f"the requests waited for the hooks ({answered - started:.1f} s)"
        outcomes = [r.result(timeout=30).json()["hook_outcome"] for r in releases]
    assert all(o.startswith("failed") for o in outcomes), outcomes

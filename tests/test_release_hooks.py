"""Release hooks: one deadline for the whole call, a capped answer, no proxy, their own pool."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from roomkeeper.loopback.hook_calls import HOOK_BODY_MAX, HookRunner, run_hook
from roomkeeper.loopback.hooks import ReleaseHook
from tests.gateways import wait_until

Serve = Callable[[socket.socket], None]


@contextlib.contextmanager
def loopback_server(serve: Serve) -> Iterator[tuple[int, list[bytes]]]:
    """A real TCP server on 127.0.0.1; ``serve`` handles each connection; requests recorded."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    requests: list[bytes] = []
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            requests.append(conn.recv(65536))
            serve(conn)

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], requests
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def drip(text: bytes, every_s: float, forever: bool = True) -> Serve:
    """Send ``text`` a byte at a time, then (``forever``) keep dripping spaces."""

    def serve(conn: socket.socket) -> None:
        for byte in text:
            conn.sendall(bytes([byte]))
            time.sleep(every_s)
        while forever:
            conn.sendall(b" ")
            time.sleep(every_s)

    return serve


def answer(status: int, body: bytes = b"") -> Serve:
    def serve(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    return serve


def endless_body(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    while True:
        conn.sendall(chunk)


def hook_to(port: int, path: str = "/chat/1") -> ReleaseHook:
    return ReleaseHook("DELETE", f"http://127.0.0.1:{port}{path}")


def test_a_server_that_drips_its_headers_is_cut_off_at_the_deadline() -> None:
    """A byte every 0.2 s never trips a per-read timeout; the one deadline still ends the call."""
    with loopback_server(drip(b"HTTP/1.1 200 OK\r\nX-Slow: ", 0.2)) as (port, _):
        started = time.monotonic()
        outcome = run_hook(hook_to(port), deadline_s=1.0)
        took = time.monotonic() - started
    assert outcome == "failed: no answer within 1 s"
    # Never early, and cut at the 1 s asked for: below the default 3 s deadline, with 1.5 s
    # left for a busy machine's scheduling delay.
    assert 0.9 <= took < 2.5


def test_a_server_that_drips_its_body_is_cut_off_at_the_deadline() -> None:
    """Headers at once, then a body that never ends at a byte a tick: cut at the deadline."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
    with loopback_server(lambda c: (c.sendall(head), drip(b"", 0.2)(c))) as (port, _):
        started = time.monotonic()
        outcome = run_hook(hook_to(port), deadline_s=1.0)
        took = time.monotonic() - started
    assert outcome.startswith("failed")
    assert took < 2.5  # the 1 s asked for, not the default 3 s, with a busy machine's delay


def test_only_a_capped_part_of_the_answer_is_read() -> None:
    """An endless fast body: the hook reads its cap and is done, well inside the deadline."""
    with loopback_server(endless_body) as (port, _):
        started = time.monotonic()
        outcome = run_hook(hook_to(port), deadline_s=5.0)
        took = time.monotonic() - started
    assert outcome == "ok 200"
    assert took < 4.5  # inside the 5 s deadline: the cap ended it, not the deadline
    assert HOOK_BODY_MAX <= 1024 * 1024


def test_a_hook_reports_the_status_and_sends_the_method() -> None:
    """The call is made once, with its method and path; a 404 is a failure in words."""
    with loopback_server(answer(204)) as (port, requests):
        assert run_hook(hook_to(port, "/chat/7")) == "ok 204"
    assert requests[0].startswith(b"DELETE /chat/7 HTTP/1.1")
    with loopback_server(answer(404)) as (port, _):
        assert run_hook(hook_to(port)) == "failed: HTTP 404"


def test_a_refused_connection_is_a_failure_in_words() -> None:
    """Nothing listens: the outcome says so at once, no exception escapes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        assert run_hook(hook_to(port), deadline_s=1.0) == "failed: ConnectError"


def test_hooks_never_go_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY, ALL_PROXY and friends are set to a recording proxy: it sees nothing."""
    with (
        loopback_server(answer(200)) as (proxy_port, proxied),
        loopback_server(answer(204)) as (port, reached),
    ):
        proxy = f"http://127.0.0.1:{proxy_port}"
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY"):
            monkeypatch.setenv(name, proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert run_hook(hook_to(port)) == "ok 204"
    assert proxied == []
    assert len(reached) == 1


def test_the_runner_runs_hooks_on_its_own_bounded_pool() -> None:
    """Hung hooks occupy only the pool: submit returns at once, and at most ``workers`` run."""
    release = threading.Event()
    running: list[str] = []
    lock = threading.Lock()
    peak = 0

    def slow(hook: ReleaseHook) -> str:
        nonlocal peak
        with lock:
            running.append(threading.current_thread().name)
            peak = max(peak, len(running))
        release.wait(10)
        with lock:
            running.pop()
        return "ok 204"

    runner = HookRunner(workers=2, run=slow)
    started = time.monotonic()
    futures = [runner.submit(hook_to(1)) for _ in range(5)]
    assert time.monotonic() - started < 0.5
    wait_until(lambda: peak >= 2, "two hooks running", 10)  # threads start on their own time
    time.sleep(0.3)  # and no third starts meanwhile
    assert peak == 2
    assert all(name.startswith("roomkeeper-hook") for name in running)
    assert threading.current_thread().name not in running
    release.set()
    assert [f.result(5) for f in futures] == ["ok 204"] * 5
    runner.close()


def test_a_batch_loads_no_http_library() -> None:
    """A batch of local commands never carries a hook: starting one does not pay for
    loading httpx."""
    code = (
        "import sys, roomkeeper.cli.local, roomkeeper.batch.run;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'httpx', 'httpcore'}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]"

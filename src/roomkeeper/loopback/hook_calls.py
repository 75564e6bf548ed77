"""Making release hooks' calls (:class:`~roomkeeper.loopback.hooks.ReleaseHook`).

A call's failure is recorded and never retried forever, and no proxy variable
(``HTTP_PROXY``, ``ALL_PROXY``) is ever read for a hook.  A hook cannot stall
anything but its own reservation:

* One wall-clock deadline covers the whole call (connect, request, response):
  a server that sends a byte a second is cut off when it passes, because every
  socket the call opened is shut down then (per-read timeouts alone would let
  such a server hold the call forever).
* At most :data:`HOOK_BODY_MAX` bytes of the answer are read.
* Hooks run on their own bounded pool (:class:`HookRunner`), never on the
  scheduler's thread or the event loop's default executor.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import threading
import time
import typing
from collections.abc import Callable
from typing import Any

import httpcore

from roomkeeper.loopback.hooks import ReleaseHook

HOOK_DEADLINE_S = 3.0  # the whole call: connect + request + response
HOOK_BODY_MAX = 64 * 1024  # bytes of the answer read at most
HOOK_WORKERS = 8  # hooks running at once; more wait their turn on the pool


class _DeadlineBackend(httpcore.SyncBackend):
    """Opens sockets as httpcore's own backend does, and shuts them all down at the deadline."""

    def __init__(self, deadline_at: float, clock: Callable[[], float]) -> None:
        self._deadline_at = deadline_at
        self._clock = clock
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._expired = False

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        remaining = max(0.0, self._deadline_at - self._clock())
        stream = super().connect_tcp(
            host,
            port,
            timeout=remaining if timeout is None else min(timeout, remaining),
            local_address=local_address,
            socket_options=socket_options,
        )
        sock = stream.get_extra_info("socket")
        with self._lock:
            self._sockets.append(sock)
            expired = self._expired
        if expired:  # the deadline passed while we connected
            self._cut(sock)
        return stream

    def expire(self) -> None:
        """The deadline has passed: every blocked read or write of the call returns at once."""
        with self._lock:
            self._expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._cut(sock)

    @staticmethod
    def _cut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def run_hook(
    hook: ReleaseHook,
    *,
    deadline_s: float = HOOK_DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Make the call once, within one deadline; its outcome in words (``ok 204``, ``failed: ...``).

    Uses httpcore (httpx's own core) directly, so that the call's sockets can be
    cut at the deadline; it reads no proxy variables (no ``trust_env``).
    """
    started = clock()
    backend = _DeadlineBackend(started + deadline_s, clock)
    timer = threading.Timer(deadline_s, backend.expire)
    timer.daemon = True
    timer.start()
    per_step = {"connect": deadline_s, "read": deadline_s, "write": deadline_s, "pool": deadline_s}
    try:
        with (
            httpcore.ConnectionPool(network_backend=backend, max_connections=1) as pool,
            pool.stream(
                hook.method,
                hook.url,
                headers=[(b"Idempotency-Key", hook.key.encode())] if hook.key else None,
                extensions={"timeout": per_step},
            ) as response,
        ):
            _read_capped(response)
            status = response.status
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as err:
        if clock() - started >= deadline_s:
            return f"failed: no answer within {deadline_s:g} s"
        return f"failed: {type(err).__name__}"
    except (httpcore.UnsupportedProtocol, OSError) as err:
        return f"failed: {type(err).__name__}"
    finally:
        timer.cancel()
    if 200 <= status < 300:
        return f"ok {status}"
    return f"failed: HTTP {status}"


def _read_capped(response: httpcore.Response) -> None:
    """Read the answer up to :data:`HOOK_BODY_MAX` bytes; the rest is never read."""
    seen = 0
    for chunk in response.iter_stream():
        seen += len(chunk)
        if seen >= HOOK_BODY_MAX:
            return


class HookRunner:
    """Release hooks on their own bounded pool of threads.

    Args:
        workers: hooks that may run at once.
        deadline_s: each hook's deadline for the whole call.
        run: the call itself (tests inject a fake).
    """

    def __init__(
        self,
        *,
        workers: int = HOOK_WORKERS,
        deadline_s: float = HOOK_DEADLINE_S,
        run: Callable[[ReleaseHook], str] | None = None,
    ) -> None:
        self._deadline_s = deadline_s
        self._run = run or (lambda hook: run_hook(hook, deadline_s=deadline_s))
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="roomkeeper-hook"
        )

    def submit(self, hook: ReleaseHook) -> concurrent.futures.Future[str]:
        """Start the hook on the pool; the future resolves to its outcome in words."""
        return self._pool.submit(self._run, hook)

    def close(self, wait: bool = True) -> None:
        """Let running hooks finish (each within its deadline); start no new ones."""
        self._pool.shutdown(wait=wait, cancel_futures=False)

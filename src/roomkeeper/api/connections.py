"""Bounds on the gateway's connections: a deadline for request headers, and a ceiling.

uvicorn has no header timeout: anyone local, without a token, can open a
connection and stop in the middle of its headers, and hold it for ever
(slowloris); enough of them exhaust the process's file descriptors.  Each
connection here must deliver a request's complete headers within
:data:`HEADER_TIMEOUT_S` of being opened (or of its previous response):
otherwise it is closed.  uvicorn's own ``timeout_keep_alive`` closes idle
keep-alive connections, and ``limit_concurrency`` (:data:`MAX_CONNECTIONS`)
answers 503 beyond a ceiling instead of accepting without end; the
soft file-descriptor limit is raised so that ceiling can be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import struct
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("roomkeeper")

HEADER_TIMEOUT_S = 10.0  # a request's headers, complete, within this of the connection's turn
KEEP_ALIVE_S = 5  # seconds (an int, as uvicorn wants): idle keep-alive connections close
MAX_CONNECTIONS = 2048  # beyond this many, new requests are answered 503
FILE_DESCRIPTORS = MAX_CONNECTIONS + 1024  # what the ceiling needs, plus journal, logs, jobs


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive in time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not peer_may_connect(transport.get_extra_info("socket")):
            transport.close()  # another local user on our Unix socket: not even a 403
            return
        self._arm_header_timer()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request's headers arrived whole
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this connection has its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:  # no request under way
            self.transport.close()


def peer_may_connect(sock: socket.socket | None) -> bool:
    """On a Unix socket, only our own user (or root) may talk to the gateway.

    The socket file is made 0600, but a connection that raced that chmod, or a
    socket placed where others can reach it, is still checked: the kernel says
    who the peer is (``SO_PEERCRED``).  TCP on loopback is guarded by the token.
    """
    if sock is None or sock.family != socket.AF_UNIX:
        return True
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid in (os.getuid(), 0):
        return True
    log.warning("refused a connection on the gateway's socket from uid %d", uid)
    return False


def raise_file_limit(wanted: int = FILE_DESCRIPTORS) -> int:
    """Raise the soft limit on open files towards ``wanted`` (never above the hard limit).

    Returns:
        the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]

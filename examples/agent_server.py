"""A toy agent server: every turn leaves a session behind until someone deletes it.

It stands in for an agent server that keeps each turn's session: ``POST
/chat/{id}`` starts a turn and builds a session for that conversation id that
holds a large buffer (the turn's message history), and the session stays in
the store until ``DELETE /chat/{id}`` drops it.  Nothing else ever frees it,
so a dispatcher that never asks for its sessions back makes this process grow
with every finished turn.

Usage::

    python examples/agent_server.py [PORT]

PORT 0 (the default) picks a free port.  The first line on stdout is
``listening on PORT``.

Routes:

* ``POST /chat/{id}`` with an optional JSON body ``{"session_bytes": N}``
  (default 8 MiB): 201 ``{"id", "session_bytes", "sessions"}``.  Starting a
  turn for an id that already has a session replaces it.
* ``DELETE /chat/{id}``: 204, or 404 when there is no such session.
* ``GET /stats``: ``{"sessions": n, "session_bytes": total, "rss_bytes": rss}``,
  the RSS read from ``/proc/self/statm``.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import signal
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_SESSION_BYTES = 8 * 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")
CHAT = re.compile(r"^/chat/([A-Za-z0-9._:-]{1,200})$")


def rss_bytes() -> int:
    """This process's resident set, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def make_session(size: int) -> mmap.mmap | None:
    """A buffer of ``size`` bytes with every page written, so it is really resident.

    The buffer is its own anonymous mapping, so closing it gives the memory
    straight back to the kernel and the RSS falls again.  A ``bytearray``
    would not do that reliably: glibc serves the first large one with mmap,
    but freeing it raises glibc's mmap threshold, later ones come from the
    heap, and the freed heap is kept for reuse (measured: 50 sessions of
    4 MiB made and dropped one after another left one session's worth,
    +20 %, in the RSS).
    """
    if size == 0:
        return None
    buf = mmap.mmap(-1, size)
    buf[::PAGE] = b"x" * len(range(0, size, PAGE))
    return buf


class Store:
    """The session store: conversation id -> buffer."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[str, mmap.mmap | None] = {}

    def start(self, conversation: str, size: int) -> int:
        """Build a session for ``conversation``; returns how many sessions are held."""
        buf = make_session(size)
        with self.lock:
            old = self.sessions.get(conversation)
            self.sessions[conversation] = buf
            count = len(self.sessions)
        if old is not None:
            old.close()
        return count

    def drop(self, conversation: str) -> bool:
        """Forget a session; False when there was none."""
        with self.lock:
            if conversation not in self.sessions:
                return False
            buf = self.sessions.pop(conversation)
        if buf is not None:
            buf.close()  # munmap: the pages go back to the kernel here
        return True

    def stats(self) -> dict[str, int]:
        """Session count, their total size and this process's RSS."""
        with self.lock:
            count = len(self.sessions)
            total = sum(len(b) for b in self.sessions.values() if b is not None)
        return {"sessions": count, "session_bytes": total, "rss_bytes": rss_bytes()}


STORE = Store()


class Handler(BaseHTTPRequestHandler):
    """The three routes."""

    protocol_version = "HTTP/1.1"
    server_version = "toy-agent/1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the dispatcher prints what happened."""

    def _send(self, status: int, body: dict[str, Any] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode() + b"\n"
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        value = json.loads(self.rfile.read(length))
        if not isinstance(value, dict):
            raise ValueError("the body must be a JSON object")
        return value

    def do_GET(self) -> None:
        """``GET /stats``."""
        if self.path == "/stats":
            self._send(HTTPStatus.OK, STORE.stats())
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": "no such route"})

    def do_POST(self) -> None:
        """``POST /chat/{id}``: start a turn, which builds and keeps a session."""
        match = CHAT.match(self.path)
        if match is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": "no such route"})
            return
        try:
            size = int(self._body().get("session_bytes", DEFAULT_SESSION_BYTES))
        except (ValueError, TypeError) as err:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(err)})
            return
        if size < 0:
            self._send(HTTPStatus.BAD_REQUEST, {"error": "session_bytes must be >= 0"})
            return
        count = STORE.start(match.group(1), size)
        self._send(
            HTTPStatus.CREATED, {"id": match.group(1), "session_bytes": size, "sessions": count}
        )

    def do_DELETE(self) -> None:
        """``DELETE /chat/{id}``: dispose of the session."""
        match = CHAT.match(self.path)
        if match is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": "no such route"})
        elif STORE.drop(match.group(1)):
            self._send(HTTPStatus.NO_CONTENT)
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": "no such session"})


def main(argv: list[str]) -> int:
    """Serve on 127.0.0.1 until SIGTERM or Ctrl-C."""
    port = int(argv[1]) if len(argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""A toy agent server: every turn leaves a session behind until someone deletes it.

It stands in for an agent server that keeps each turn's session: ``POST
/chat/{id}`` runs a turn, which builds a session for that conversation id
holding a large buffer (the turn's message history) and may grow it while
the turn runs; the session stays in the store after the turn until
``DELETE /chat/{id}`` drops it.  Nothing else ever frees it, so a dispatcher
that never asks for its sessions back makes this process grow with every
finished turn.

Usage::

    python examples/agent_server.py [PORT]

PORT 0 (the default) picks a free port.  The first line on stdout is
``listening on PORT``.

Routes:

* ``POST /chat/{id}`` with an optional JSON body ``{"session_bytes": N,
  "grow_bytes": G, "turn_s": T}``: a turn.  Its session starts at N bytes
  (default 8 MiB) and grows evenly by G more (default 0) over T seconds
  (default 0); the answer comes when the turn ends: 201 ``{"id",
  "session_bytes", "sessions", "ended"}``, ``ended`` being ``finished``, or
  ``ended early`` when ``/end`` cut it short (its session is gone then).
  Starting a turn for an id that already has a session replaces it.
* ``POST /chat/{id}/end``: end that running turn now and drop its session:
  200 ``{"id", "freed_bytes"}``, or 404 when no turn of that id runs.
* ``DELETE /chat/{id}``: 204 once the session is gone (also for a turn ended
  early), or 404 when there never was one.
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
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_SESSION_BYTES = 8 * 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")
CHAT = re.compile(r"^/chat/([A-Za-z0-9._:-]{1,200})$")
END = re.compile(r"^/chat/([A-Za-z0-9._:-]{1,200})/end$")
GROW_STEP_S = 0.1  # a growing turn adds memory this often
ENDED_KEPT = 10_000  # ids of turns ended early, remembered so their DELETE still answers 204


def rss_bytes() -> int:
    """This process's resident set, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def make_buffer(size: int) -> mmap.mmap | None:
    """A buffer of ``size`` bytes with every page written, so it is really resident.

    The buffer is its own anonymous mapping, so closing it gives the memory
    straight back to the kernel and the RSS falls again.  A ``bytearray``
    would not do that reliably: glibc serves the first large one with mmap,
    but freeing it raises glibc's mmap threshold, later ones come from the
    heap, and the freed heap is kept for reuse (measured: 50 sessions of
    4 MiB made and dropped one after another left one session's worth,
    +20 %, in the RSS).
    """
    if size <= 0:
        return None
    buf = mmap.mmap(-1, size)
    buf[::PAGE] = b"x" * len(range(0, size, PAGE))
    return buf


class Session:
    """One conversation's memory: buffers added as its turn grows."""

    def __init__(self) -> None:
        self.buffers: list[mmap.mmap] = []
        self.ended = threading.Event()  # set when the turn is ended early: stop growing

    def add(self, size: int) -> None:
        buf = make_buffer(size)
        if buf is not None:
            self.buffers.append(buf)

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.buffers)

    def close(self) -> None:
        """munmap every buffer: the pages go back to the kernel here."""
        for buf in self.buffers:
            buf.close()
        self.buffers = []


class Store:
    """The session store: conversation id -> session, and the turns running now."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.running: dict[str, Session] = {}
        self.ended_early: dict[str, None] = {}

    def begin(self, conversation: str, size: int) -> Session:
        """Start a turn: a new session of ``size`` bytes replaces any old one."""
        session = Session()
        session.add(size)
        with self.lock:
            old = self.sessions.get(conversation)
            self.sessions[conversation] = session
            self.running[conversation] = session
            self.ended_early.pop(conversation, None)
        if old is not None:
            old.ended.set()
            old.close()
        return session

    def grow(self, session: Session, size: int) -> bool:
        """Add ``size`` bytes to a running turn's session; False once it was ended early."""
        if session.ended.is_set():
            return False
        buf = make_buffer(size)
        with self.lock:
            if session.ended.is_set():  # ended while the buffer was made
                if buf is not None:
                    buf.close()
                return False
            if buf is not None:
                session.buffers.append(buf)
        return True

    def finish(self, conversation: str, session: Session) -> int:
        """The turn is over: its session stays; how many sessions are held."""
        with self.lock:
            if self.running.get(conversation) is session:
                del self.running[conversation]
            return len(self.sessions)

    def end(self, conversation: str) -> int | None:
        """End a running turn now and drop its session; bytes freed, None if none runs."""
        with self.lock:
            session = self.running.pop(conversation, None)
            if session is None:
                return None
            session.ended.set()
            if self.sessions.get(conversation) is session:
                del self.sessions[conversation]
            self.ended_early[conversation] = None
            while len(self.ended_early) > ENDED_KEPT:
                del self.ended_early[next(iter(self.ended_early))]
            freed = session.size
            session.close()
        return freed

    def drop(self, conversation: str) -> bool:
        """Forget a session (a turn ended early is gone already); False when there was none."""
        with self.lock:
            session = self.sessions.pop(conversation, None)
            if session is None:
                return conversation in self.ended_early
            running = self.running.get(conversation) is session
            if running:
                del self.running[conversation]
                session.ended.set()
            session.close()
        return True

    def stats(self) -> dict[str, int]:
        """Session count, their total size and this process's RSS."""
        with self.lock:
            count = len(self.sessions)
            total = sum(s.size for s in self.sessions.values())
        return {"sessions": count, "session_bytes": total, "rss_bytes": rss_bytes()}


def run_turn(conversation: str, size: int, grow: int, turn_s: float) -> dict[str, Any]:
    """One turn: a session of ``size`` bytes growing by ``grow`` over ``turn_s`` seconds."""
    session = STORE.begin(conversation, size)
    steps = max(1, int(turn_s / GROW_STEP_S)) if grow > 0 else 0
    ended = "finished"
    deadline = time.monotonic()
    for step in range(steps):
        deadline += turn_s / steps
        chunk = grow * (step + 1) // steps - grow * step // steps
        if not STORE.grow(session, chunk) or session.ended.wait(
            max(0.0, deadline - time.monotonic())
        ):
            ended = "ended early"
            break
    else:
        if steps == 0 and turn_s > 0 and session.ended.wait(turn_s):
            ended = "ended early"
    count = STORE.finish(conversation, session)
    return {"id": conversation, "session_bytes": session.size, "sessions": count, "ended": ended}


STORE = Store()


class Handler(BaseHTTPRequestHandler):
    """The routes."""

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
        """``POST /chat/{id}``: run a turn; ``POST /chat/{id}/end``: end a running one now."""
        ending = END.match(self.path)
        if ending is not None:
            freed = STORE.end(ending.group(1))
            if freed is None:
                self._send(HTTPStatus.NOT_FOUND, {"error": "no turn of that id runs"})
            else:
                self._send(HTTPStatus.OK, {"id": ending.group(1), "freed_bytes": freed})
            return
        match = CHAT.match(self.path)
        if match is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": "no such route"})
            return
        try:
            body = self._body()
            size = int(body.get("session_bytes", DEFAULT_SESSION_BYTES))
            grow = int(body.get("grow_bytes", 0))
            turn_s = float(body.get("turn_s", 0))
        except (ValueError, TypeError) as err:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(err)})
            return
        if size < 0 or grow < 0 or not 0 <= turn_s <= 3600:
            self._send(
                HTTPStatus.BAD_REQUEST,
                {"error": "session_bytes and grow_bytes must be >= 0, turn_s 0 to 3600"},
            )
            return
        self._send(HTTPStatus.CREATED, run_turn(match.group(1), size, grow, turn_s))

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

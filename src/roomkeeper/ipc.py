"""The private channel between the supervisor and its gateway (the gateway is watched from outside).

One ``AF_UNIX`` stream socketpair per gateway process; the child's end is
inherited as the file descriptor named by ROOMKEEPER_IPC_FD.  Messages are
newline-delimited JSON objects, each with a ``type``:

gateway -> supervisor
    ``hello``      {"protocol": 1, "capabilities": [...], "boot_id", "pid"} -- first message.
    ``heartbeat``  {"boot_id", "at"}: sent only after the gateway's own real
                   ``GET /health`` over HTTP answered, within 2 s, with its own boot id.
    ``stop``       an explicit stop was asked for (never to be taken for a crash).
    ``restart``    a restart was asked for (``POST /v1/restart``).
    ``repaired``   ``POST /v1/repair`` passed its checks: clear the budget.
supervisor -> gateway
    ``relief``         hold admission and stop the newest managed tree (keep its output).
    ``recovery_mode``  {"on": bool}: hold automatic work while the latch is on.

The channel's end-of-file means the other side is gone: a gateway that loses
its supervisor runs its shutdown path, taking its managed trees with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

PROTOCOL = 1
CAPABILITIES = ("heartbeat", "relief", "restart", "recovery_mode")
ENV_FD = "ROOMKEEPER_IPC_FD"
# Set by the supervisor on a child it starts while recovery mode is latched.
RECOVERY_MODE_VARIABLE = "ROOMKEEPER_RECOVERY_MODE"
MAX_LINE = 64 * 1024
# The gateway's exit status when it cannot start for a reason a restart will not mend (a
# damaged journal): the supervisor says so and stops instead of restarting it in a loop.
# sysexits' EX_CONFIG.
EXIT_CANNOT_START = 78


class Channel:
    """One end of the socketpair: send JSON lines (thread-safe), read them as they come."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._buffer = b""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Channel | None:
        """The gateway's end, if a supervisor passed one (ROOMKEEPER_IPC_FD)."""
        env = os.environ if env is None else env
        value = env.get(ENV_FD)
        if not value or not value.isdigit():
            return None
        try:
            sock = socket.socket(fileno=int(value))
        except OSError:
            return None
        return cls(sock)

    def send(self, kind: str, **fields: Any) -> bool:
        """Send one message; False when the other side is gone."""
        data = json.dumps({"type": kind, **fields}).encode() + b"\n"
        with self._send_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                return False
        return True

    def messages(self) -> Iterator[dict[str, Any]]:
        """Messages as they arrive (blocking); ends at end-of-file or a broken channel."""
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # a garbled line is skipped, never fatal
                if isinstance(message, dict) and isinstance(message.get("type"), str):
                    yield message
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE and b"\n" not in self._buffer:
                self._buffer = b""  # an endless line is garbage

    def close(self) -> None:
        """Close this end (the other side then sees end-of-file)."""
        with contextlib.suppress(OSError):
            self.sock.close()


def pair() -> tuple[Channel, socket.socket]:
    """A new channel for the supervisor, and the socket to hand to the child (inheritable)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child.set_inheritable(True)
    return Channel(parent), child

"""A small stdlib sender for systemd's notification socket (``sd_notify``).

Under ``Type=notify`` systemd sets NOTIFY_SOCKET: a datagram ``AF_UNIX``
socket, by path or, when it starts with ``@``, in the abstract namespace.
Each message is one datagram of ``KEY=value`` lines (``READY=1``,
``WATCHDOG=1``, ``STATUS=...``, ``STOPPING=1``).  WATCHDOG_USEC says how
often systemd expects ``WATCHDOG=1`` (when WATCHDOG_PID is unset or ours).

Sending is best effort: no socket, or one that refuses, costs nothing and
never stops the supervisor.  Nor does one whose queue is full (nobody reads
it): a message that would wait is dropped, since a supervisor blocked in a
send would watch nothing and answer no signal.  A dropped ``READY=1`` goes
again with the next ``WATCHDOG=1`` (sent on every healthy heartbeat), or
systemd would wait for it until its start timeout.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(value: str | None) -> str | bytes | None:
    """The address to send to: a path, an abstract name (``@x`` -> ``\\0x``), or None."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # vsock and other families are not ours to speak


class Notifier:
    """Sends notifications to systemd, if it is listening.

    Args:
        env: the environment to read NOTIFY_SOCKET and WATCHDOG_USEC from; ``os.environ``
            when omitted.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = socket_address(env.get("NOTIFY_SOCKET"))
        self.watchdog_s: float | None = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1_000_000
        self.ready_sent = False
        self._unsent_ready: str | None = None  # the status of a READY=1 that was dropped
        self.sent = 0

    @property
    def enabled(self) -> bool:
        """Whether a notification socket was given."""
        return self.address is not None

    def notify(self, *lines: str) -> bool:
        """Send one datagram made of ``lines``; False when nobody took it."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.send("\n".join(lines).encode(), socket.MSG_DONTWAIT)
        except OSError:
            return False
        self.sent += 1
        return True

    def ready(self, status: str) -> None:
        """``READY=1`` once (with a status line); later calls only update the status."""
        if self.ready_sent:
            self.notify(f"STATUS={status}")
            return
        self.ready_sent = self.notify("READY=1", f"STATUS={status}")
        self._unsent_ready = None if self.ready_sent or not self.enabled else status

    def watchdog(self) -> None:
        """``WATCHDOG=1``: keep systemd's own watchdog from firing (after a ``READY=1``
        that was dropped, sent again first)."""
        if self._unsent_ready is not None:
            self.ready(self._unsent_ready)
        self.notify("WATCHDOG=1")

    def status(self, text: str) -> None:
        """``STATUS=``: a line ``systemctl status`` shows."""
        self.notify(f"STATUS={text}")

    def stopping(self) -> None:
        """``STOPPING=1``: the service is going down on purpose."""
        self.notify("STOPPING=1", "STATUS=stopping")

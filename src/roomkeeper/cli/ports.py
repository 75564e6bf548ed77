"""Is the loopback port free, the way the gateway's server binds it, and who holds it if not.

A crash of the whole service (a container restart, an OOM kill of the unit)
leaves the port's recent connections in TIME_WAIT for up to a minute.  uvicorn
binds with ``SO_REUSEADDR``, which Linux grants beside TIME_WAIT leftovers but
never beside a live listener: the pre-check binds the same way, so it refuses
only what the server's own bind would refuse, and then says which process
listens there.
"""

from __future__ import annotations

import errno
import socket

import psutil

from roomkeeper.errors import UsageError


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Refuse, with a message that names the holder, when ``port`` has a live listener.

    Raises:
        UsageError: something listens on the port, or it cannot be bound at all
            (a privileged port without the right, say); the message says which and
            how to choose another.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        probe.bind((host, port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise UsageError(
                f"port {port} on {host} is in use by {listener_of(port)}; stop it, or choose "
                "another port with --port or ROOMKEEPER_PORT",
                name="port",
                value=port,
            ) from None
        raise UsageError(
            f"port {port} on {host} cannot be bound ({err.strerror or err}); "
            "choose another with --port or ROOMKEEPER_PORT",
            name="port",
            value=port,
        ) from None
    finally:
        probe.close()


def listener_of(port: int) -> str:
    """Who listens on TCP ``port``, in words: ``pid 123 (roomkeeper serve ...)`` where visible."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return "another process (not visible to this user)"
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                return "another process (not visible to this user)"
            try:
                command = " ".join(psutil.Process(conn.pid).cmdline()) or "?"
            except psutil.Error:
                command = "?"
            if len(command) > 80:
                command = command[:77] + "..."
            return f"pid {conn.pid} ({command})"
    return "another socket (it holds the port without listening)"

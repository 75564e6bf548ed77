"""Ports for test servers, chosen where no other process is handed one by chance.

A port found free with ``bind(0)`` comes from the kernel's ephemeral range, the
same range every other process's ``bind(0)`` and outgoing connection draw from:
between closing the probe and the server binding it, a Ray raylet started by a
test beside it may take it (seen in CI). So ports here come from below the
ephemeral range (and above Ray's worker ports, 10002-19999), where nothing is
handed a port unasked, and each pytest-xdist worker draws from a slice of its
own, so two workers never choose the same one.  Within a worker the ports are
handed out in turn around its slice (from a random start), so a port comes
back only after every other one of the slice has been handed out.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_RAY_WORKER_PORTS_END = 20_000
_cursor: list[int] = []  # where the next port is looked for in this process's slice


def _quiet_range() -> range:
    """Ports no process is given by the kernel: below its ephemeral range, else above it."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    if low - _RAY_WORKER_PORTS_END >= 2000:
        return range(_RAY_WORKER_PORTS_END, low)
    return range(high + 1, 65536)


def _worker_slice() -> range:
    """This xdist worker's share of the quiet range (the whole range outside xdist)."""
    quiet = _quiet_range()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return quiet
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    width = len(quiet) // workers
    start = quiet.start + (int(worker[2:]) % workers) * width
    return range(start, start + width)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now, the next in turn in this worker's
    slice (none handed out again before the rest of the slice has been)."""
    share = _worker_slice()
    if not _cursor:
        _cursor.append(random.randrange(len(share)))
    ports: list[int] = []
    for _ in range(len(share)):
        port = share[_cursor[0] % len(share)]
        _cursor[0] += 1
        if _bindable(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise AssertionError(f"no {count} free ports on loopback in {share}")


def free_port() -> int:
    """One port free on loopback now, outside the kernel's ephemeral range."""
    return free_ports(1)[0]

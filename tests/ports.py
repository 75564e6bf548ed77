"""Ports for test servers, chosen where no other process is handed one by chance.

A port found free with ``bind(0)`` comes from the kernel's ephemeral range, the
same range every other process's ``bind(0)`` and outgoing connection draw from:
between closing the probe and the server binding it, a Ray raylet started by a
test beside it may take it (seen in CI). So ports here come from below the
ephemeral range (and above Ray's worker ports, 10002-19999), where nothing is
handed a port unasked, and each pytest-xdist worker draws from a slice of its
own, so two workers never choose the same one.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_RAY_WORKER_PORTS_END = 20_000
_SLICES = 16
_HANDED_OUT: set[int] = set()


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
    width = len(quiet) // _SLICES
    start = quiet.start + (int(worker[2:]) % _SLICES) * width
    return range(start, start + width)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now, none handed out before by this process."""
    share = _worker_slice()
    ports: list[int] = []
    for port in random.sample(share, len(share)):
        if port not in _HANDED_OUT and _bindable(port):
            ports.append(port)
            if len(ports) == count:
                _HANDED_OUT.update(ports)
                return ports
    raise AssertionError(f"no {count} free ports on loopback in {share}")


def free_port() -> int:
    """One port free on loopback now, outside the kernel's ephemeral range."""
    return free_ports(1)[0]

"""A build step for the jobserver tests: note its start, grow to SIZE bytes, hold, note its end
(or, on SIGTERM, that it ended of it).

Usage: python build_step.py TRACE NAME SIZE_BYTES GROW_SECONDS HOLD_SECONDS

With ``--hold-token`` first it is a jobserver client too: it reads one token
from the descriptors ``MAKEFLAGS`` names, notes its pid as a holder, and runs
two steps of its own (its implicit slot and the token), so that a test can
kill it with the token in hand.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time


def note(trace: str, text: str) -> None:
    """Append one line to the trace (O_APPEND: lines from steps at once never mix)."""
    fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{text} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)


def grow(size: int, grow_s: float, hold_s: float) -> None:
    """Allocate and touch ``size`` bytes over ``grow_s`` seconds, then hold them."""
    held, parts = [], 10
    for _ in range(parts):
        held.append(b"\x01" * (size // parts))
        time.sleep(grow_s / parts)
    time.sleep(hold_s)


def hold_token(trace: str, name: str, args: list[str]) -> None:
    """Take a token like a client does, run two steps under the two slots, never return it."""
    auth = re.findall(r"--jobserver-auth=(\d+),(\d+)", os.environ.get("MAKEFLAGS", ""))
    read_fd = int(auth[-1][0])
    while True:  # make sets the shared descriptor non-blocking: wait, then try
        select.select([read_fd], [], [])
        try:
            os.read(read_fd, 1)
            break
        except BlockingIOError:
            continue  # another client took it first
    kids = [
        subprocess.Popen([sys.executable, __file__, trace, f"{name}.{i}", *args]) for i in (1, 2)
    ]
    note(trace, f"holder {os.getpid()} {' '.join(str(k.pid) for k in kids)}")
    for kid in kids:
        kid.wait()


def main(argv: list[str]) -> None:
    """Run one step (or, with ``--hold-token``, a client holding a token)."""
    if argv[0] == "--hold-token":
        hold_token(argv[1], argv[2], argv[3:])
        return
    trace, name, size, grow_s, hold_s = argv

    def ended_by_sigterm(signum: int, frame: object) -> None:
        note(trace, f"term {name}")  # a step stopped by SIGSTOP runs this only once let go
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, ended_by_sigterm)
    note(trace, f"start {name}")
    grow(int(size), float(grow_s), float(hold_s))
    note(trace, f"end {name}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Fakes for tests: a clock that moves only when told to, and a supervisor with short waits.

Timeouts and windows are tested on a fake clock, never by sleeping for real.
Where a test needs the real supervisor as a separate process, it runs
:func:`serve_for_tests` in a child::

    python -c "import roomkeeper.testing as t; raise SystemExit(t.serve_for_tests(8765))"

This module may import any layer; it imports them only when a fake needs them.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

SHORT_BACKOFF_S = 0.2
"""The first wait before a restart in :func:`serve_for_tests` (production: 1 s)."""
SHORT_BACKOFF_MAX_S = 2.0
"""The longest wait between restarts in :func:`serve_for_tests` (production: 60 s)."""


class CannotSuspend:
    """For a fake handle: a tree the relief ladder may not suspend, as one on another machine."""

    suspendable = False
    local = True  # its (fake) memory counts in this container's reading

    def settlement(self) -> None:
        """None: it ends by itself, with an exit status, as a local tree does."""
        return None

    def halt(self) -> None:
        """Nothing, as for a remote tree."""

    def suspend(self, *, timeout: float = 0.0) -> object:
        """Refuse, as a remote tree does."""
        from roomkeeper.errors import SuspendError

        raise SuspendError("fake", "this fake tree cannot be suspended")

    def resume(self) -> object:
        """Refuse, as a remote tree does."""
        from roomkeeper.errors import SuspendError

        raise SuspendError("fake", "this fake tree cannot be suspended")


class FakeClock:
    """A monotonic clock that moves only when :meth:`advance` is called.

    Args:
        start: the time it reads before any advance.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        """Read the clock (use the instance where ``time.monotonic`` is expected)."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (never backwards)."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back (got {seconds})")
        with self._lock:
            self._now += seconds


def serve_for_tests(
    port: int,
    *,
    gateway_command: Sequence[str] | None = None,
    backoff_s: float = SHORT_BACKOFF_S,
    backoff_max_s: float = SHORT_BACKOFF_MAX_S,
) -> int:
    """Run what ``roomkeeper serve --port PORT`` runs, with short restart waits; the exit status.

    The real supervisor, reading its variables from the environment, and
    logging to stderr as the ``roomkeeper`` command does; only the backoff
    and, when given, the child's command line are the test's.

    Args:
        port: the gateway's loopback port.
        gateway_command: what to run as the gateway (a stand-in that speaks the
            channel); the real ``python -m roomkeeper gateway`` when omitted.
        backoff_s: the wait before the first restart after a failure, doubling from there.
        backoff_max_s: the longest wait between failure restarts.
    """
    from roomkeeper.supervisor.service import run_supervisor

    _log_to_stderr()
    return run_supervisor(
        port,
        None,
        gateway_command=gateway_command,
        backoff_s=backoff_s,
        backoff_max_s=backoff_max_s,
    )


def _log_to_stderr() -> None:
    """The ``roomkeeper`` command's log lines: ``roomkeeper: LEVEL message`` on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("roomkeeper: %(levelname)s %(message)s"))
    root = logging.getLogger("roomkeeper")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False

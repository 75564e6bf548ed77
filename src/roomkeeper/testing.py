"""Fakes for tests: a clock that moves only when told to.

Timeouts and windows are tested on a fake clock, never by sleeping for real
(HOUSE_STYLE 7).
"""

from __future__ import annotations

import threading


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

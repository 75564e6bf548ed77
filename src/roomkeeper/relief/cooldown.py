"""The one cooldown clock: admission held for a while after memory had to be relieved.

Both the relief ladder's stop (:mod:`roomkeeper.relief.monitor`) and the
supervisor's relief request (:mod:`roomkeeper.gateway.link`) start it, for
ROOMKEEPER_PRESSURE_COOLDOWN seconds: one clock, not two, so that neither
lets work in while the other still holds it out.  Thread-safe.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable


class CooldownCause(enum.Enum):
    """Who started the cooldown last."""

    PRESSURE = "pressure"  # the ladder stopped a tree
    RELIEF = "relief"  # the supervisor asked for relief


class Cooldown:
    """Admission held until a moment on the monotonic clock.

    Args:
        clock: monotonic seconds.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until = float("-inf")
        self._cause: CooldownCause | None = None

    def start(self, seconds: float, cause: CooldownCause) -> None:
        """Hold admission for ``seconds`` from now (a later end is never shortened)."""
        with self._lock:
            until = self._clock() + max(0.0, seconds)
            if until >= self._until:
                self._until, self._cause = until, cause

    def clear(self) -> None:
        """End the cooldown now (a repair)."""
        with self._lock:
            self._until, self._cause = float("-inf"), None

    def remaining(self) -> float:
        """Seconds until admission is free again; 0 when it is."""
        with self._lock:
            return max(0.0, self._until - self._clock())

    def active(self) -> bool:
        """Whether admission is held now."""
        return self.remaining() > 0

    def cause(self) -> CooldownCause | None:
        """Who started the running cooldown; None when none runs."""
        with self._lock:
            return self._cause if self._until > self._clock() else None

"""The one cooldown clock: admission held for a while after memory had to be relieved.

Both the relief ladder's stop (:mod:`roomkeeper.relief.monitor`) and the
supervisor's relief request (:mod:`roomkeeper.gateway.link`) start it: one
clock, not two, so that neither lets work in while the other still holds it
out.  Each cause keeps its own end, so ending one cause's hold early (the
monitor does, once a stopped tree's memory is back) never shortens the
other's.  Thread-safe.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable


class CooldownCause(enum.Enum):
    """Who started a cooldown."""

    PRESSURE = "pressure"  # the ladder stopped a tree
    RELIEF = "relief"  # the supervisor asked for relief


class Cooldown:
    """Admission held until a moment on the monotonic clock, per cause.

    Args:
        clock: monotonic seconds.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[CooldownCause, float] = {}
        self._started: dict[CooldownCause, float] = {}

    def start(self, seconds: float, cause: CooldownCause) -> None:
        """Hold admission for ``seconds`` from now (a later end is never shortened)."""
        with self._lock:
            now = self._clock()
            until = now + max(0.0, seconds)
            before = self._until.get(cause, float("-inf"))
            if before <= now:  # a new hold, not a longer one
                self._started[cause] = now
            self._until[cause] = max(before, until)

    def clear(self, cause: CooldownCause | None = None) -> float | None:
        """End ``cause``'s hold now (every cause's when None: a repair); how long the ended
        hold had lasted, None when it was not holding."""
        with self._lock:
            now = self._clock()
            causes = list(CooldownCause) if cause is None else [cause]
            held = [now - self._started.get(c, now) for c in causes if self._until.get(c, 0) > now]
            for c in causes:
                self._until.pop(c, None)
                self._started.pop(c, None)
            return max(held) if held else None

    def remaining(self) -> float:
        """Seconds until admission is free again; 0 when it is."""
        with self._lock:
            now = self._clock()
            return max([0.0, *(until - now for until in self._until.values())])

    def active(self) -> bool:
        """Whether admission is held now."""
        return self.remaining() > 0

    def holding(self, cause: CooldownCause) -> bool:
        """Whether ``cause``'s hold runs now."""
        with self._lock:
            return self._until.get(cause, float("-inf")) > self._clock()

    def cause(self) -> CooldownCause | None:
        """Who holds admission longest now; None when nobody does."""
        with self._lock:
            now = self._clock()
            live = [(until, c.value, c) for c, until in self._until.items() if until > now]
            return max(live)[2] if live else None

"""The restart budget and its private state file (repeated restarts are bounded).

What counts, with the defaults (seconds):

* A *failure* is a gateway that crashed, exited without being asked to stop,
  or was stopped by the watchdog's stages.  More than 3 failures within 600 s
  latch *recovery mode*; more than 6 within 1800 s start a *cooldown*: no
  restart for ROOMKEEPER_RESTART_COOLDOWN (900) seconds instead of an endless
  loop.  After a cooldown one launch is tried; if it fails while the window
  still holds more than 6 failures, the next cooldown follows at once, so an
  install that cannot start costs one launch per cooldown, no more.
* A *requested* restart (``POST /v1/restart``) is fast and costs nothing,
  but requests are counted too: the sixth and every later one within 120 s
  counts as a failure (and waits its backoff), so a client that restarts the
  gateway in a loop spends the same budget as a crash loop.
* Recovery mode is a latch: time never clears it.  Only the gateway's
  ``repaired`` message (``POST /v1/repair`` passed its checks) does, and it
  clears the failure history and any cooldown with it.
* Between failure restarts the supervisor waits 1 s, doubling to at most
  60 s; after 600 s of healthy running the next wait is 1 s again.

The state lives in ``ROOMKEEPER_HOME/recovery/supervisor-state.json``
(mode 0600, in a 0700 folder), written atomically: a temporary file,
fsync, rename, fsync of the folder, so a crash leaves the old state or the
new one, never half of one.  It holds timestamps (wall clock, since it must
survive the supervisor's own replacement), reason codes from a closed list
and two numbers; the failure history is bounded by its windows and by
:data:`MAX_FAILURES`.  If it cannot be written (a full disk), the budget
keeps counting in memory and :attr:`RestartBudget.persistence_error` says
why; the supervisor logs it.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from roomkeeper.paths import write_private

log = logging.getLogger("roomkeeper")

STATE_NAME = "supervisor-state.json"
RECOVERY_WINDOW_S = 600.0
RECOVERY_AFTER = 3  # more than this many failures in RECOVERY_WINDOW_S latch recovery mode
COOLDOWN_WINDOW_S = 1800.0
COOLDOWN_AFTER = 6  # more than this many in COOLDOWN_WINDOW_S: cooldown
RAPID_WINDOW_S = 120.0
RAPID_AFTER = 5  # more than this many requested restarts in RAPID_WINDOW_S count as failures
STABLE_S = 600.0  # healthy running after which the backoff starts over
MAX_FAILURES = 64
MAX_REQUESTS = 32


class RestartReason(enum.Enum):
    """Why a gateway was launched: the closed list kept in the state file and the log."""

    START = "start"  # the supervisor's first launch
    CRASH = "crash"  # exited on its own with a failure status or a signal
    EXITED = "exited"  # exited with status 0 without saying "stop"
    UNRESPONSIVE = "unresponsive"  # stopped by the watchdog's stages
    REQUESTED = "requested"  # POST /v1/restart
    RAPID_REQUESTS = "rapid_requests"  # a requested restart beyond the rapid limit
    UNKNOWN = "unknown"  # an inherited reason that is not one of these

    @property
    def is_failure(self) -> bool:
        """Whether a launch for this reason follows a failure."""
        return self in (self.CRASH, self.EXITED, self.UNRESPONSIVE, self.RAPID_REQUESTS)

    @classmethod
    def parse(cls, text: str | None) -> RestartReason | None:
        """The reason named by ``text`` (None for none; UNKNOWN for anything else)."""
        if not text:
            return None
        try:
            return cls(text.strip().lower())
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True, slots=True)
class BudgetState:
    """What the state file holds.

    Attributes:
        failures: (wall-clock time, reason) of recent failures, oldest first.
        requests: wall-clock times of recent requested restarts.
        recovery_mode: the latch.
        cooldown_until: wall-clock end of a cooldown, if one was started.
        next_reason: why the next launch happens (kept for a supervisor that replaces this one).
    """

    failures: tuple[tuple[float, RestartReason], ...] = ()
    requests: tuple[float, ...] = ()
    recovery_mode: bool = False
    cooldown_until: float | None = None
    next_reason: RestartReason | None = None

    def to_json(self) -> str:
        """The stored form."""
        return json.dumps(
            {
                "version": 1,
                "failures": [{"at": at, "reason": r.value} for at, r in self.failures],
                "requests": list(self.requests),
                "recovery_mode": self.recovery_mode,
                "cooldown_until": self.cooldown_until,
                "next_reason": self.next_reason.value if self.next_reason else None,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BudgetState:
        """Read the stored form back (raises ValueError, KeyError or TypeError when damaged)."""
        data: dict[str, Any] = json.loads(text)
        failures = tuple(
            (float(f["at"]), RestartReason.parse(str(f["reason"])) or RestartReason.UNKNOWN)
            for f in data["failures"][-MAX_FAILURES:]
        )
        cooldown = data.get("cooldown_until")
        return cls(
            failures=failures,
            requests=tuple(float(t) for t in data["requests"][-MAX_REQUESTS:]),
            recovery_mode=bool(data["recovery_mode"]),
            cooldown_until=None if cooldown is None else float(cooldown),
            next_reason=RestartReason.parse(data.get("next_reason")),
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one failure or request did to the budget.

    Attributes:
        counted: it counted as a failure (always, for a failure).
        recovery_entered: this one latched recovery mode.
        cooldown_s: seconds of cooldown it started (0 for none).
    """

    counted: bool
    recovery_entered: bool = False
    cooldown_s: float = 0.0


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """A snapshot of a :class:`RestartBudget`."""

    failures_10min: int
    failures_30min: int
    requests_2min: int
    recovery_mode: bool
    cooldown_left_s: float
    persistence_error: str | None


@dataclass
class RestartBudget:
    """The failure history, requested restarts and the recovery latch, kept in the state file.

    Args:
        path: the state file; None keeps everything in memory.
        wall: the wall clock (the state outlives this process, so not monotonic).
    """

    path: Path | None
    wall: Callable[[], float] = time.time
    state: BudgetState = field(default_factory=BudgetState)
    persistence_error: str | None = None

    def __post_init__(self) -> None:
        if self.path is None:
            return
        try:
            self.state = BudgetState.from_json(self.path.read_text())
        except (FileNotFoundError, NotADirectoryError):
            pass  # nothing was ever saved
        except (OSError, ValueError, KeyError, TypeError) as err:
            # A damaged file must not stop supervision; but a lost latch is a
            # loss of protection, so start in recovery mode and say so.
            log.warning(
                "the restart state file %s is unreadable (%s); recovery mode", self.path, err
            )
            self.state = BudgetState(recovery_mode=True)

    # ------------------------------------------------------------ queries

    @property
    def recovery_mode(self) -> bool:
        """The latch."""
        return self.state.recovery_mode

    def cooldown_left(self, cooldown_s: float) -> float:
        """Seconds of cooldown still to wait (never more than ``cooldown_s``: clocks jump)."""
        until = self.state.cooldown_until
        if until is None:
            return 0.0
        return max(0.0, min(until - self.wall(), cooldown_s))

    def _count(self, window: float) -> int:
        now = self.wall()
        return sum(1 for at, _ in self.state.failures if now - at <= window)

    def statistics(self, cooldown_s: float = 900.0) -> BudgetStatistics:
        """A snapshot for logs and tests."""
        now = self.wall()
        return BudgetStatistics(
            failures_10min=self._count(RECOVERY_WINDOW_S),
            failures_30min=self._count(COOLDOWN_WINDOW_S),
            requests_2min=sum(1 for t in self.state.requests if now - t <= RAPID_WINDOW_S),
            recovery_mode=self.state.recovery_mode,
            cooldown_left_s=self.cooldown_left(cooldown_s),
            persistence_error=self.persistence_error,
        )

    # ------------------------------------------------------------ changes

    def record_failure(self, reason: RestartReason, cooldown_s: float) -> Verdict:
        """Count one failure; latch recovery mode or start a cooldown when the budget says so."""
        now = self.wall()
        kept = [(at, r) for at, r in self.state.failures if now - at <= COOLDOWN_WINDOW_S]
        failures = (*kept, (now, reason))
        state = replace(self.state, failures=failures[-MAX_FAILURES:], next_reason=reason)
        in_10 = sum(1 for at, _ in failures if now - at <= RECOVERY_WINDOW_S)
        entered = in_10 > RECOVERY_AFTER and not state.recovery_mode
        if entered:
            state = replace(state, recovery_mode=True)
        cooldown = 0.0
        if len(failures) > COOLDOWN_AFTER and cooldown_s > 0:
            cooldown = cooldown_s
            state = replace(state, cooldown_until=now + cooldown_s)
        self._save(state)
        return Verdict(True, entered, cooldown)

    def record_request(self, cooldown_s: float) -> Verdict:
        """Count one requested restart: free, unless it is beyond the rapid limit."""
        now = self.wall()
        requests = (*(t for t in self.state.requests if now - t <= RAPID_WINDOW_S), now)
        self.state = replace(self.state, requests=requests[-MAX_REQUESTS:])
        if len(requests) > RAPID_AFTER:
            return self.record_failure(RestartReason.RAPID_REQUESTS, cooldown_s)
        self._save(replace(self.state, next_reason=RestartReason.REQUESTED))
        return Verdict(False)

    def repaired(self) -> None:
        """Repair passed its checks: clear the history, the latch and any cooldown."""
        self._save(BudgetState())

    def launched(self) -> None:
        """The next launch happened: its reason is spent."""
        if self.state.next_reason is not None:
            self._save(replace(self.state, next_reason=None))

    def _save(self, state: BudgetState) -> None:
        self.state = state  # memory first: the budget holds even when the disk does not
        if self.path is None:
            return
        try:
            write_private(self.path, state.to_json())
        except OSError as err:
            if self.persistence_error is None:
                log.error(
                    "persistence failed: the restart budget cannot be saved to %s (%s); "
                    "it is kept in memory until the disk takes it again",
                    self.path,
                    err.strerror or err,
                )
            self.persistence_error = f"{type(err).__name__}: {err.strerror or err}"
        else:
            if self.persistence_error is not None:
                log.info("the restart budget is saved again (%s)", self.path)
            self.persistence_error = None


@dataclass
class Backoff:
    """The wait before a restart after a failure: ``base``, doubling, capped at ``maximum``."""

    failures: int = 0

    def next_delay(self, base: float, maximum: float, *, healthy_for: float = 0.0) -> float:
        """The wait before the restart that follows one more failure.

        Args:
            base: the first wait (1 s).
            maximum: the cap (60 s).
            healthy_for: how long the gateway that failed had run healthy; STABLE_S or more
                starts the sequence over.
        """
        if healthy_for >= STABLE_S:
            self.failures = 0
        delay = min(base * 2.0 ** min(self.failures, 64), maximum)
        self.failures += 1
        return delay

    def reset(self) -> None:
        """Start over (after a repair)."""
        self.failures = 0

"""The watchdog's stages as a pure state machine: no processes, no I/O, an injected clock.

After the start grace, no healthy heartbeat for HEARTBEAT s -> relief; still
none RELIEF s later -> SIGTERM; SHUTDOWN s later -> SIGKILL.  The
supervisor (:mod:`roomkeeper.supervisor.service`) feeds it hellos, heartbeats and the
time, and carries out the actions it returns.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

from roomkeeper.config import WatchdogSettings


class Stage(enum.Enum):
    """Where one gateway stands with the watchdog."""

    STARTING = "starting"  # in the start grace, no healthy heartbeat yet
    HEALTHY = "healthy"
    RELIEF = "relief"  # heartbeats missing: relief was asked for
    TERMINATING = "terminating"  # SIGTERM sent, or the gateway is leaving on its own
    KILLED = "killed"  # SIGKILL sent to its whole tree
    CRASH_ONLY = "crash_only"  # no heartbeat capability: crash supervision only


class Action(enum.Enum):
    """What the watchdog asks the supervisor to do now."""

    RELIEF = "relief"
    SIGTERM = "sigterm"
    SIGKILL = "sigkill"


@dataclass
class Watchdog:
    """The stages for one gateway process, on an injected clock (no I/O here).

    Args:
        settings: the stage durations.
        started: when the gateway was launched (monotonic).
    """

    settings: WatchdogSettings
    started: float
    stage: Stage = Stage.STARTING
    stage_at: float = field(init=False)
    last_healthy: float | None = None
    healthy_since: float | None = None
    escalated: bool = False  # the watchdog itself went past relief
    longest_healthy: float = 0.0  # the longest unbroken healthy run that has ended

    def __post_init__(self) -> None:
        self.stage_at = self.started

    def _enter(self, stage: Stage, now: float) -> None:
        self.stage, self.stage_at = stage, now

    def hello(self, capabilities: Collection[str], now: float) -> None:
        """The gateway said hello; without ``heartbeat`` it is never killed for silence."""
        if "heartbeat" not in capabilities and self.stage is Stage.STARTING:
            self._enter(Stage.CRASH_ONLY, now)
            self.healthy_since = now

    def heartbeat(self, now: float) -> bool:
        """A healthy heartbeat; True when it ends the start grace or a relief stage."""
        if self.stage not in (Stage.STARTING, Stage.HEALTHY, Stage.RELIEF):
            return False  # too late: SIGTERM was sent, or it is leaving
        self.last_healthy = now
        if self.stage is Stage.HEALTHY:
            return False
        self._enter(Stage.HEALTHY, now)
        self.healthy_since = now
        return True

    def leaving(self, now: float) -> None:
        """The gateway is on its way out (asked to stop or restart, or sent SIGTERM by us)."""
        if self.stage is not Stage.KILLED:
            self._enter(Stage.TERMINATING, now)

    def due(self) -> float | None:
        """When :meth:`tick` next has something to do (None: never)."""
        s = self.settings
        if self.stage in (Stage.STARTING, Stage.HEALTHY):
            last = self.started if self.last_healthy is None else self.last_healthy
            return max(self.started + s.start_s, last + s.heartbeat_s)
        if self.stage is Stage.RELIEF:
            return self.stage_at + s.relief_s
        if self.stage is Stage.TERMINATING:
            return self.stage_at + s.shutdown_s
        return None

    def tick(self, now: float) -> Action | None:
        """The next stage, if its time has come."""
        due = self.due()
        if due is None or now < due:
            return None
        if self.stage in (Stage.STARTING, Stage.HEALTHY):
            if self.healthy_since is not None and self.last_healthy is not None:
                run = self.last_healthy - self.healthy_since  # healthy until its last heartbeat
                self.longest_healthy = max(self.longest_healthy, run)
            self._enter(Stage.RELIEF, now)
            self.healthy_since = None
            return Action.RELIEF
        if self.stage is Stage.RELIEF:
            self._enter(Stage.TERMINATING, now)
            self.escalated = True
            return Action.SIGTERM
        self._enter(Stage.KILLED, now)
        return Action.SIGKILL

    def healthy_for(self, now: float) -> float:
        """Its longest unbroken healthy run so far (the backoff starts over after 10 minutes)."""
        current = 0.0 if self.healthy_since is None else now - self.healthy_since
        return max(self.longest_healthy, current)

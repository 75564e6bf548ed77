"""Recovery history: what happened to the gateway, in codes and numbers only.

Seed 002: recovery history stores only allowlisted timestamps, reason codes
and numeric resource evidence, capped in count and size.  It holds no
command, argument, output, owner name or secret: an event is built from a
closed list of codes and a closed list of numeric fields, and anything else
is refused in code (:class:`HistoryEvent` raises), not filtered later.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from roomkeeper.errors import UsageError

MAX_EVENTS = 500
MAX_BYTES = 256 * 1024


class RecoveryCode(enum.Enum):
    """Why an event was recorded: the closed list."""

    GATEWAY_STARTED = "gateway_started"
    CRASH_DETECTED = "crash_detected"  # the previous run did not stop cleanly
    MARKED_UNCERTAIN = "marked_uncertain"  # work in flight at a crash, shown to a person
    DEFERRED = "deferred"  # resumable work set aside to resume with headroom
    RESUMED = "resumed"  # one deferred job started again
    ORPHANS_STOPPED = "orphans_stopped"  # managed trees of an earlier run, stopped at start
    RESOLVED = "resolved"  # a person or client resolved uncertain work
    REPAIRED = "repaired"  # a repair passed its checks: the restart budget is cleared


# Numbers only, by name: resource evidence and counts.
ALLOWED_FIELDS = frozenset(
    {
        "jobs",
        "calls",
        "pids",
        "groups",
        "used_bytes",
        "limit_bytes",
        "free_bytes",
        "uptime_s",
        "exit_code",
    }
)


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One recovery event.

    Raises:
        UsageError: a field outside the allowlist, or a value that is not a finite number.
    """

    at: float
    code: RecoveryCode
    numbers: Mapping[str, int | float]

    def __post_init__(self) -> None:
        if not isinstance(self.code, RecoveryCode):
            raise UsageError(f"history codes come from RecoveryCode (got {self.code!r})")
        for name, value in self.numbers.items():
            if name not in ALLOWED_FIELDS:
                raise UsageError(f"history field {name!r} is not allowed", name=name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UsageError(f"history field {name!r} must be a number", name=name)
            if not math.isfinite(value):
                raise UsageError(f"history field {name!r} must be finite", name=name)

    def to_json(self) -> str:
        """The stored form: timestamp, code, numbers."""
        return json.dumps({"at": self.at, "code": self.code.value, "numbers": dict(self.numbers)})

    @classmethod
    def from_json(cls, text: str) -> HistoryEvent:
        """Read a stored event back (it is checked again)."""
        data = json.loads(text)
        return cls(float(data["at"]), RecoveryCode(data["code"]), dict(data["numbers"]))

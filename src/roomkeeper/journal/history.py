"""Recovery history: what happened to the gateway, in codes and numbers only.

Recovery history stores only allowlisted timestamps, reason codes
and numeric resource evidence, capped in count and size.  It holds no
command, argument, output, owner name or secret: an event is built from a
closed list of codes and a closed list of numeric fields, and anything else
is refused in code (:class:`HistoryEvent` raises), not filtered later.

The history table's SQL lives here too, beside the caps it enforces: each
append trims the table back to ``max_events`` and :data:`MAX_BYTES` in the
same transaction.
"""

from __future__ import annotations

import enum
import json
import math
import re
import sqlite3
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from roomkeeper.errors import UsageError
from roomkeeper.journal.store import Store

MAX_EVENTS = 500
MAX_BYTES = 256 * 1024
# A Ray node's id (hex) names the node a step of the ladder was taken on: an identifier,
# never a command, an argument or a name a person chose.
NODE_ID = re.compile(r"[0-9a-f]{8,64}")

SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    at REAL NOT NULL,
    event TEXT NOT NULL
);
"""


class RecoveryCode(enum.Enum):
    """Why an event was recorded: the closed list."""

    GATEWAY_STARTED = "gateway_started"
    CRASH_DETECTED = "crash_detected"  # the previous run did not stop cleanly
    MARKED_UNCERTAIN = "marked_uncertain"  # work in flight at a crash, shown to a person
    DEFERRED = "deferred"  # resumable work set aside to resume with headroom
    RESUMED = "resumed"  # one deferred job started again
    ORPHANS_STOPPED = "orphans_stopped"  # managed trees of an earlier run, stopped at start
    RECORDS_LOST = "records_lost"  # job logs with no record: the journal lost its last writes
    RESOLVED = "resolved"  # a person or client resolved uncertain work
    REPAIRED = "repaired"  # a repair passed its checks: the restart budget is cleared
    # The relief ladder: memory pressure after admission.
    PRESSURE_HOLD = "pressure_hold"  # used crossed the line: launches held
    PRESSURE_SUSPENDED = "pressure_suspended"  # the newest suspendable tree was suspended
    PRESSURE_RESUMED = "pressure_resumed"  # a suspended tree fits again and goes on
    PRESSURE_STOPPED = "pressure_stopped"  # a tree was stopped (output kept), cooldown started
    PRESSURE_NEVER_FITS = "pressure_never_fits"  # a job alone outgrew the container: stopped
    PRESSURE_RELIEVE = "pressure_relieve"  # a lease's holder was asked to end its turn
    LEASE_RELIEVED = "lease_relieved"  # ... and used memory fell by about its share
    LEASE_NOT_RELIEVED = "lease_not_relieved"  # ... and it did not: the ladder went on
    MEMORY_NOT_GIVEN_BACK = "memory_not_given_back"  # the baseline rose across endings
    WORKSPACES_REAPED = "workspaces_reaped"  # finished jobs' trees removed to free disk
    REAP_REFUSED = "reap_refused"  # the worktree registry was unreadable: nothing removed


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
        "footprint_bytes",
        "reaction_ms",
        "trees",  # worktrees a prune removed
        "kept",  # worktrees a prune left, protected or past its low mark
        "freed_bytes",  # what a prune freed, or how far used fell after a relief
        "lease_bytes",  # what a relieved lease reserved
        "baseline_bytes",  # memory no live work explains, now
        "then_bytes",  # ... what it was, some endings before
        "share_bytes",  # ... the rise it had to pass
        "endings",  # job and lease endings between the two
    }
)


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One recovery event.

    Attributes:
        at: when (wall-clock seconds).
        code: why it was recorded.
        numbers: the allowlisted numeric evidence.
        node: the Ray node it happened on (its hex id), None for this machine.

    Raises:
        UsageError: a field outside the allowlist, a value that is not a finite number,
            or a node that is not a Ray node id.
    """

    at: float
    code: RecoveryCode
    numbers: Mapping[str, int | float]
    node: str | None = None

    def __post_init__(self) -> None:
        if self.node is not None and not NODE_ID.fullmatch(self.node):
            raise UsageError("history node must be a Ray node id (hex)", name="node")
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
        stored: dict[str, object] = {
            "at": self.at,
            "code": self.code.value,
            "numbers": dict(self.numbers),
        }
        if self.node is not None:
            stored["node"] = self.node
        return json.dumps(stored)

    @classmethod
    def from_json(cls, text: str) -> HistoryEvent:
        """Read a stored event back (it is checked again)."""
        data = json.loads(text)
        node = data.get("node")
        return cls(
            float(data["at"]),
            RecoveryCode(data["code"]),
            dict(data["numbers"]),
            None if node is None else str(node),
        )


class HistoryTable(Store):
    """The recovery history's named operations (``Journal`` has them)."""

    history_max_events: int  # set by the journal: how many events are kept (and MAX_BYTES)

    def record_history(self, event: HistoryEvent) -> Future[None]:
        """Append a recovery event, then trim the history to its caps (count and bytes)."""
        text = event.to_json()
        keep = self.history_max_events

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO history (at, event) VALUES (:at, :event)",
                {"at": event.at, "event": text},
            )
            conn.execute(
                "DELETE FROM history WHERE rowid NOT IN "
                "(SELECT rowid FROM history ORDER BY rowid DESC LIMIT :keep)",
                {"keep": keep},
            )
            _trim_to_bytes(conn, MAX_BYTES)

        return self.submit(write)

    def history(self, limit: int = MAX_EVENTS) -> list[HistoryEvent]:
        """Recovery events, newest first."""
        sql = "SELECT event FROM history ORDER BY rowid DESC LIMIT :limit"
        return self._read(
            lambda conn: [HistoryEvent.from_json(r[0]) for r in conn.execute(sql, {"limit": limit})]
        )


def _trim_to_bytes(conn: sqlite3.Connection, max_bytes: int) -> None:
    """Delete the oldest events until the rest fit in ``max_bytes``."""
    total = conn.execute("SELECT coalesce(sum(length(event)), 0) FROM history").fetchone()
    excess = int(total[0]) - max_bytes
    while excess > 0:
        oldest = conn.execute(
            "SELECT rowid, length(event) FROM history ORDER BY rowid LIMIT 1"
        ).fetchone()
        if oldest is None:
            break
        conn.execute("DELETE FROM history WHERE rowid = :rowid", {"rowid": oldest[0]})
        excess -= int(oldest[1])

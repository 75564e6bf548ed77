"""The leases' table and their state changes (``lease_events``).

A lease's row is rewritten at each grant, heartbeat and end, with the change
appended beside it in the same transaction.  A restart reads back the leases
still within their ttl; the others are expired.
"""

from __future__ import annotations

import json
import sqlite3
import time
from concurrent.futures import Future
from dataclasses import dataclass

from roomkeeper.guard.leases import LeaseView
from roomkeeper.journal.store import Store
from roomkeeper.loopback.hooks import HOOK_DUE, ReleaseHook

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    state TEXT NOT NULL,
    memory_bytes INTEGER NOT NULL,
    disk_bytes INTEGER NOT NULL,
    ttl_s REAL NOT NULL,
    granted_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    ended_at REAL,
    release TEXT,
    hook_outcome TEXT,
    relieve TEXT,
    relieve_outcome TEXT
);
CREATE TABLE IF NOT EXISTS lease_events (
    lease_id TEXT NOT NULL,
    state TEXT NOT NULL,
    at REAL NOT NULL
);
"""

# Added after the table first shipped: ``database.migrate`` adds them to an older file.
ADDED_COLUMNS = (
    ("leases", "relieve", "TEXT"),
    ("leases", "relieve_outcome", "TEXT"),
)

_UPSERT = """
INSERT INTO leases (
    id, owner, state, memory_bytes, disk_bytes, ttl_s, granted_at, expires_at, ended_at,
    release, hook_outcome, relieve, relieve_outcome
) VALUES (
    :id, :owner, :state, :memory_bytes, :disk_bytes, :ttl_s, :granted_at, :expires_at,
    :ended_at, :release, :hook_outcome, :relieve, :relieve_outcome
)
ON CONFLICT (id) DO UPDATE SET
    state = excluded.state, ttl_s = excluded.ttl_s, expires_at = excluded.expires_at,
    ended_at = excluded.ended_at, hook_outcome = excluded.hook_outcome
"""
# A relief's outcome is written by record_relieve alone: a lease's own change, taken before
# the ask and written after it, must never put the ask back to nothing.


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A granted lease as the journal keeps it; no disk or memory is stored as 0."""

    id: str
    owner: str
    memory_bytes: int
    disk_bytes: int
    ttl_s: float
    granted_at: float
    expires_at: float
    release: ReleaseHook | None
    relieve: ReleaseHook | None = None
    relieve_outcome: str | None = None


def _hook_json(hook: ReleaseHook | None) -> str | None:
    return json.dumps(hook.to_json()) if hook else None


def _hook_of(text: str | None) -> ReleaseHook | None:
    if not text:
        return None
    value = json.loads(text)
    return ReleaseHook(value["method"], value["url"])


class LeasesTable(Store):
    """The leases' named operations (``Journal`` has them)."""

    def record_lease(self, lease: LeaseView) -> Future[None]:
        """The lease's latest state change and its row as it stands now, in one transaction."""
        at = time.time()
        row = {
            "id": lease.id,
            "owner": lease.owner,
            "state": lease.state.value,
            "memory_bytes": lease.memory_bytes or 0,
            "disk_bytes": lease.disk_bytes or 0,
            "ttl_s": lease.ttl_s,
            "granted_at": lease.granted_at,
            "expires_at": lease.expires_at,
            "ended_at": lease.ended_at,
            "release": _hook_json(lease.release),
            "hook_outcome": lease.hook_outcome,
            "relieve": _hook_json(lease.relieve),
            "relieve_outcome": lease.relieve_outcome,
        }

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO lease_events (lease_id, state, at) VALUES (:id, :state, :at)",
                {"id": lease.id, "state": lease.state.value, "at": at},
            )
            conn.execute(_UPSERT, row)

        return self.submit(write)

    def record_relieve(self, lease_id: str, outcome: str) -> Future[bool]:
        """How a lease's relief stands (``asked``, then its outcome), and nothing else of the
        row: the lease's state is written by its own changes, never overwritten from here.
        The future says whether the lease's row was there to take it."""

        def write(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE leases SET relieve_outcome = :outcome WHERE id = :id",
                {"id": lease_id, "outcome": outcome},
            )
            return cursor.rowcount == 1

        return self.submit(write)

    def expire_leases(self, *, now: float) -> Future[None]:
        """Every granted lease past its ttl at ``now`` is expired, ended at ``now``; its
        release hook, if it has one, is due."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE leases SET state = 'expired', ended_at = :now, "
                "hook_outcome = CASE WHEN release IS NULL THEN hook_outcome ELSE :due END "
                "WHERE state = 'granted' AND expires_at <= :now",
                {"now": now, "due": HOOK_DUE},
            )

        return self.submit(write)

    def leases_with_hooks_due(self) -> list[tuple[str, ReleaseHook]]:
        """Ended leases whose release hook was saved as due and has no outcome yet."""
        sql = "SELECT id, release FROM leases WHERE hook_outcome = :due AND release IS NOT NULL"

        def read(conn: sqlite3.Connection) -> list[tuple[str, ReleaseHook]]:
            found = []
            for row in conn.execute(sql, {"due": HOOK_DUE}):
                release = json.loads(row["release"])
                found.append((row["id"], ReleaseHook(release["method"], release["url"])))
            return found

        return self._read(read)

    def settle_lease_hook(self, lease_id: str, outcome: str) -> Future[None]:
        """Record how a due release hook went."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE leases SET hook_outcome = :outcome WHERE id = :id",
                {"id": lease_id, "outcome": outcome},
            )

        return self.submit(write)

    def live_leases(self, *, now: float) -> list[LeaseRow]:
        """The granted leases still within their ttl at ``now``."""
        sql = "SELECT * FROM leases WHERE state = 'granted' AND expires_at > :now"
        return self._read(lambda conn: [_lease_row(r) for r in conn.execute(sql, {"now": now})])


def _lease_row(row: sqlite3.Row) -> LeaseRow:
    return LeaseRow(
        id=row["id"],
        owner=row["owner"],
        memory_bytes=row["memory_bytes"],
        disk_bytes=row["disk_bytes"],
        ttl_s=row["ttl_s"],
        granted_at=row["granted_at"],
        expires_at=row["expires_at"],
        release=_hook_of(row["release"]),
        relieve=_hook_of(row["relieve"]),
        relieve_outcome=row["relieve_outcome"],
    )

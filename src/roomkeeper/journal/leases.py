"""The leases' table and their state changes (``lease_events``).

A lease's row is written at its grant and rewritten at each heartbeat and end;
a change of its state (granted, then how it ended) is appended beside it in the
same transaction, a heartbeat is not, so the events stay as few as the leases.
A lease id is granted once, ever: the row of a grant is made only where no row
has that id, and only the grant that made a row rewrites it.  A restart reads
back the leases still within their ttl; the others are expired.

The row has one column per field of the lease (:data:`~roomkeeper.guard.leases.LEASE_FIELDS`,
its own and its terms'), written and read by name: a new field is its column here
(in :data:`SCHEMA` and, for older files, :data:`ADDED_COLUMNS`), nothing else.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import time
import types
import typing
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import LEASE_FIELDS, LeaseView, lease_fields, lease_of
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
    relieve_outcome TEXT,
    session TEXT,
    kind TEXT
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
    ("leases", "session", "TEXT"),
    ("leases", "kind", "TEXT"),
)

# Every field is written when the row is first made; a later change of the lease rewrites
# only what changes over its life, and only the same grant's row (its grant time): a new
# grant of an id seen before changes nothing, and is told so (no row written).  An ended
# lease is never made granted again: a save of an older state, retried after a newer one
# landed, changes nothing.  A relief's outcome is written by record_relieve alone: a lease's
# own change, taken before the ask and written after it, must never put the ask back to
# nothing.
_UPSERT = f"""
INSERT INTO leases ({", ".join(LEASE_FIELDS)})
VALUES ({", ".join(f":{name}" for name in LEASE_FIELDS)})
ON CONFLICT (id) DO UPDATE SET
    state = excluded.state, ttl_s = excluded.ttl_s, expires_at = excluded.expires_at,
    ended_at = excluded.ended_at, hook_outcome = excluded.hook_outcome
WHERE leases.granted_at = excluded.granted_at AND leases.owner = excluded.owner
    AND (leases.state = 'granted' OR excluded.state != 'granted')
"""


# Columns declared NOT NULL that keep a field's None as 0.  Read back, a disk of 0 is None
# again (a restored lease reserves no disk); memory is what the lease reserves, so 0 stays 0.
_NONE_AS_ZERO = ("memory_bytes", "disk_bytes")
_ZERO_AS_NONE = ("disk_bytes",)


def _hook_json(hook: ReleaseHook | None) -> str | None:
    return json.dumps(hook.to_json()) if hook else None


def _hook_of(text: str | None) -> ReleaseHook | None:
    if not text:
        return None
    value = json.loads(text)
    return ReleaseHook(value["method"], value["url"])


def _column(value: Any) -> Any:
    """A field's value as its column keeps it: a hook as its JSON, a state as its word."""
    if isinstance(value, ReleaseHook):
        return _hook_json(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value


def lease_columns(lease: LeaseView) -> dict[str, Any]:
    """The lease's row: each of its fields by name, as its column keeps it."""
    row = {name: _column(value) for name, value in lease_fields(lease).items()}
    return row | {name: row[name] or 0 for name in _NONE_AS_ZERO}


def _reader(kind: Any) -> Callable[[Any], Any]:
    """How a column reads back as a field declared ``kind`` (``X`` or ``X | None``)."""
    found = [k for k in typing.get_args(kind) if k is not types.NoneType] or [kind]
    declared = found[0] if len(found) == 1 else None
    if declared is ReleaseHook:
        return _hook_of
    if isinstance(declared, type) and issubclass(declared, enum.Enum):
        return lambda value: None if value is None else declared(value)
    return lambda value: value


# Each field's reader, from its declared type: a new field needs no line here.
_READERS = {
    name: _reader(kind)
    for record in (LeaseView, LeaseTerms)
    for name, kind in typing.get_type_hints(record).items()
    if name in LEASE_FIELDS
}


def lease_of_row(row: sqlite3.Row) -> LeaseView:
    """The lease a row keeps (:func:`lease_columns` undone)."""
    values = {name: _READERS[name](row[name]) for name in LEASE_FIELDS}
    return lease_of(values | {name: values[name] or None for name in _ZERO_AS_NONE})


class LeasesTable(Store):
    """The leases' named operations (``Journal`` has them)."""

    def record_lease(self, lease: LeaseView) -> Future[bool]:
        """The lease's row as it stands now, and its state change if it is one, in one
        transaction.  The future says whether the row was written: False when the id
        belongs to another grant, which is never changed from here."""
        at = time.time()
        row = lease_columns(lease)

        def write(conn: sqlite3.Connection) -> bool:
            was = conn.execute("SELECT state FROM leases WHERE id = :id", row).fetchone()
            if conn.execute(_UPSERT, row).rowcount != 1:
                return False
            if was is None or was[0] != row["state"]:  # a heartbeat is no state change
                conn.execute(
                    "INSERT INTO lease_events (lease_id, state, at) VALUES (:id, :state, :at)",
                    {"id": lease.id, "state": row["state"], "at": at},
                )
            return True

        return self.submit(write)

    def lease_seen(self, lease_id: str) -> LeaseView | None:
        """The lease with this id as the journal keeps it, live or ended; None if none had it."""
        sql = "SELECT * FROM leases WHERE id = :id"

        def read(conn: sqlite3.Connection) -> LeaseView | None:
            row = conn.execute(sql, {"id": lease_id}).fetchone()
            return None if row is None else lease_of_row(row)

        return self._read(read)

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

    def expire_leases(self, *, now: float) -> Future[list[tuple[str, ReleaseHook]]]:
        """Every granted lease past its ttl at ``now`` is expired, ended at ``now``; its
        release hook, if it has one, is due.  The future holds those hooks, by lease id."""
        args = {"now": now, "due": HOOK_DUE}
        past = "state = 'granted' AND expires_at <= :now"

        def write(conn: sqlite3.Connection) -> list[tuple[str, ReleaseHook]]:
            sql = f"SELECT id, release FROM leases WHERE {past} AND release IS NOT NULL"
            due = [(row[0], _hook_of(row[1])) for row in conn.execute(sql, args)]
            conn.execute(
                "UPDATE leases SET state = 'expired', ended_at = :now, "
                "hook_outcome = CASE WHEN release IS NULL THEN hook_outcome ELSE :due END "
                f"WHERE {past}",
                args,
            )
            return [(lease_id, hook) for lease_id, hook in due if hook is not None]

        return self.submit(write)

    def forget_lease_grant(self, lease_id: str, *, granted_at: float) -> Future[bool]:
        """Take back the row of a grant that was answered as not granted (its save came too
        late): that grant's row and its events go, while it is still granted; the id may be
        granted afresh.  The future says whether a row went."""

        def write(conn: sqlite3.Connection) -> bool:
            gone = conn.execute(
                "DELETE FROM leases WHERE id = :id AND granted_at = :at AND state = 'granted'",
                {"id": lease_id, "at": granted_at},
            ).rowcount
            if gone:
                conn.execute("DELETE FROM lease_events WHERE lease_id = :id", {"id": lease_id})
            return gone == 1

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

    def live_leases(self, *, now: float) -> list[LeaseView]:
        """The granted leases still within their ttl at ``now``, whole."""
        sql = "SELECT * FROM leases WHERE state = 'granted' AND expires_at > :now"
        return self._read(lambda conn: [lease_of_row(r) for r in conn.execute(sql, {"now": now})])

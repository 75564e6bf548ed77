"""The pending markers: one row per job launch or registered call whose outcome is not saved.

Save first: a side-effecting piece of work gets a durable marker
before it is dispatched, and only a persisted outcome clears it, in the same
transaction as the outcome itself.  So the only callers of :func:`clear` are
the jobs' and calls' outcome operations (``journal.jobs``, ``journal.calls``),
each inside its own write; no one outside the journal can clear a marker on
its own.  After a crash, a marker still present means the work's effect is
unknown.
"""

from __future__ import annotations

import enum
import sqlite3


class MarkerKind(enum.Enum):
    """What a marker stands for."""

    JOB = "job"  # a launched job
    CALL = "call"  # a client's registered call


SCHEMA = """
CREATE TABLE IF NOT EXISTS markers (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (kind, id)
);
"""


def mark(conn: sqlite3.Connection, kind: MarkerKind, work_id: str, *, at: float) -> None:
    """Write (or renew) the work's marker, inside the caller's transaction."""
    conn.execute(
        "INSERT OR REPLACE INTO markers (kind, id, created_at) VALUES (:kind, :id, :at)",
        {"kind": kind.value, "id": work_id, "at": at},
    )


def clear(conn: sqlite3.Connection, kind: MarkerKind, work_id: str) -> None:
    """Retire the work's marker, inside the transaction that saves its outcome."""
    conn.execute(
        "DELETE FROM markers WHERE kind = :kind AND id = :id", {"kind": kind.value, "id": work_id}
    )


def marked(conn: sqlite3.Connection, kind: MarkerKind) -> set[str]:
    """The ids of the work of that kind whose marker is still there."""
    rows = conn.execute("SELECT id FROM markers WHERE kind = :kind", {"kind": kind.value})
    return {row[0] for row in rows}


def is_marked(conn: sqlite3.Connection, kind: MarkerKind, work_id: str) -> bool:
    """Whether that one piece of work still has its marker."""
    row = conn.execute(
        "SELECT 1 FROM markers WHERE kind = :kind AND id = :id",
        {"kind": kind.value, "id": work_id},
    ).fetchone()
    return row is not None

"""The registered calls' table and their pending markers.

A call is written with its marker in one transaction, and only a saved
outcome ends the marker, in the transaction that saves it (save
first).  States are stored as their text (``pending``, ``succeeded``, …);
what they mean is the gateway's (``roomkeeper.gateway.calls``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from roomkeeper.journal.markers import MarkerKind, clear, is_marked, mark, marked
from roomkeeper.journal.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    owner TEXT NOT NULL,
    resumable INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    numbers TEXT,
    error TEXT
);
"""


@dataclass(frozen=True, slots=True)
class CallRow:
    """A registered call as the journal keeps it, and whether its marker is still there."""

    id: str
    kind: str
    owner: str
    resumable: bool
    state: str
    created_at: float
    ended_at: float | None
    numbers: Mapping[str, float]
    error: str | None
    pending_marker: bool


class CallsTable(Store):
    """The registered calls' named operations (``Journal`` has them)."""

    # ------------------------------------------------------------- writing

    def register_call(
        self, call_id: str, *, kind: str, owner: str, resumable: bool, at: float
    ) -> Future[None]:
        """A new pending call and its marker, in one transaction."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO calls (id, kind, owner, resumable, state, created_at) "
                "VALUES (:id, :kind, :owner, :resumable, 'pending', :at)",
                {
                    "id": call_id,
                    "kind": kind,
                    "owner": owner,
                    "resumable": int(resumable),
                    "at": at,
                },
            )
            mark(conn, MarkerKind.CALL, call_id, at=at)

        return self.submit(write)

    def cancel_call(self, call_id: str, *, at: float) -> Future[None]:
        """Cancel the call if it is still pending; its marker stays: what it did is unknown."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE calls SET state = 'cancelled', ended_at = :at "
                "WHERE id = :id AND state = 'pending'",
                {"at": at, "id": call_id},
            )

        return self.submit(write)

    def rerun_call(self, call_id: str, *, at: float) -> Future[None]:
        """The call is pending again, under a fresh marker."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE calls SET state = 'pending', ended_at = NULL WHERE id = :id",
                {"id": call_id},
            )
            mark(conn, MarkerKind.CALL, call_id, at=at)

        return self.submit(write)

    def settle_call(
        self,
        call_id: str,
        *,
        state: str,
        numbers: Mapping[str, float] | None,
        error: str | None,
        only_from: Sequence[str],
        at: float,
    ) -> Future[bool]:
        """Save the call's outcome and end its marker; False (nothing saved) if its state moved."""
        allowed = {f"from{i}": s for i, s in enumerate(only_from)}
        sql = (
            "UPDATE calls SET state = :state, ended_at = :at, numbers = :numbers, error = :error "
            f"WHERE id = :id AND state IN ({', '.join(':' + name for name in allowed)})"
        )
        args = {
            "state": state,
            "at": at,
            "numbers": json.dumps(dict(numbers or {})),
            "error": error,
            "id": call_id,
            **allowed,
        }

        def write(conn: sqlite3.Connection) -> bool:
            changed = conn.execute(sql, args).rowcount
            if changed:  # the outcome is saved in this same transaction
                clear(conn, MarkerKind.CALL, call_id)
            return bool(changed)

        return self.submit(write)

    def forget_call(self, call_id: str) -> Future[bool]:
        """Delete a call whose outcome is saved (succeeded or failed, its marker gone); False
        (nothing deleted) for any other."""

        def write(conn: sqlite3.Connection) -> bool:
            if is_marked(conn, MarkerKind.CALL, call_id):
                return False
            return bool(
                conn.execute(
                    "DELETE FROM calls WHERE id = :id AND state IN ('succeeded', 'failed')",
                    {"id": call_id},
                ).rowcount
            )

        return self.submit(write)

    def mark_calls_uncertain(self) -> Future[int]:
        """After a crash every pending call is uncertain, its marker kept; how many were."""

        def write(conn: sqlite3.Connection) -> int:
            sql = "UPDATE calls SET state = 'uncertain' WHERE state = 'pending'"
            return conn.execute(sql).rowcount

        return self.submit(write)

    # ------------------------------------------------------------- reading

    def call(self, call_id: str) -> CallRow | None:
        """One call by id."""

        def read(conn: sqlite3.Connection) -> CallRow | None:
            row = conn.execute("SELECT * FROM calls WHERE id = :id", {"id": call_id}).fetchone()
            if row is None:
                return None
            return _call_row(row, is_marked(conn, MarkerKind.CALL, call_id))

        return self._read(read)

    def calls(self, *, state: str | None = None, limit: int = 500) -> list[CallRow]:
        """Calls, newest first, optionally in one state."""
        sql = "SELECT * FROM calls"
        if state is not None:
            sql += " WHERE state = :state"
        sql += " ORDER BY created_at DESC LIMIT :limit"

        def read(conn: sqlite3.Connection) -> list[CallRow]:
            rows = conn.execute(sql, {"state": state, "limit": limit}).fetchall()
            pending = marked(conn, MarkerKind.CALL)
            return [_call_row(r, r["id"] in pending) for r in rows]

        return self._read(read)

    def uncertain_calls(self) -> int:
        """How many calls are uncertain (pending at a crash, not resolved yet)."""
        sql = "SELECT count(*) FROM calls WHERE state = 'uncertain'"
        return self._read(lambda conn: int(conn.execute(sql).fetchone()[0]))


def _call_row(row: sqlite3.Row, pending_marker: bool) -> CallRow:
    return CallRow(
        id=row["id"],
        kind=row["kind"],
        owner=row["owner"],
        resumable=bool(row["resumable"]),
        state=row["state"],
        created_at=row["created_at"],
        ended_at=row["ended_at"],
        numbers=json.loads(row["numbers"]) if row["numbers"] else {},
        error=row["error"],
        pending_marker=pending_marker,
    )

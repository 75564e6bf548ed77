"""The learned-sizes table: the last peaks of each kind of job, under its key only.

A row is a key (``kind:<name>`` or ``sha256:<hex>``, from
:func:`roomkeeper.jobs.sizes.size_key`, or ``shape:<hex>``, from
:func:`~roomkeeper.jobs.sizes.shape_key`), one ended run's peak in bytes and
when it was recorded: never the command, its arguments or its directory.
A peak that is not a whole number of bytes (a row damaged by hand or by a
disk) is left out of every read: it teaches nothing, and fails nothing.
Each record trims its key back to :data:`~roomkeeper.jobs.sizes.LAST_RUNS`
rows and the table to :data:`MAX_ROWS`, in the same transaction, so the
table stays small however many kinds of work pass through.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from concurrent.futures import Future

from roomkeeper.jobs.sizes import LAST_RUNS
from roomkeeper.journal.store import Store

MAX_ROWS = 50_000  # every key's last runs; the oldest rows go first beyond this

SCHEMA = """
CREATE TABLE IF NOT EXISTS learned_sizes (
    key TEXT NOT NULL,
    peak_bytes INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS learned_sizes_key ON learned_sizes (key);
"""

_LAST = "SELECT rowid FROM learned_sizes WHERE key = :key ORDER BY rowid DESC LIMIT :keep"
_SOUND = "typeof(peak_bytes) = 'integer' AND peak_bytes >= 0"  # what a damaged row is not


class SizesTable(Store):
    """The learned sizes' named operations (``Journal`` has them)."""

    def record_peak(self, key: str, peak_bytes: int) -> Future[None]:
        """Keep one ended run's peak under ``key``; only its last LAST_RUNS are kept."""
        return self.record_peaks([(key, peak_bytes)])

    def record_peaks(self, peaks: Sequence[tuple[str, int]]) -> Future[None]:
        """Keep ended runs' peaks, oldest first, in one transaction; each key they name is
        trimmed back to its last LAST_RUNS once, and the table to MAX_ROWS once."""
        at = time.time()
        rows = [{"key": key, "peak": max(0, int(peak)), "at": at} for key, peak in peaks]
        keys = list(dict.fromkeys(key for key, _ in peaks))

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO learned_sizes (key, peak_bytes, at) VALUES (:key, :peak, :at)", rows
            )
            conn.executemany(
                f"DELETE FROM learned_sizes WHERE key = :key AND rowid NOT IN ({_LAST})",
                [{"key": key, "keep": LAST_RUNS} for key in keys],
            )
            conn.execute(
                "DELETE FROM learned_sizes WHERE rowid <= "
                "(SELECT max(rowid) FROM learned_sizes) - :max_rows",
                {"max_rows": MAX_ROWS},
            )

        return self.submit(write)

    def learned_size(self, key: str) -> int | None:
        """The maximum of the last LAST_RUNS peaks under ``key``; None when none is kept."""
        sql = f"SELECT max(peak_bytes) FROM learned_sizes WHERE rowid IN ({_LAST}) AND {_SOUND}"

        def read(conn: sqlite3.Connection) -> int | None:
            value = conn.execute(sql, {"key": key, "keep": LAST_RUNS}).fetchone()[0]
            return None if value is None else int(value)

        return self._read(read)

    def recent_peaks(self, key: str) -> list[int]:
        """The last LAST_RUNS peaks under ``key``, newest first; empty when none is kept."""
        sql = (
            f"SELECT peak_bytes FROM learned_sizes WHERE rowid IN ({_LAST}) AND {_SOUND} "
            "ORDER BY rowid DESC"
        )

        def read(conn: sqlite3.Connection) -> list[int]:
            rows = conn.execute(sql, {"key": key, "keep": LAST_RUNS}).fetchall()
            return [int(row[0]) for row in rows]

        return self._read(read)

"""Is the journal whole, and what can be saved from one that is not.

A journal can be damaged by what happens to its disk: a file cut short, a
page overwritten, a WAL file half written when the machine lost power.  SQLite
then answers "database disk image is malformed" to some queries and not to
others, so a gateway that opened it would serve some records and lose the
rest without a word.  :func:`check_journal` is the bounded check every open
runs (SQLite's ``quick_check``, at most :data:`MAX_PROBLEMS` problems listed);
:func:`recover_journal` saves what can still be read into a new file and keeps
the damaged one beside it, under a name that says when it was set aside.

Recovery reads each table row by row in rowid order, forwards until the first
page it cannot read and then backwards from the end to the same damage, so a
damaged page costs the rows on it (a damaged inner page, the rows below it).
The rows in between are counted from the rowids on either side: every table
of the journal is appended to, so its rowids are dense and the gap is a fair
count of what was lost.  (The ``sqlite3`` shell's ``.recover`` reads pages
directly and can save more, but it is an optional package and Debian 12's
build of it fails on every file with "SQL logic error".)
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from roomkeeper.errors import RoomkeeperError

_T = TypeVar("_T")
MAX_PROBLEMS = 10  # quick_check stops listing after this many
ALL_TABLES = "*"  # in a report's ``lost``: the list of tables itself was unreadable
SIDE_FILES = ("-wal", "-shm")  # SQLite finds them by the database's own name


class JournalDamagedError(RoomkeeperError):
    """The journal file cannot be trusted; the message names it and the command that helps."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = Path(path)
        self.problems = problems
        shown = "; ".join(problems[:3]) + (" …" if len(problems) > 3 else "")
        super().__init__(
            f"the journal {self.path} is damaged ({shown}); nothing was changed. "
            f"Stop roomkeeper, then run `roomkeeper journal recover` to save what can be read "
            f"into a new journal (the damaged file is kept beside it)"
        )


# What SQLite says of a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB), as its messages word it.
DAMAGE_WORDS = ("malformed", "not a database", "corrupt")


def is_damage(error: BaseException | str) -> bool:
    """Whether a journal error says the file is damaged (not the disk full, not a lock)."""
    text = str(error).lower()
    return any(word in text for word in DAMAGE_WORDS)


def _problems_of(conn: sqlite3.Connection) -> list[str]:
    rows = [str(row[0]) for row in conn.execute(f"PRAGMA quick_check({MAX_PROBLEMS})")]
    if rows == ["ok"]:
        return []
    # One problem a line, without SQLite's "*** in database main ***" headings.
    lines = (line.strip() for row in rows for line in row.splitlines())
    return [line for line in lines if line and not line.startswith("***")]


def read_only(path: Path | str) -> sqlite3.Connection:
    """A connection that writes nothing, not even SQLite's shared-memory file.

    With writes in a WAL beside the file (a crash, or a gateway running) SQLite
    must read it, through its index; without (no WAL, or an empty one) the file
    is all there is, and ``immutable`` opens it without the ``-shm`` file a full
    disk cannot take.
    """
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    holds_writes = wal.exists() and wal.stat().st_size > 0 and shm.exists()
    mode = "mode=ro" if holds_writes else "immutable=1"
    return sqlite3.connect(f"file:{path}?{mode}", uri=True, check_same_thread=False, timeout=30)


def _ro(path: Path | str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def _read(path: Path | str, query: Callable[[sqlite3.Connection], _T]) -> _T:
    """``query`` on a read-only connection (closed afterwards); where the disk cannot take
    the ``-shm`` file such a read needs, on the file alone (any writer is stopped then, or
    could not write either).

    Raises:
        sqlite3.DatabaseError: what the query raised (damage from the first try at once).
    """
    try:
        with contextlib.closing(_ro(path)) as conn:
            return query(conn)
    except sqlite3.OperationalError as err:
        if is_damage(err):
            raise
    with contextlib.closing(read_only(path)) as conn:
        return query(conn)


def job_ids_in(path: Path | str) -> set[str]:
    """The job ids a journal file holds, read without writing (empty before any job)."""

    def ids(conn: sqlite3.Connection) -> set[str]:
        try:
            return {str(row[0]) for row in conn.execute("SELECT id FROM jobs")}
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return set()  # no job yet
            raise

    try:
        return _read(path, ids)
    except sqlite3.Error:
        return set()


def check_journal(path: Path | str) -> list[str]:
    """What is wrong with the journal at ``path``; empty when it is whole or not there yet.

    Reads only: a WAL left by a crash is read as SQLite reads it, not merged.
    The time it takes grows with the file (tens of milliseconds for a journal
    of thousands of jobs); the list is bounded at :data:`MAX_PROBLEMS`.

    Raises:
        sqlite3.OperationalError: the disk, an I/O error or a lock, not the file's fault.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return []
    try:
        return _read(path, _problems_of)
    except sqlite3.OperationalError as err:
        if not is_damage(err):
            raise
        return [str(err)]
    except sqlite3.DatabaseError as err:  # "file is not a database", "malformed"
        return [str(err)]


@dataclass
class RecoveryReport:
    """What :func:`recover_journal` did: the rows saved per table, and where the damage went.

    Attributes:
        journal: the new journal, at the original path.
        damaged: where the damaged file (and its WAL, if any) now lies.
        saved: rows in the new journal, per table.
        lost: per table that could not be read whole, about how many rows were lost
            (the rowid gap across the damage); None where no row past it could be read.
            :data:`ALL_TABLES` when not even the list of tables could be read.
    """

    journal: Path
    damaged: Path
    saved: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int | None] = field(default_factory=dict)


def _set_aside(path: Path) -> Path:
    """Move the damaged file and its side files to ``<name>.damaged-<UTC time>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.replace(path, aside)
    for suffix in SIDE_FILES:
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{aside}{suffix}"))
    return aside


def _tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return [str(row[0]) for row in rows]


def _count(conn: sqlite3.Connection, table: str) -> int | None:
    try:
        return int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
    except sqlite3.DatabaseError:
        return None


def _copy_rows(
    source: sqlite3.Connection, target: sqlite3.Connection, table: str, order: str
) -> tuple[int | None, bool]:
    """Copy ``table``'s rows in ``order`` of rowid until the first unreadable page.

    Returns the last rowid copied (None: none) and whether the table was read to its end.
    """
    last: int | None = None
    try:
        cursor = source.execute(f'SELECT rowid, * FROM "{table}" ORDER BY rowid {order}')
        names = [d[0] for d in cursor.description][1:]
        placeholders = ", ".join("?" for _ in names)
        columns = ", ".join(f'"{n}"' for n in names)
        for row in cursor:
            target.execute(
                f'INSERT OR IGNORE INTO "{table}" (rowid, {columns}) VALUES (?, {placeholders})',
                tuple(row),
            )
            last = int(row[0])
    except sqlite3.DatabaseError:
        return last, False
    return last, True


def _salvage(damaged: Path, target: Path, schema: str) -> dict[str, int | None]:
    """Read each table forwards, then backwards up to the damage; about how many rows each
    table cut short lost (None: unknown)."""
    lost: dict[str, int | None] = {}
    source = _ro(damaged)
    out = sqlite3.connect(target, isolation_level=None)
    try:
        out.executescript(schema)
        out.execute("BEGIN")
        try:
            tables = _tables(source)
        except sqlite3.DatabaseError:
            # Without its list of tables no row can be found: the new journal starts empty.
            tables = []
            lost[ALL_TABLES] = None
        for table in tables:
            forward, whole = _copy_rows(source, out, table, "ASC")
            if whole:
                continue
            backward, _ = _copy_rows(source, out, table, "DESC")
            if forward is not None and backward is not None and backward > forward:
                lost[table] = backward - forward - 1
            else:
                lost[table] = None
        out.execute("COMMIT")
    finally:
        source.close()
        out.close()
    return lost


def recover_journal(path: Path | str, schema: str) -> RecoveryReport:
    """Save what can be read of the journal at ``path`` into a new journal at ``path``.

    The damaged file is moved aside first (with its WAL, which holds the
    newest writes), so nothing is overwritten; the new file gets ``schema``
    on top of what was recovered, so every table the gateway needs exists.

    Raises:
        RoomkeeperError: there is no journal at ``path``, or recovery could not write.
    """
    path = Path(path)
    if not path.exists():
        raise RoomkeeperError(f"there is no journal at {path}: nothing to recover")
    damaged = _set_aside(path)
    try:
        lost = _salvage(damaged, path, schema)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            saved = {table: _count(conn, table) or 0 for table in _tables(conn)}
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
    except BaseException:
        # Put the damaged file back rather than leave a half-made journal in its place.
        with contextlib.suppress(OSError):
            path.unlink()
        os.replace(damaged, path)
        for suffix in SIDE_FILES:
            with contextlib.suppress(OSError):
                os.replace(Path(f"{damaged}{suffix}"), Path(f"{path}{suffix}"))
        raise
    os.chmod(path, 0o600)
    return RecoveryReport(journal=path, damaged=damaged, saved=saved, lost=lost)

"""The journal: SQLite in WAL mode, ``synchronous=FULL``, at ROOMKEEPER_HOME/journal.db.

Jobs, leases and every state change survive a restart of the gateway.  All
writes go through one writer thread that commits whatever has queued up in
one transaction (group commit): each caller gets a future that resolves
once its write is durable, so nothing on the event loop ever waits on
``fsync``.  Reads use one connection per reading thread (WAL lets them run beside
the writer); the gateway makes them off its event loop.

This module is that core.  Each table's schema, SQL and named operations
live in its own module (``jobs``, ``leases``, ``markers``, ``calls``,
``history``, ``worktrees``, ``sizes``); :class:`Journal` gathers them, so a
caller says what it means (``journal.settle_call(...)``) and never writes SQL.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from roomkeeper.journal import calls, history, jobs, leases, markers, sizes, worktrees
from roomkeeper.journal.calls import CallsTable
from roomkeeper.journal.history import MAX_EVENTS, HistoryTable
from roomkeeper.journal.integrity import JournalDamagedError, check_journal, is_damage, read_only
from roomkeeper.journal.jobs import JobsTable
from roomkeeper.journal.leases import LeasesTable
from roomkeeper.journal.lock import hold_shared, let_go
from roomkeeper.journal.sizes import SizesTable
from roomkeeper.journal.worktrees import WorktreesTable

log = logging.getLogger("roomkeeper")

_T = TypeVar("_T")
_GROUP_MAX = 512  # writes per transaction at most
REOPEN_EVERY_S = 2.0  # a journal read-only for want of space tries to write again this often
NO_SPACE_BYTES = 64 * 1024  # below this free, a disk counts as full

# Each table's schema lives with its SQL, in its own module.  A table added later
# (worktrees, sizes) is its own migration: CREATE TABLE IF NOT EXISTS on open.
SCHEMA = "".join(m.SCHEMA for m in (jobs, leases, markers, calls, history, worktrees, sizes))
# Columns added to a table after it first shipped: (table, column, its declaration).
# CREATE TABLE IF NOT EXISTS leaves an older file's table as it was; these bring it up.
MIGRATIONS: tuple[tuple[str, str, str], ...] = (
    jobs.ADDED_COLUMNS + leases.ADDED_COLUMNS + worktrees.ADDED_COLUMNS
)


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Add each column of :data:`MIGRATIONS` an older journal lacks; the ``table.column``s added.

    Idempotent: a column already there is left alone, so every open runs it.
    """
    added = []
    for table, column, declaration in MIGRATIONS:
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            added.append(f"{table}.{column}")
    return added


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # durable at every commit (save first)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _no_space_said(err: BaseException) -> str:
    """Why the journal cannot save, when its disk is full."""
    return f"{err}: no space left on the journal's disk"


def _no_space(path: Path) -> bool:
    """Whether the disk under ``path`` is full (less than a few pages free)."""
    try:
        found = os.statvfs(path.parent)
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < NO_SPACE_BYTES


class Journal(JobsTable, LeasesTable, CallsTable, HistoryTable, WorktreesTable, SizesTable):
    """Durable records, written off the caller's thread with group commit.

    The tables' named operations come from their modules (``jobs``,
    ``leases``, ``calls``, ``history``, ``worktrees``, ``sizes``); this class is the core
    they share:
    the writer thread, :meth:`submit`, and one reading connection per thread.

    Args:
        path: the database file; its folder is created.
        synchronous: ``FULL`` (default) or ``NORMAL``/``OFF``, for benchmarks
            that measure what durability costs.
        history_max_events: how many recovery events are kept (and 256 KiB).

    Raises:
        JournalDamagedError: the file at ``path`` is damaged; nothing was written to it.
    """

    def __init__(
        self, path: str | Path, *, synchronous: str = "FULL", history_max_events: int = MAX_EVENTS
    ) -> None:
        self.path = str(path)
        self.history_max_events = history_max_events
        Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Held for as long as this journal is open: a recovery never moves it from under us.
        self._lock = hold_shared(self.path)
        try:
            self._check_and_open(synchronous)
            if self._lock is None:  # a new journal: its file exists from the writer's opening
                self._lock = hold_shared(self.path)
        except BaseException:
            let_go(self._lock)
            raise
        self._queue: queue.Queue[
            tuple[Callable[[sqlite3.Connection], Any], concurrent.futures.Future[Any]] | None
        ] = queue.Queue()
        self._local = threading.local()
        self._thread = threading.Thread(target=self._write_loop, name="journal-writer", daemon=True)
        self._thread.start()

    def _check_and_open(self, synchronous: str) -> None:
        """Name a damaged file before anything is written to it, then open the writer."""
        path = self.path
        try:
            problems = check_journal(self.path)
        except sqlite3.OperationalError as err:
            if not _no_space(Path(self.path)):
                raise
            log.error("the journal %s could not be checked (%s): its disk is full", path, err)
            problems = []
        if problems:
            raise JournalDamagedError(self.path, problems)
        self._synchronous = synchronous
        self._writer: sqlite3.Connection | None = None
        self._generation = 0  # bumped when the writer opens late: readers reconnect
        self.unwritable: str | None = None  # why the journal cannot save at all, while so
        try:
            self._open_writer()
        except sqlite3.OperationalError as err:
            if not _no_space(Path(self.path)) or not Path(self.path).exists():
                raise  # a lock, or a journal that never existed: nothing to serve from
            # A full disk: SQLite cannot make the WAL's files, so nothing can be written,
            # but what was saved can still be read, and the writer tries again.
            self.unwritable = _no_space_said(err)
            log.error(
                "the journal %s cannot be opened for writing (%s); it is read-only until space "
                "comes back (tried every %g s)",
                self.path,
                self.unwritable,
                REOPEN_EVERY_S,
            )

    def _open_writer(self) -> None:
        """Open the writing connection: WAL, the schema, the migrations.

        Raises:
            sqlite3.OperationalError: the disk or a lock refused it.
            JournalDamagedError: the file is damaged.
        """
        Path(self.path).touch(mode=0o600, exist_ok=True)
        # SQLite gives the -wal and -shm files the database's own mode: keep it 0600.
        os.chmod(self.path, 0o600)
        conn = None
        try:
            conn = _connect(self.path)
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.executescript(SCHEMA)
            for added in migrate(conn):
                log.info("journal: added column %s (a journal from an earlier version)", added)
        except sqlite3.OperationalError:
            if conn is not None:
                conn.close()
            raise  # the disk, a lock: not the file's fault
        except sqlite3.DatabaseError as err:  # damage the check did not reach
            if conn is not None:
                conn.close()
            raise JournalDamagedError(self.path, [str(err)]) from err
        self._writer = conn

    def _try_reopen(self) -> bool:
        """While read-only for want of space: open the writer if the disk takes it now."""
        try:
            self._open_writer()
        except (sqlite3.OperationalError, OSError) as err:
            self.unwritable = _no_space_said(err)
            return False
        except Exception as err:  # damage found on reopening: every write fails, saying so
            self.unwritable = str(err)
            return False
        self.unwritable = None
        self._generation += 1
        log.warning("the journal %s can save again", self.path)
        return True

    # ------------------------------------------------------------- writing

    def submit(self, write: Callable[[sqlite3.Connection], _T]) -> concurrent.futures.Future[_T]:
        """Queue a write; the future resolves once it is committed durably (or fails)."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._queue.put((write, future))
        return future

    def _write_loop(self) -> None:
        while True:
            try:
                if not self._write_round():
                    return
            except Exception:  # the writer must outlive any one bad round
                log.exception("the journal writer failed a round; it carries on")

    def _write_round(self) -> bool:
        """Commit one batch; False once the journal is closing."""
        if self._writer is None:
            try:
                item = self._queue.get(timeout=REOPEN_EVERY_S)
            except queue.Empty:
                self._try_reopen()
                return True
        else:
            item = self._queue.get()
        if item is None:
            return False
        batch = [item]
        while len(batch) < _GROUP_MAX:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                self._queue.put(None)  # finish this batch, then stop
                break
            batch.append(more)
        self._commit(batch)
        return True

    def _commit(
        self,
        batch: list[tuple[Callable[[sqlite3.Connection], Any], concurrent.futures.Future[Any]]],
    ) -> None:
        results: list[tuple[concurrent.futures.Future[Any], Any, BaseException | None]] = []
        if self._writer is None and not self._try_reopen():
            unwritable = self.unwritable or ""
            refused: sqlite3.Error = (
                sqlite3.DatabaseError(unwritable)
                if is_damage(unwritable)
                else sqlite3.OperationalError(f"database or disk is full ({unwritable})")
            )
            for _, future in batch:
                _settle(future, None, refused)
            return
        conn = self._writer
        assert conn is not None
        try:
            conn.execute("BEGIN IMMEDIATE")
            for write, future in batch:
                conn.execute("SAVEPOINT one")
                try:
                    results.append((future, write(conn), None))
                    conn.execute("RELEASE one")
                except Exception as err:  # one bad write must not sink the others
                    conn.execute("ROLLBACK TO one")
                    conn.execute("RELEASE one")
                    results.append((future, None, err))
            conn.execute("COMMIT")
        except sqlite3.Error as err:  # the commit itself failed (disk full, I/O error)
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            log.error("journal write failed: %s", err)
            for _, future in batch:
                _settle(future, None, err)
            return
        for future, value, error in results:
            _settle(future, value, error)

    # ------------------------------------------------------------- reading

    def _reader(self) -> sqlite3.Connection:
        generation = self._generation  # first: a reopen after this makes it stale, not kept
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "generation", 0) != generation:
            conn.close()  # opened read-only while the disk was full: the writer is back
            conn = None
        if conn is None:
            conn = _connect(self.path) if self._writer is not None else read_only(self.path)
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
            self._local.generation = generation
        return conn

    def _read(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run a read now on the calling thread (not for the event loop)."""
        return query(self._reader())

    def needs_attention_count(self) -> int:
        """How many jobs and calls are uncertain: in flight at a crash, waiting for a person."""
        return self.uncertain_jobs() + self.uncertain_calls()

    def close(self) -> None:
        """Finish queued writes, then close every connection."""
        self._queue.put(None)
        self._thread.join()
        if self._writer is not None:
            self._writer.close()
        let_go(self._lock)


def _settle(
    future: concurrent.futures.Future[Any], value: Any, error: BaseException | None
) -> None:
    """Resolve a caller's future; one whose caller gave up (cancelled) is left alone.

    The write itself has happened either way: a caller that stopped waiting
    does not undo it, and must not break the writer thread.
    """
    if future.cancelled():
        return
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

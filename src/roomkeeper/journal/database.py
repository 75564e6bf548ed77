"""The journal: SQLite in WAL mode, ``synchronous=FULL``, at ROOMKEEPER_HOME/journal.db.

Jobs, leases and every state change survive a restart of the gateway.  All
writes go through one writer thread that commits whatever has queued up in
one transaction (group commit): each caller gets a future that resolves
once its write is durable, so nothing on the event loop ever waits on
``fsync``.  Reads use one connection per reading thread (WAL lets them run beside
the writer); the gateway makes them off its event loop.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from roomkeeper.jobs.spec import JobView
from roomkeeper.journal.history import MAX_BYTES, MAX_EVENTS, HistoryEvent

log = logging.getLogger("roomkeeper")

_T = TypeVar("_T")
_GROUP_MAX = 512  # writes per transaction at most

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    exit_code INTEGER,
    spec TEXT NOT NULL,
    log_path TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    peak_bytes INTEGER,
    error TEXT,
    resumable INTEGER NOT NULL DEFAULT 0,
    pid INTEGER,
    pid_started REAL,
    resolution TEXT
);
CREATE INDEX IF NOT EXISTS jobs_owner_state ON jobs (owner, state);
CREATE TABLE IF NOT EXISTS job_events (
    job_id TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events (job_id);
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
    hook_outcome TEXT
);
CREATE TABLE IF NOT EXISTS markers (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (kind, id)
);
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
CREATE TABLE IF NOT EXISTS history (
    at REAL NOT NULL,
    event TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lease_events (
    lease_id TEXT NOT NULL,
    state TEXT NOT NULL,
    at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class JobRow:
    """A job as the journal keeps it (the API's view of a job from any run)."""

    id: str
    owner: str
    state: str
    reason: str | None
    exit_code: int | None
    spec: dict[str, Any]
    log_path: str
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    peak_bytes: int | None
    error: str | None
    resumable: bool = False
    pid: int | None = None
    pid_started: float | None = None
    resolution: str | None = None


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # durable at every commit (seed 002: save first)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def spec_json(view: JobView) -> str:
    """The job's spec, so work deferred by a crash can run again as it was asked for.

    The environment is kept too (the journal is private to ROOMKEEPER_HOME,
    mode 0600); it is never shown by the API, the feed or the history.
    """
    spec = view.spec
    return json.dumps(
        {
            "argv": list(spec.argv),
            "cwd": spec.cwd,
            "env": dict(spec.env) if spec.env is not None else None,
            "memory_bytes": spec.memory_bytes,
            "disk_bytes": spec.disk_bytes,
            "timeout_s": spec.timeout_s,
            "shell": spec.shell,
        }
    )


class Journal:
    """Durable records, written off the caller's thread with group commit.

    Args:
        path: the database file; its folder is created.
        synchronous: ``FULL`` (default) or ``NORMAL``/``OFF``, for benchmarks
            that measure what durability costs.
        history_max_events: how many recovery events are kept (and 256 KiB).
    """

    def __init__(
        self, path: str | Path, *, synchronous: str = "FULL", history_max_events: int = MAX_EVENTS
    ) -> None:
        self.path = str(path)
        self.history_max_events = history_max_events
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).touch(mode=0o600, exist_ok=True)
        self._writer = _connect(self.path)
        self._writer.execute(f"PRAGMA synchronous={synchronous}")
        self._writer.executescript(SCHEMA)
        self._queue: queue.Queue[
            tuple[Callable[[sqlite3.Connection], Any], concurrent.futures.Future[Any]] | None
        ] = queue.Queue()
        self._local = threading.local()
        self._thread = threading.Thread(target=self._write_loop, name="journal-writer", daemon=True)
        self._thread.start()

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
        conn = self._writer
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

    def record_job(
        self, view: JobView, *, pid_started: float | None = None, mark_pending: bool = False
    ) -> concurrent.futures.Future[None]:
        """Upsert the job's row and append its latest state change.

        A final state clears the job's pending marker in the same transaction:
        only a persisted outcome retires it (seed 002: save first).  With
        ``mark_pending`` the marker is written with the row, before a launch.
        """
        row = (
            view.id,
            view.owner,
            view.state.value,
            view.reason.value if view.reason else None,
            view.exit_code,
            spec_json(view),
            view.log_path,
            view.submitted_at,
            view.started_at,
            view.ended_at,
            view.peak_bytes,
            view.error,
            int(view.spec.resumable),
            view.pid,
            pid_started,
            None,
        )
        last = view.history[-1] if view.history else None
        final = view.state.final

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) "
                "DO UPDATE SET state=excluded.state, reason=excluded.reason, "
                "exit_code=excluded.exit_code, "
                "started_at=excluded.started_at, ended_at=excluded.ended_at, "
                "peak_bytes=excluded.peak_bytes, error=excluded.error, "
                "pid=coalesce(excluded.pid, pid), pid_started=coalesce(excluded.pid_started, "
                "pid_started), resolution=NULL",
                row,
            )
            if last is not None and not mark_pending:  # the launch marker adds no state change
                conn.execute(
                    "INSERT INTO job_events VALUES (?,?,?,?)",
                    (
                        view.id,
                        last.state.value,
                        last.reason.value if last.reason else None,
                        last.at,
                    ),
                )
            if final:
                conn.execute("DELETE FROM markers WHERE kind='job' AND id=?", (view.id,))
            if mark_pending:
                conn.execute(
                    "INSERT OR REPLACE INTO markers VALUES ('job', ?, ?)", (view.id, time.time())
                )

        return self.submit(write)

    def record_history(self, event: HistoryEvent) -> concurrent.futures.Future[None]:
        """Append a recovery event, then trim the history to its caps (count and bytes)."""
        text = event.to_json()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO history VALUES (?,?)", (event.at, text))
            conn.execute(
                "DELETE FROM history WHERE rowid NOT IN "
                "(SELECT rowid FROM history ORDER BY rowid DESC LIMIT ?)",
                (self.history_max_events,),
            )
            total = conn.execute("SELECT coalesce(sum(length(event)), 0) FROM history").fetchone()
            excess = int(total[0]) - MAX_BYTES
            while excess > 0:
                oldest = conn.execute(
                    "SELECT rowid, length(event) FROM history ORDER BY rowid LIMIT 1"
                ).fetchone()
                if oldest is None:
                    break
                conn.execute("DELETE FROM history WHERE rowid=?", (oldest[0],))
                excess -= int(oldest[1])

        return self.submit(write)

    def history(self, limit: int = MAX_EVENTS) -> list[HistoryEvent]:
        """Recovery events, newest first."""
        rows = self.query("SELECT event FROM history ORDER BY rowid DESC LIMIT ?", (limit,))
        return [HistoryEvent.from_json(r["event"]) for r in rows]

    def execute(self, sql: str, params: Iterable[Any] = ()) -> concurrent.futures.Future[None]:
        """Queue one statement (leases and later tables use this)."""
        args = tuple(params)

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(sql, args)

        return self.submit(write)

    # ------------------------------------------------------------- reading

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        """Run a read now on the calling thread (not for the event loop)."""
        return list(self._reader().execute(sql, tuple(params)).fetchall())

    def jobs(
        self, *, owner: str | None = None, state: str | None = None, limit: int = 500
    ) -> list[JobRow]:
        """Jobs from every run, newest first, filtered by owner and state."""
        sql, args = "SELECT * FROM jobs WHERE 1=1", list[Any]()
        if owner is not None:
            sql += " AND owner = ?"
            args.append(owner)
        if state is not None:
            sql += " AND state = ?"
            args.append(state)
        sql += " ORDER BY submitted_at DESC LIMIT ?"
        args.append(limit)
        return [_job_row(r) for r in self.query(sql, args)]

    def job(self, job_id: str) -> JobRow | None:
        """One job by id, from any run."""
        rows = self.query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return _job_row(rows[0]) if rows else None

    def close(self) -> None:
        """Finish queued writes, then close every connection."""
        self._queue.put(None)
        self._thread.join()
        self._writer.close()


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


def _job_row(r: sqlite3.Row) -> JobRow:
    return JobRow(
        id=r["id"],
        owner=r["owner"],
        state=r["state"],
        reason=r["reason"],
        exit_code=r["exit_code"],
        spec=json.loads(r["spec"]),
        log_path=r["log_path"],
        submitted_at=r["submitted_at"],
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        peak_bytes=r["peak_bytes"],
        error=r["error"],
        resumable=bool(r["resumable"]),
        pid=r["pid"],
        pid_started=r["pid_started"],
        resolution=r["resolution"],
    )

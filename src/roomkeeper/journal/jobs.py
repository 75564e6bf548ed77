"""The jobs table, its state changes (``job_events``) and the jobs' pending markers.

Every write here is one whole operation, one transaction of the journal's
writer: a job's outcome and the end of its marker are saved together or not
at all (only a persisted outcome clears the marker).  Columns are
named in every statement, so adding one breaks nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from roomkeeper.guard.rule import Word
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.journal.markers import MarkerKind, clear, is_marked, mark, marked
from roomkeeper.journal.store import Store
from roomkeeper.journal.worktrees import follow, register
from roomkeeper.loopback.hooks import HOOK_DUE, ReleaseHook


class JournalReason(Word):
    """The journal's own word for a job: what it saved before anything was signalled."""

    STOP_REQUESTED = "stop_requested", "a person asked to stop it"  # never deferred


STOP_REQUESTED = JournalReason.STOP_REQUESTED.value  # the code, as the jobs table holds it
# The states a job's record may be removed in: ended, and not in doubt.
REMOVABLE = tuple(
    s.value for s in JobState if s.final and s not in (JobState.UNCERTAIN, JobState.DEFERRED)
)

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
    resolution TEXT,
    memory_policy TEXT NOT NULL DEFAULT 'strict',
    estimate_bytes INTEGER,
    estimate_source TEXT
);
CREATE INDEX IF NOT EXISTS jobs_owner_state ON jobs (owner, state);
CREATE TABLE IF NOT EXISTS job_events (
    job_id TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events (job_id);
CREATE TABLE IF NOT EXISTS job_hooks (
    job_id TEXT PRIMARY KEY,
    release TEXT NOT NULL,
    outcome TEXT
);
"""

# Added after the table first shipped: ``database.migrate`` adds them to an older file.
ADDED_COLUMNS = (
    ("jobs", "memory_policy", "TEXT NOT NULL DEFAULT 'strict'"),
    ("jobs", "estimate_bytes", "INTEGER"),
    ("jobs", "estimate_source", "TEXT"),
)

_UPSERT = """
INSERT INTO jobs (
    id, owner, state, reason, exit_code, spec, log_path, submitted_at, started_at, ended_at,
    peak_bytes, error, resumable, pid, pid_started, memory_policy, estimate_bytes, estimate_source
) VALUES (
    :id, :owner, :state, :reason, :exit_code, :spec, :log_path, :submitted_at, :started_at,
    :ended_at, :peak_bytes, :error, :resumable, :pid, :pid_started, :memory_policy,
    :estimate_bytes, :estimate_source
)
ON CONFLICT (id) DO UPDATE SET
    state = excluded.state, reason = excluded.reason, exit_code = excluded.exit_code,
    started_at = excluded.started_at, ended_at = excluded.ended_at,
    peak_bytes = excluded.peak_bytes, error = excluded.error,
    pid = coalesce(excluded.pid, pid), pid_started = coalesce(excluded.pid_started, pid_started),
    resolution = NULL, memory_policy = excluded.memory_policy,
    estimate_bytes = excluded.estimate_bytes, estimate_source = excluded.estimate_source
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
    memory_policy: str = "strict"
    estimate_bytes: int | None = None
    estimate_source: str | None = None  # stated, learned, default, re-run (None: older row)


@dataclass(frozen=True, slots=True)
class RecordedLeader:
    """The leader of a job recorded as running: its pid and that process's start time."""

    pid: int
    started: float | None


@dataclass(frozen=True, slots=True)
class InFlightJob:
    """A job a previous run left unsettled, and whether it still holds its launch marker."""

    id: str
    state: str
    reason: str | None
    resumable: bool
    marked: bool


SPEC_COLUMNS = ("owner", "resumable")
"""The fields of a :class:`JobSpec` the jobs table keeps as columns of their own; every
other field is a key of its ``spec`` column's JSON."""


def spec_json(view: JobView) -> str:
    """The job's spec, so work deferred by a crash can run again as it was asked for: each
    field of :class:`JobSpec` by name, but :data:`SPEC_COLUMNS`.

    Only the environment the submitter gave is kept (the journal is private
    to ROOMKEEPER_HOME, mode 0600; it is never shown by the API, the feed or
    the history): a job that inherits the gateway's variables stores
    ``inherit_env`` instead of them, so the gateway's own secrets are never
    written to disk.
    """
    spec = view.spec
    return json.dumps(
        {
            f.name: _plain(getattr(spec, f.name))
            for f in dataclasses.fields(JobSpec)
            if f.name not in SPEC_COLUMNS
        }
    )


def _plain(value: Any) -> Any:
    """A spec field's value as JSON holds it: a record as an object, a word as a string."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return value


def _upsert(conn: sqlite3.Connection, view: JobView, pid_started: float | None) -> None:
    conn.execute(
        _UPSERT,
        {
            "id": view.id,
            "owner": view.owner,
            "state": view.state.value,
            "reason": view.reason.value if view.reason else None,
            "exit_code": view.exit_code,
            "spec": spec_json(view),
            "log_path": view.log_path,
            "submitted_at": view.submitted_at,
            "started_at": view.started_at,
            "ended_at": view.ended_at,
            "peak_bytes": view.peak_bytes,
            "error": view.error,
            "resumable": int(view.spec.resumable),
            "pid": view.pid,
            "pid_started": pid_started,
            "memory_policy": view.spec.memory_policy.value,
            "estimate_bytes": view.estimate_bytes,
            "estimate_source": view.estimate_source.value,
        },
    )


def _event(
    conn: sqlite3.Connection, job_id: str, state: str, reason: str | None, at: float
) -> None:
    conn.execute(
        "INSERT INTO job_events (job_id, state, reason, at) VALUES (:job_id, :state, :reason, :at)",
        {"job_id": job_id, "state": state, "reason": reason, "at": at},
    )


def _reopen(conn: sqlite3.Connection, job_id: str, state: JobState, at: float) -> None:
    # ended_at stays empty: an uncertain job's end is not known, a deferred one's not yet come.
    conn.execute(
        "UPDATE jobs SET state = :state, reason = NULL, ended_at = NULL WHERE id = :id",
        {"state": state.value, "id": job_id},
    )
    _event(conn, job_id, state.value, None, at)


class JobsTable(Store):
    """The jobs' named operations (``Journal`` has them)."""

    # ------------------------------------------------------------- writing

    def record_launch(self, view: JobView) -> Future[None]:
        """The job's row, its pending marker and its tree's registry row, before it is
        spawned (no state change added): one transaction."""
        at = time.time()

        def write(conn: sqlite3.Connection) -> None:
            _upsert(conn, view, None)
            mark(conn, MarkerKind.JOB, view.id, at=at)
            register(conn, view, at)

        return self.submit(write)

    def record_job(self, view: JobView, *, pid_started: float | None = None) -> Future[None]:
        """Upsert the job's row and append its latest state change.

        A final state is the job's outcome: it clears the job's pending marker
        in the same transaction (only a persisted outcome retires it).
        """
        last = view.history[-1] if view.history else None

        def write(conn: sqlite3.Connection) -> None:
            _upsert(conn, view, pid_started)
            if last is not None:
                reason = last.reason.value if last.reason else None
                _event(conn, view.id, last.state.value, reason, last.at)
            follow(conn, view)  # its tree's row, in the same transaction
            if view.state.final:
                clear(conn, MarkerKind.JOB, view.id)

        return self.submit(write)

    def request_stop(self, job_id: str) -> Future[None]:
        """Save that a person asked to cancel or stop the job, before anything is signalled."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE jobs SET reason = :reason WHERE id = :id",
                {"reason": STOP_REQUESTED, "id": job_id},
            )

        return self.submit(write)

    def resolve_job(self, job_id: str, *, resolution: str, at: float) -> Future[bool]:
        """Settle an uncertain job as a person said and end its marker; False if not uncertain."""

        def write(conn: sqlite3.Connection) -> bool:
            changed = conn.execute(
                "UPDATE jobs SET state = 'resolved', resolution = :resolution "
                "WHERE id = :id AND state = 'uncertain'",
                {"resolution": resolution, "id": job_id},
            ).rowcount
            if not changed:
                return False
            _event(conn, job_id, JobState.RESOLVED.value, None, at)
            clear(conn, MarkerKind.JOB, job_id)
            return True

        return self.submit(write)

    def settle_stop_request(self, job_id: str, *, state: JobState, at: float) -> Future[None]:
        """A stop a person asked for before a crash: the job ends as ``state``, its marker goes."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE jobs SET state = :state, ended_at = :at WHERE id = :id",
                {"state": state.value, "at": at, "id": job_id},
            )
            clear(conn, MarkerKind.JOB, job_id)

        return self.submit(write)

    def keep_stopped(self, job_id: str) -> Future[None]:
        """A job an orderly shutdown stopped, not safe to run again: it stays stopped."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE jobs SET reason = NULL WHERE id = :id", {"id": job_id})

        return self.submit(write)

    def forget_job(self, job_id: str) -> Future[bool]:
        """Delete an ended job's row and its state changes; False (nothing deleted) while it
        is live, in doubt, or still has its pending marker."""
        states = {f"s{i}": s for i, s in enumerate(REMOVABLE)}
        sql = f"DELETE FROM jobs WHERE id = :id AND state IN ({', '.join(':' + k for k in states)})"

        def write(conn: sqlite3.Connection) -> bool:
            if is_marked(conn, MarkerKind.JOB, job_id):
                return False
            if not conn.execute(sql, {"id": job_id, **states}).rowcount:
                return False
            conn.execute("DELETE FROM job_events WHERE job_id = :id", {"id": job_id})
            conn.execute("DELETE FROM job_hooks WHERE job_id = :id", {"id": job_id})
            return True

        return self.submit(write)

    def withdraw_job(self, job_id: str) -> Future[bool]:
        """Take back a job answered as not saved whose row was written too late: its row, its
        state changes and its hook go, whatever its state, unless it carries a pending marker
        (it was launched: then it is settled as any launched job).  False: nothing went."""

        def write(conn: sqlite3.Connection) -> bool:
            if is_marked(conn, MarkerKind.JOB, job_id):
                return False
            gone = conn.execute("DELETE FROM jobs WHERE id = :id", {"id": job_id}).rowcount
            conn.execute("DELETE FROM job_events WHERE job_id = :id", {"id": job_id})
            conn.execute("DELETE FROM job_hooks WHERE job_id = :id", {"id": job_id})
            return bool(gone)

        return self.submit(write)

    def mark_uncertain(self, job_id: str, *, at: float) -> Future[None]:
        """A job in flight at a crash: uncertain, shown to a person; its marker stays."""
        return self.submit(lambda conn: _reopen(conn, job_id, JobState.UNCERTAIN, at))

    def defer_job(self, job_id: str, *, at: float) -> Future[None]:
        """A job safe to run (again): deferred; its marker goes (a new launch writes a new one)."""

        def write(conn: sqlite3.Connection) -> None:
            _reopen(conn, job_id, JobState.DEFERRED, at)
            clear(conn, MarkerKind.JOB, job_id)

        return self.submit(write)

    # ------------------------------------------------------------- reading

    def jobs(
        self,
        *,
        owner: str | None = None,
        state: str | None = None,
        limit: int = 500,
        before: tuple[float, str] | None = None,
    ) -> list[JobRow]:
        """Jobs from every run, newest first (then by id), filtered by owner and state;
        with ``before``, only those after that (submitted_at, id) in this order."""
        sql = "SELECT * FROM jobs WHERE 1=1"
        if owner is not None:  # a filter only when asked, so the (owner, state) index serves
            sql += " AND owner = :owner"
        if state is not None:
            sql += " AND state = :state"
        if before is not None:
            sql += " AND (submitted_at < :at OR (submitted_at = :at AND id < :id))"
        sql += " ORDER BY submitted_at DESC, id DESC LIMIT :limit"
        at, ident = before if before is not None else (None, None)
        args = {"owner": owner, "state": state, "limit": limit, "at": at, "id": ident}
        return self._read(lambda conn: [_job_row(r) for r in conn.execute(sql, args)])

    def job(self, job_id: str) -> JobRow | None:
        """One job by id, from any run."""
        return self._read(lambda conn: _one(conn, "SELECT * FROM jobs WHERE id = :id", id=job_id))

    def next_deferred(self) -> JobRow | None:
        """The oldest deferred job: the next to resume."""
        sql = "SELECT * FROM jobs WHERE state = 'deferred' ORDER BY submitted_at LIMIT 1"
        return self._read(lambda conn: _one(conn, sql))

    def running_leaders(self) -> list[RecordedLeader]:
        """The recorded leaders of the jobs the journal says are running."""
        sql = (
            "SELECT pid, pid_started FROM jobs "
            "WHERE state IN ('running', 'suspended') AND pid IS NOT NULL"
        )
        return self._read(
            lambda conn: [RecordedLeader(r["pid"], r["pid_started"]) for r in conn.execute(sql)]
        )

    def jobs_in_flight(self) -> list[InFlightJob]:
        """Jobs a previous run left waiting or running, or cancelled or stopped by its shutdown."""

        def read(conn: sqlite3.Connection) -> list[InFlightJob]:
            launched = marked(conn, MarkerKind.JOB)
            rows = conn.execute(
                "SELECT id, state, reason, resumable FROM jobs "
                "WHERE state IN ('waiting', 'running', 'suspended') "
                "OR (reason = 'shutdown' AND state IN ('cancelled', 'stopped'))"
            )
            return [
                InFlightJob(
                    r["id"], r["state"], r["reason"], bool(r["resumable"]), r["id"] in launched
                )
                for r in rows
            ]

        return self._read(read)

    def save_job_hook(self, job_id: str, hook: ReleaseHook) -> Future[None]:
        """Keep a job's release hook with it, before the job is queued (no outcome yet)."""
        release = json.dumps(hook.to_json())

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO job_hooks (job_id, release, outcome) "
                "VALUES (:id, :release, NULL)",
                {"id": job_id, "release": release},
            )

        return self.submit(write)

    def settle_job_hook(self, job_id: str, outcome: str) -> Future[None]:
        """Record a job hook's outcome (``due`` before the call, then how it went)."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE job_hooks SET outcome = :outcome WHERE job_id = :id",
                {"id": job_id, "outcome": outcome},
            )

        return self.submit(write)

    def job_hooks_owed(self) -> list[tuple[str, ReleaseHook, JobState]]:
        """The job hooks not made yet, or made without a recorded outcome (a crash), with
        their job's state."""
        sql = (
            "SELECT h.job_id, h.release, j.state FROM job_hooks h JOIN jobs j ON j.id = h.job_id "
            "WHERE h.outcome IS NULL OR h.outcome = :due"
        )

        def read(conn: sqlite3.Connection) -> list[tuple[str, ReleaseHook, JobState]]:
            found: list[tuple[str, ReleaseHook, JobState]] = []
            try:
                rows = conn.execute(sql, {"due": HOOK_DUE}).fetchall()
            except sqlite3.OperationalError:  # an older journal opened read-only: no table
                return found
            for job_id, release, state in rows:
                saved = json.loads(release)
                hook = ReleaseHook(saved["method"], saved["url"])
                found.append((str(job_id), hook, JobState(state)))
            return found

        return self._read(read)

    def job_ids(self) -> set[str]:
        """Every job id the journal holds a record of."""
        sql = "SELECT id FROM jobs"
        return self._read(lambda conn: {str(row[0]) for row in conn.execute(sql)})

    def uncertain_jobs(self) -> int:
        """How many jobs are uncertain (in flight at a crash, not resolved yet)."""
        sql = "SELECT count(*) FROM jobs WHERE state = 'uncertain'"
        return self._read(lambda conn: int(conn.execute(sql).fetchone()[0]))


def _one(conn: sqlite3.Connection, sql: str, **args: Any) -> JobRow | None:
    row = conn.execute(sql, args).fetchone()
    return _job_row(row) if row is not None else None


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
        memory_policy=r["memory_policy"],
        estimate_bytes=r["estimate_bytes"],
        estimate_source=r["estimate_source"],
    )

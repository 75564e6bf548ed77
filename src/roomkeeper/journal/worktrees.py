"""The worktree registry: which git worktree belongs to which job, and that job's state.

The pruner's protect set comes from here, never from a guess.  A
tree's row is written in the same transaction as its job's launch row and
marker (:func:`register`, called by ``record_launch``), and follows the job's
state in the same transaction as every later change (:func:`follow`, called
by ``record_job``).  The protect lookup reads the job's state from the jobs
table where the job has a row (so recovery's *uncertain* and *deferred*
protect the tree too) and the row's own state where it has none (a batch
run, which keeps no job rows).  A tree is protected unless its job is
settled: :data:`SETTLED` lists those states, so a state added later is
protected until someone says otherwise.
"""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import Future

from roomkeeper.jobs.spec import JobState, JobView
from roomkeeper.journal.store import Store
from roomkeeper.kernel.identity import identity_lives
from roomkeeper.worktrees.pruner import RegisteredWorktree

SCHEMA = """
CREATE TABLE IF NOT EXISTS workspaces (
    path TEXT PRIMARY KEY,
    repo TEXT NOT NULL,
    branch TEXT NOT NULL,
    job_id TEXT NOT NULL,
    state TEXT NOT NULL,
    registered_at REAL NOT NULL,
    owner TEXT
);
"""
# Added after the table first shipped (journal.database.migrate brings older files up).
ADDED_COLUMNS = (("workspaces", "owner", "TEXT"),)

SETTLED = (
    JobState.EXITED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.EXPIRED,
    JobState.TIMED_OUT,
    JobState.STOPPED,
    JobState.RESOLVED,
)
_SETTLED_SQL = ", ".join(f"'{s.value}'" for s in SETTLED)  # constants, not input

_TREES = f"""
SELECT w.path, w.repo, w.branch, w.job_id, coalesce(j.state, w.state) AS state,
       w.registered_at, w.owner, j.id IS NULL AS rowless,
       coalesce(j.state, w.state) NOT IN ({_SETTLED_SQL}) AS active
FROM workspaces w LEFT JOIN jobs j ON j.id = w.job_id
"""
ABANDONED = "abandoned"  # shown for a batch tree whose batch process is gone


def register(conn: sqlite3.Connection, view: JobView, at: float, owner: str | None = None) -> None:
    """The job's tree is its own from now (inside the launch's transaction).

    ``owner`` names the process that keeps the row's state when no job row
    does (a batch: :func:`roomkeeper.kernel.identity.process_identity`).
    """
    tree = view.worktree
    if tree is None:
        return
    conn.execute(
        "INSERT INTO workspaces (path, repo, branch, job_id, state, registered_at, owner) "
        "VALUES (:path, :repo, :branch, :job_id, :state, :at, :owner) "
        "ON CONFLICT (path) DO UPDATE SET job_id = excluded.job_id, state = excluded.state, "
        "registered_at = excluded.registered_at, owner = excluded.owner",
        {
            "path": tree.path,
            "repo": tree.repo,
            "branch": tree.branch,
            "job_id": view.id,
            "state": JobState.RUNNING.value,
            "at": at,
            "owner": owner,
        },
    )


def follow(conn: sqlite3.Connection, view: JobView) -> None:
    """The tree's row takes its job's new state (inside that change's transaction)."""
    if view.worktree is None:
        return
    conn.execute(
        "UPDATE workspaces SET state = :state WHERE path = :path AND job_id = :job_id",
        {"state": view.state.value, "path": view.worktree.path, "job_id": view.id},
    )


class WorktreesTable(Store):
    """The registry's named operations (``Journal`` has them)."""

    def record_worktree(self, view: JobView, owner: str) -> Future[None]:
        """Register a tree whose job keeps no row here (a batch line), before it starts.

        ``owner`` is the batch process's identity: once that process is gone,
        a row it left unsettled (the batch was killed) no longer protects the
        tree, which git's own checks (changes, stashes, unpushed commits) still do.
        """
        return self.submit(lambda conn: register(conn, view, time.time(), owner))

    def record_worktree_state(self, view: JobView) -> Future[None]:
        """A batch line's tree follows its job's state."""
        return self.submit(lambda conn: follow(conn, view))

    def forget_worktree(self, path: str) -> Future[None]:
        """The tree was removed: drop its row."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM workspaces WHERE path = :path", {"path": path})

        return self.submit(write)

    def registered_worktrees(self) -> list[RegisteredWorktree]:
        """Every registered tree with its job's state now, oldest first."""
        sql = _TREES + " ORDER BY w.registered_at"
        return self._read(lambda conn: [_tree(r) for r in conn.execute(sql)])

    def protected_paths(self) -> frozenset[str]:
        """The trees whose jobs are not settled (running, suspended, waiting, in doubt).

        A batch line's row (no job row) whose batch process is gone is not:
        nothing will ever settle it.
        """
        sql = f"SELECT path, owner, rowless FROM ({_TREES}) WHERE active"
        rows = self._read(lambda conn: list(conn.execute(sql)))
        return frozenset(r["path"] for r in rows if not _abandoned(r))


def _abandoned(r: sqlite3.Row) -> bool:
    """A batch row whose batch process no longer runs (a gateway row is the journal's)."""
    return bool(r["rowless"]) and r["owner"] is not None and not identity_lives(r["owner"])


def _tree(r: sqlite3.Row) -> RegisteredWorktree:
    abandoned = bool(r["active"]) and _abandoned(r)
    return RegisteredWorktree(
        path=r["path"],
        repo=r["repo"],
        branch=r["branch"],
        job_id=r["job_id"],
        state=ABANDONED if abandoned else r["state"],
        registered_at=r["registered_at"],
    )

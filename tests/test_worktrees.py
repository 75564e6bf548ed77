"""Worktrees and the reaper, against real git repositories on a small mounted file system."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from roomkeeper.errors import WorktreeError
from roomkeeper.gateway.worktrees import prune_event
from roomkeeper.jobs.spec import JobState
from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import ALLOWED_FIELDS, RecoveryCode
from roomkeeper.journal.worktrees import ABANDONED
from roomkeeper.kernel.identity import process_identity
from roomkeeper.worktrees.pruner import (
    Protection,
    PruneReport,
    RegisteredWorktree,
    WorktreeFacts,
    git_protection,
    prune,
    registry_protection,
)
from roomkeeper.worktrees.request import Worktree, WorktreeRequest
from roomkeeper.worktrees.service import Worktrees, validate_worktree, worktree_path
from tests.worktree_repos import (
    MIB,
    fill,
    free_bytes,
    git,
    git_identity,
    job_view,
    journal,
    make_repo,
    record_ended,
    record_running,
    repo,
    small_fs,
)

pytestmark = pytest.mark.kernel

__all__ = ["git_identity", "journal", "repo", "small_fs"]  # fixtures, used by name

RUNNING = {2, 5, 9, 13, 17, 19}  # not the newest six: a guess by age is wrong with twenty
UNTRACKED = {0, 7}
CHANGED = {15}
STASHED = {3}
UNPUSHED = {11}
PUSHED_COMMIT = {10}  # committed, then pushed: may go
DISPATCHED = 16  # finished; its branch is being dispatched again now
REAPABLE = {1, 4, 6, 8, 10, 12, 14, 18}


def workspaces(
    volume: Path, registry: Journal, reports: list[PruneReport] | None = None
) -> Worktrees:
    return Worktrees(
        workspace=lambda: volume,
        registry=registry,
        on_prune=reports.append if reports is not None else None,
        env={"ROOMKEEPER_REAP_AT_PERCENT": "100"},
    )


def twenty_jobs(volume: Path, repo: Path, registry: Journal) -> dict[int, Worktree]:
    """Twenty jobs with trees: six running, the rest finished with what each set says."""
    ws = workspaces(volume, registry)
    trees: dict[int, Worktree] = {}
    for i in range(20):
        view = job_view(f"job{i:02d}", repo)
        tree = ws.prepare(view)
        assert tree is not None
        trees[i] = tree
        running = record_running(registry, view, tree)
        path = Path(tree.path)
        if i in UNTRACKED:
            (path / "notes.txt").write_text("a finding not yet added\n")
        if i in CHANGED:
            (path / "README").write_text("edited, not committed\n")
        if i in STASHED:
            (path / "README").write_text("set aside\n")
            git(path, "stash", "-q")
        if i in UNPUSHED | PUSHED_COMMIT:
            (path / f"work{i}.txt").write_text("done\n")
            git(path, "add", ".")
            git(path, "commit", "-q", "-m", f"work of job {i}")
        if i in PUSHED_COMMIT:
            git(path, "push", "-q", "origin", tree.branch)
        if i not in RUNNING:
            record_ended(registry, running)
    return trees


def test_a_reap_under_pressure_takes_only_finished_clean_stash_free_pushed_trees(
    small_fs: Path, repo: Path, journal: Journal
) -> None:
    """Twenty trees, six running: only the finished, clean, stash-free, pushed ones go."""
    trees = twenty_jobs(small_fs, repo, journal)
    fill(small_fs, leave_free=10 * MIB)  # disk pressure: far below any line
    report = prune(
        journal,
        volume=small_fs,
        target_free=290 * MIB,  # more than removing every tree could free
        dispatching=frozenset({trees[DISPATCHED].path}),
    )
    removed = {int(v.tree.job_id[3:]) for v in report.removed}
    assert removed == REAPABLE
    kept = {int(v.tree.job_id[3:]): v.protection for v in report.kept}
    assert {i for i, p in kept.items() if p is Protection.JOB_ACTIVE} == RUNNING
    assert {i for i, p in kept.items() if p is Protection.CHANGES} == UNTRACKED | CHANGED
    assert {i for i, p in kept.items() if p is Protection.STASH} == STASHED
    assert {i for i, p in kept.items() if p is Protection.UNPUSHED} == UNPUSHED
    assert kept[DISPATCHED] is Protection.DISPATCHING
    for i, tree in trees.items():
        assert Path(tree.path).is_dir() == (i not in REAPABLE), i
        git(repo, "rev-parse", "--verify", f"refs/heads/{tree.branch}")  # branches are kept
    assert report.freed_bytes > 0
    # The removals are written on the journal's writer, in order: once a write submitted
    # after them is done, they are (on a busy machine they may not be yet when prune returns).
    journal.submit(lambda conn: None).result(timeout=30)
    assert {t.path for t in journal.registered_worktrees()} == {
        t.path for i, t in trees.items() if i not in REAPABLE
    }


def test_the_protect_set_comes_from_the_journal_and_follows_the_jobs_state(
    small_fs: Path, repo: Path, journal: Journal
) -> None:
    """Running, then uncertain after a crash, protect the tree; only a settled job frees it."""
    ws = workspaces(small_fs, journal)
    view = job_view("abc", repo)
    tree = ws.prepare(view)
    assert tree is not None
    running = record_running(journal, view, tree)
    assert journal.protected_paths() == {tree.path}
    journal.mark_uncertain("abc", at=1.0).result(timeout=10)  # recovery after a crash
    assert journal.protected_paths() == {tree.path}
    record_ended(journal, running, JobState.STOPPED)
    assert journal.protected_paths() == frozenset()
    (row,) = journal.registered_worktrees()
    assert (row.job_id, row.state, row.branch) == ("abc", "stopped", "roomkeeper/abc")


def test_a_killed_batchs_tree_stops_being_protected_by_its_row(
    small_fs: Path, repo: Path, journal: Journal
) -> None:
    """A batch keeps no job rows: its line's row names the batch process. SIGKILLed, that
    process leaves the row "running" for ever; once it is gone the row protects nothing
    (git's own checks still do), and the tree shows as abandoned and is reaped."""
    ws = workspaces(small_fs, journal)
    view = job_view("1", repo)
    tree = ws.prepare(view)
    assert tree is not None
    line = replace(view, worktree=tree, state=JobState.RUNNING)
    batch = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        journal.record_worktree(line, process_identity(batch.pid)).result(timeout=10)
        assert journal.protected_paths() == {tree.path}  # its batch still runs
        assert [t.state for t in journal.registered_worktrees()] == ["running"]
    finally:
        batch.kill()
        batch.wait()
    assert journal.protected_paths() == frozenset()
    assert [t.state for t in journal.registered_worktrees()] == [ABANDONED]
    report = prune(journal, volume=small_fs, target_free=None)  # no low mark: every tree it may
    assert [v.tree.path for v in report.removed] == [tree.path]
    assert not Path(tree.path).exists()


def test_an_older_registry_gains_the_owner_column_and_its_rows_keep_their_protection(
    tmp_path: Path,
) -> None:
    """A workspaces table from before owners is migrated on open; its rows (no owner) are
    protected as before while unsettled."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE workspaces (path TEXT PRIMARY KEY, repo TEXT NOT NULL, "
            "branch TEXT NOT NULL, job_id TEXT NOT NULL, state TEXT NOT NULL, "
            "registered_at REAL NOT NULL)"
        )
        conn.execute(
            "INSERT INTO workspaces VALUES ('/w/t', '/r', 'roomkeeper/batch-x-1', '1', "
            "'running', 1.0)"
        )
    old = Journal(path, synchronous="OFF")
    try:
        assert old.protected_paths() == {"/w/t"}
        assert [t.state for t in old.registered_worktrees()] == ["running"]
    finally:
        old.close()


def test_the_registry_row_is_written_with_the_launch_in_one_transaction(
    repo: Path, journal: Journal, tmp_path: Path
) -> None:
    """A launch that fails to save saves neither its job row nor its tree's row."""
    tree = Worktree(str(tmp_path / "t"), str(repo), "roomkeeper/x")
    view = replace(job_view("x", repo), worktree=tree, state=JobState.RUNNING)
    broken = replace(view, spec=replace(view.spec, argv=[object()]))  # spec_json fails
    with pytest.raises(TypeError):
        journal.record_launch(broken).result(timeout=10)  # type: ignore[arg-type]
    assert journal.job("x") is None
    assert journal.registered_worktrees() == []
    journal.record_launch(view).result(timeout=10)
    assert journal.job("x") is not None
    assert [t.path for t in journal.registered_worktrees()] == [tree.path]


def test_a_re_dispatch_keeps_its_previous_attempts_commit(
    small_fs: Path, repo: Path, journal: Journal
) -> None:
    """Same branch again: the tree (or, once reaped, the branch) keeps the earlier commit."""
    ws = workspaces(small_fs, journal)
    first = job_view("first", repo, branch="feature/x")
    tree = ws.prepare(first)
    assert tree is not None and not tree.reused
    (Path(tree.path) / "result.txt").write_text("attempt one\n")
    git(tree.path, "add", ".")
    git(tree.path, "commit", "-q", "-m", "attempt one")
    commit = git(tree.path, "rev-parse", "HEAD").strip()
    record_ended(journal, record_running(journal, first, tree), JobState.FAILED)
    again = ws.prepare(job_view("second", repo, branch="feature/x"))
    assert again is not None and again.reused and again.path == tree.path
    assert git(again.path, "rev-parse", "HEAD").strip() == commit
    # The tree gone (a person removed it), the branch is checked out again, not reset.
    git(repo, "worktree", "remove", tree.path)
    third = ws.prepare(job_view("third", repo, branch="feature/x"))
    assert third is not None and third.reused
    assert git(third.path, "rev-parse", "HEAD").strip() == commit
    assert (Path(third.path) / "result.txt").read_text() == "attempt one\n"


def test_the_guard_s_reap_never_takes_the_tree_being_dispatched(
    small_fs: Path, repo: Path, journal: Journal
) -> None:
    """A finished, clean, pushed tree whose branch is dispatched again stays (own branch)."""
    ws = workspaces(small_fs, journal)
    first = job_view("one", repo, branch="fix")
    tree = ws.prepare(first)
    assert tree is not None
    git(tree.path, "push", "-q", "origin", "fix")  # pushed and clean: reapable but for this
    record_ended(journal, record_running(journal, first, tree))
    other = ws.prepare(job_view("two", repo))
    assert other is not None
    record_ended(journal, record_running(journal, job_view("two", repo), other))
    refusal = _disk_refusal(needed=10**15)
    assert ws.reclaim(job_view("three", repo, branch="fix"), refusal)
    assert Path(tree.path).is_dir()
    assert not Path(other.path).exists()


def test_an_unreadable_registry_reaps_nothing_and_says_so(
    small_fs: Path, repo: Path, journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    """With the registry gone, no tree is removed (never "protect nobody")."""
    ws = workspaces(small_fs, journal)
    view = job_view("gone", repo)
    tree = ws.prepare(view)
    assert tree is not None
    record_ended(journal, record_running(journal, view, tree))
    with sqlite3.connect(journal.path) as conn:
        conn.execute("DROP TABLE workspaces")
    with caplog.at_level(logging.ERROR, logger="roomkeeper"):
        report = prune(journal, volume=small_fs, target_free=None)
    assert report.refused is not None and "could not be read" in report.refused
    assert report.removed == () and Path(tree.path).is_dir()
    assert "reap refused" in caplog.text
    assert prune_event(report).code is RecoveryCode.REAP_REFUSED


class LockedProtectLookup:
    """The real registry, whose protect lookup fails (a locked or damaged journal)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def registered_worktrees(self) -> list[RegisteredWorktree]:
        return self.journal.registered_worktrees()

    def protected_paths(self) -> frozenset[str]:
        raise sqlite3.OperationalError("database is locked")

    def forget_worktree(self, path: str) -> object:
        return self.journal.forget_worktree(path)


def test_a_failing_protect_lookup_reaps_nothing(
    small_fs: Path, repo: Path, journal: Journal
) -> None:
    """The trees are listed but their jobs' states cannot be read: even a running job's
    tree would look unprotected, so nothing is removed."""
    ws = workspaces(small_fs, journal)
    view = job_view("live", repo)
    tree = ws.prepare(view)
    assert tree is not None
    record_running(journal, view, tree)
    report = prune(LockedProtectLookup(journal), volume=small_fs, target_free=None)
    assert report.refused is not None and "database is locked" in report.refused
    assert Path(tree.path).is_dir()


def test_the_guard_s_reap_stops_at_the_guard_s_line(
    tmp_path: Path, small_fs: Path, journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    """Short of the line by 30 MiB, with 20 MiB trees: the two oldest go, no more."""
    big = make_repo(tmp_path, big_file_mib=20)
    reports: list[PruneReport] = []
    ws = workspaces(small_fs, journal, reports)
    trees = []
    for i in range(5):
        view = job_view(f"old{i}", big)
        tree = ws.prepare(view)
        assert tree is not None
        trees.append(tree)
        record_ended(journal, record_running(journal, view, tree))
    needed = 136 * MIB
    fill(small_fs, leave_free=needed - 30 * MIB)
    with caplog.at_level(logging.INFO, logger="roomkeeper"):
        assert ws.reclaim(job_view("next", big), _disk_refusal(needed=needed))
    assert "reap removed 2 tree(s), freed" in caplog.text  # what it removed and freed
    assert "the tree of job old0" in caplog.text
    assert free_bytes(small_fs) >= needed
    (report,) = reports
    assert [v.tree.job_id for v in report.removed] == ["old0", "old1"]
    assert [Path(t.path).is_dir() for t in trees] == [False, False, True, True, True]
    assert [v.protection for v in report.kept] == [None, None, None]  # past the low mark


def test_workspace_creation_reaps_first_above_the_reap_mark(
    tmp_path: Path, small_fs: Path, journal: Journal
) -> None:
    """Above ROOMKEEPER_REAP_AT_PERCENT, making a tree reaps finished ones, never running ones."""
    big = make_repo(tmp_path, big_file_mib=20)
    ws = Worktrees(
        workspace=lambda: small_fs, registry=journal, env={"ROOMKEEPER_REAP_AT_PERCENT": "60"}
    )
    done, running = [], []
    for i in range(4):
        view = job_view(f"j{i}", big)
        tree = ws.prepare(view)
        assert tree is not None
        row = record_running(journal, view, tree)
        if i % 2 == 0:
            record_ended(journal, row)
            done.append(tree)
        else:
            running.append(tree)
    fill(small_fs, leave_free=90 * MIB)  # 70 % used: above 60
    made = ws.prepare(job_view("new", big))
    assert made is not None and Path(made.path).is_dir()
    assert all(not Path(t.path).exists() for t in done)
    assert all(Path(t.path).is_dir() for t in running)


def test_what_cannot_work_is_said_before_anything_starts(
    tmp_path: Path, small_fs: Path, repo: Path, journal: Journal
) -> None:
    """Not a repository, a branch checked out elsewhere, a dirty base: each by its reason."""
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(WorktreeError, match="is not a git repository") as err:
        validate_worktree(WorktreeRequest(str(plain)), small_fs)
    assert err.value.reason == "not_a_repository"
    with pytest.raises(WorktreeError, match="checked out in another tree") as err:
        validate_worktree(WorktreeRequest(str(repo), "main"), small_fs)
    assert err.value.reason == "branch_checked_out"
    (repo / "scratch").write_text("untracked\n")
    with pytest.raises(WorktreeError, match="dirty") as err:
        validate_worktree(WorktreeRequest(str(repo)), small_fs)
    assert err.value.reason == "dirty_base"
    with pytest.raises(WorktreeError, match="not a valid branch name") as err:
        workspaces(small_fs, journal).prepare(job_view("y", repo, branch="bad..name"))
    assert err.value.reason == "invalid_branch"


def test_trees_of_two_repositories_of_one_name_never_share_a_folder(tmp_path: Path) -> None:
    """The tree's folder names the repository by its name and a hash of its path."""
    a = worktree_path(tmp_path, "/src/a/app", "roomkeeper/1")
    b = worktree_path(tmp_path, "/src/b/app", "roomkeeper/1")
    assert a != b and Path(a).name == "roomkeeper-1"


def test_the_checks_in_order() -> None:
    """The registry's word first; git's checks in order; a tree git cannot read stays."""
    tree = RegisteredWorktree("/w/t", "/r", "b", "j", "running", 1.0)
    assert registry_protection(tree, frozenset({"/w/t"})) is Protection.JOB_ACTIVE
    assert registry_protection(tree, frozenset()) is None
    assert git_protection(WorktreeFacts(inspected=False)) is Protection.UNINSPECTABLE
    assert git_protection(WorktreeFacts(True, changes=1, stashes=1)) is Protection.CHANGES
    assert git_protection(WorktreeFacts(True, stashes=2, pushed=True)) is Protection.STASH
    assert git_protection(WorktreeFacts(True, pushed=False)) is Protection.UNPUSHED
    assert git_protection(WorktreeFacts(True, pushed=True)) is None


def test_a_reap_event_holds_counts_and_bytes_only() -> None:
    """The recovery history gets numbers: no path, branch or job id."""
    tree = RegisteredWorktree("/secret/path", "/r", "b", "j", "exited", 1.0)
    from roomkeeper.worktrees.pruner import WorktreeVerdict

    report = PruneReport((WorktreeVerdict(tree, 4096, None),), (), 4096)
    event = prune_event(report)
    assert event.code is RecoveryCode.WORKSPACES_REAPED
    assert dict(event.numbers) == {"trees": 1, "kept": 0, "freed_bytes": 4096}
    assert set(event.numbers) <= ALLOWED_FIELDS
    assert "/secret" not in event.to_json()


def _disk_refusal(*, needed: int):  # type: ignore[no-untyped-def]
    from roomkeeper.guard.rule import Decision, Reason

    return Decision(
        "x", admit=False, reason=Reason.DISK, summary="no room", disk_needed_bytes=needed
    )


def test_a_branch_whose_tree_a_running_job_holds_is_not_shared(
    small_fs: Path, repo: Path, journal: Journal
) -> None:
    """Two jobs never run in one tree; the same job (resumed) gets its own tree back."""
    ws = workspaces(small_fs, journal)
    first = job_view("holder", repo, branch="shared")
    tree = ws.prepare(first)
    assert tree is not None
    record_running(journal, first, tree)
    with pytest.raises(WorktreeError, match="tree of job holder") as err:
        ws.prepare(job_view("second", repo, branch="shared"))
    assert err.value.reason == "branch_checked_out"
    again = ws.prepare(first)
    assert again is not None and again.reused

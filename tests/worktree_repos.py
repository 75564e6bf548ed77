"""Real git repositories and a small file system for the worktree tests.

A tmpfs of a few hundred MB is mounted as ROOMKEEPER_WORKSPACE and
unmounted in a finalizer even when the test fails; repositories live in
the test's temporary directory beside it, each with a bare ``origin`` so
"pushed" means what it means for a person.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from roomkeeper.jobs.spec import JobSpec, JobState, JobView, Transition
from roomkeeper.journal.database import Journal
from roomkeeper.worktrees.request import Worktree, WorktreeRequest

MIB = 1024 * 1024


def git(cwd: Path | str, *args: str) -> str:
    """Run git as a person would; fail the test if it fails."""
    done = subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits need a name; the user's own git configuration is not read."""
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "roomkeeper tests")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "tests@example.invalid")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 300 MB tmpfs mounted on a temporary directory; unmounted however the test ends."""
    mount_point = tmp_path / "workspace"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs on {mount_point}: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def make_repo(where: Path, *, big_file_mib: int = 0) -> Path:
    """A repository with one pushed commit on ``main`` (and a file of ``big_file_mib`` MiB)."""
    origin = where / "origin.git"
    repo = where / "repo"
    git(where, "init", "-q", "--bare", "-b", "main", str(origin))
    git(where, "init", "-q", "-b", "main", str(repo))
    (repo / "README").write_text("hello\n")
    if big_file_mib:
        (repo / "data.bin").write_bytes(os.urandom(big_file_mib * MIB))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "-u", "origin", "main")
    return repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small repository with a pushed base commit."""
    return make_repo(tmp_path)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    """A real journal: the registry."""
    opened = Journal(tmp_path / "home" / "journal.db")
    try:
        yield opened
    finally:
        opened.close()


def job_view(job_id: str, repo: Path | str, branch: str | None = None) -> JobView:
    """A waiting job that asks for a tree of ``repo``."""
    now = time.time()
    return JobView(
        id=job_id,
        spec=JobSpec(argv=["true"], worktree=WorktreeRequest(str(repo), branch)),
        state=JobState.WAITING,
        reason=None,
        exit_code=None,
        submitted_at=now,
        started_at=None,
        ended_at=None,
        log_path=f"/nonexistent/{job_id}.log",
        peak_bytes=None,
        error=None,
        history=(Transition(JobState.WAITING, now, None),),
    )


def record_running(journal: Journal, view: JobView, tree: Worktree) -> JobView:
    """Launch row, marker and registry row (one transaction), then the running state."""
    running = replace(
        view,
        state=JobState.RUNNING,
        worktree=tree,
        started_at=time.time(),
        history=(*view.history, Transition(JobState.RUNNING, time.time(), None)),
    )
    journal.record_launch(running).result(timeout=10)
    journal.record_job(running).result(timeout=10)
    return running


def record_ended(journal: Journal, view: JobView, state: JobState = JobState.EXITED) -> JobView:
    """The job's outcome (its tree's row follows in the same transaction)."""
    ended = replace(
        view,
        state=state,
        exit_code=0,
        ended_at=time.time(),
        history=(*view.history, Transition(state, time.time(), None)),
    )
    journal.record_job(ended).result(timeout=10)
    return ended


def fill(volume: Path, leave_free: int) -> Path:
    """A ballast file that leaves about ``leave_free`` bytes free on ``volume``."""
    st = os.statvfs(volume)
    free = st.f_bavail * st.f_frsize
    ballast = volume / "ballast"
    size = max(0, free - leave_free)
    with ballast.open("wb") as f:
        chunk = b"\0" * MIB
        written = 0
        while written + MIB <= size:
            f.write(chunk)
            written += MIB
        f.write(b"\0" * (size - written))
    return ballast


def free_bytes(volume: Path) -> int:
    """Free bytes on ``volume`` now."""
    st = os.statvfs(volume)
    return st.f_bavail * st.f_frsize

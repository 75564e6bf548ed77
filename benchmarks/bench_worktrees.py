"""What a job's worktree adds to its launch, and what a reap costs.

Makes a repository of FILES small files (a pushed base commit), then, on a
300 MB tmpfs mounted for the run (as root; a temporary directory otherwise),
times: ``Worktrees.prepare`` for TREES new trees (the launch path's cost),
``survey`` of those trees (what ``GET /v1/workspaces`` and every reap ask git:
status with untracked files, stash list, refs containing HEAD, size), and
one ``reap`` removing them all.  Prints the figures; nothing is asserted.

Usage: python benchmarks/bench_worktrees.py [--trees 20] [--files 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from roomkeeper.jobs.spec import JobSpec, JobState, JobView, Transition
from roomkeeper.journal.database import Journal
from roomkeeper.worktrees.pruner import prune, survey
from roomkeeper.worktrees.request import WorktreeRequest
from roomkeeper.worktrees.service import Worktrees


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


def make_repo(where: Path, files: int) -> Path:
    origin, repo = where / "origin.git", where / "repo"
    git(where, "init", "-q", "--bare", "-b", "main", str(origin))
    git(where, "init", "-q", "-b", "main", str(repo))
    for i in range(files):
        (repo / f"f{i:04d}.txt").write_text(f"file {i}\n" * 20)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "-u", "origin", "main")
    return repo


def view(job_id: str, repo: Path) -> JobView:
    now = time.time()
    return JobView(
        id=job_id,
        spec=JobSpec(argv=["true"], worktree=WorktreeRequest(str(repo))),
        state=JobState.WAITING,
        reason=None,
        exit_code=None,
        submitted_at=now,
        started_at=None,
        ended_at=None,
        log_path="/dev/null",
        peak_bytes=None,
        error=None,
        history=(Transition(JobState.WAITING, now, None),),
    )


def mount_tmpfs(where: Path) -> bool:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300m", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def run(trees: int, files: int, tmp: Path) -> None:
    workspace = tmp / "workspace"
    mounted = mount_tmpfs(workspace)
    try:
        repo = make_repo(tmp, files)
        journal = Journal(tmp / "home" / "journal.db")
        ws = Worktrees(
            workspace=lambda: workspace,
            registry=journal,
            env={"ROOMKEEPER_REAP_AT_PERCENT": "100"},
        )
        made = []
        for i in range(trees):
            job = view(f"b{i:03d}", repo)
            started = time.perf_counter()
            tree = ws.prepare(job)
            made.append(time.perf_counter() - started)
            ended = replace(job, state=JobState.EXITED, worktree=tree)
            journal.record_launch(ended).result()
            journal.record_job(ended).result()
        started = time.perf_counter()
        listed = survey(journal)
        surveyed = time.perf_counter() - started
        started = time.perf_counter()
        report = prune(journal, volume=workspace, target_free=None)
        reaped = time.perf_counter() - started
        journal.close()
        where = "tmpfs" if mounted else "a temporary directory"
        print(f"repository: {files} files; {trees} trees on {where}")
        print(
            f"prepare (git worktree add): p50 {statistics.median(made) * 1000:.1f} ms, "
            f"max {max(made) * 1000:.1f} ms"
        )
        print(
            f"survey of {len(listed)} trees: {surveyed * 1000:.1f} ms "
            f"({surveyed / len(listed) * 1000:.1f} ms a tree)"
        )
        print(
            f"reap of {len(report.removed)} trees: {reaped * 1000:.1f} ms, "
            f"freed {report.freed_bytes / 1e6:.1f} MB"
        )
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(workspace)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trees", type=int, default=20)
    parser.add_argument("--files", type=int, default=500)
    args = parser.parse_args()
    for role in ("AUTHOR", "COMMITTER"):
        os.environ.setdefault(f"GIT_{role}_NAME", "bench")
        os.environ.setdefault(f"GIT_{role}_EMAIL", "bench@example.invalid")
    with tempfile.TemporaryDirectory() as tmp:
        run(args.trees, args.files, Path(tmp))


if __name__ == "__main__":
    main()

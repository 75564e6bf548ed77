"""Jobs' git worktrees on the command line: ``roomkeeper prune``, and the worktrees of ``batch``.

Both need no gateway: the registry is the journal in ROOMKEEPER_HOME, which
SQLite lets this process share with a running gateway.  A person's prune
removes every finished tree that may go (no low mark); a dry run removes
nothing and says what would go and why each protected tree stays.
"""

from __future__ import annotations

import os
import sys
import time

import click

from roomkeeper.batch.run import BatchWorktrees
from roomkeeper.errors import UsageError
from roomkeeper.gateway.home import open_journal
from roomkeeper.gateway.worktrees import history_writer, prune_now
from roomkeeper.jobs.spec import JobView
from roomkeeper.journal.database import Journal
from roomkeeper.kernel.identity import process_identity
from roomkeeper.paths import home_dir, workspace_dir
from roomkeeper.units import format_bytes
from roomkeeper.worktrees.pruner import Protection, PruneReport, WorktreeVerdict
from roomkeeper.worktrees.request import WorktreeRequest
from roomkeeper.worktrees.service import Worktrees, validate_worktree

REGISTER_TIMEOUT_S = 30.0

WHY = {
    Protection.JOB_ACTIVE: "its job is not finished (running, suspended, waiting or in doubt)",
    Protection.DISPATCHING: "its job is being dispatched now",
    Protection.CHANGES: "git status shows changed or untracked files",
    Protection.STASH: "it has stash entries",
    Protection.UNPUSHED: "its HEAD is on no other branch and no remote-tracking branch",
    Protection.UNINSPECTABLE: "git could not inspect it",
}


def parse_worktree(text: str) -> WorktreeRequest:
    """``REPO[:BRANCH]`` as ``run --worktree`` takes it (git forbids ':' in a branch name,
    so the last ':' is the separator); the repository made absolute.

    Raises:
        UsageError: an empty repository or branch.
    """
    repo, sep, branch = text.rpartition(":")
    if not sep:
        repo, branch = text, ""
    if not repo or (sep and not branch):
        raise UsageError(
            f"--worktree takes REPO or REPO:BRANCH (got {text!r})", name="--worktree", value=text
        )
    return WorktreeRequest(os.path.abspath(repo), branch or None)


def batch_worktrees(repo: str, journal: Journal) -> BatchWorktrees:
    """One tree per batch line, registered in ``journal``.

    Raises:
        WorktreeError: REPO is no repository, or its base is dirty: said before any line starts.
    """
    request = WorktreeRequest(os.path.abspath(repo))
    validate_worktree(request, workspace_dir())

    owner = process_identity()  # a killed batch's rows stop protecting its trees

    def register(view: JobView) -> None:
        journal.record_worktree(view, owner).result(timeout=REGISTER_TIMEOUT_S)

    def follow(view: JobView) -> None:
        if view.worktree is not None:
            journal.record_worktree_state(view)

    return BatchWorktrees(
        repo=request.repo,
        run_id=f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
        service=Worktrees(
            workspace=workspace_dir, registry=journal, on_prune=history_writer(journal)
        ),
        register=register,
        follow=follow,
    )


def _line(verdict: WorktreeVerdict, verb: str) -> str:
    tree = verdict.tree
    said = (
        f"{verb} {tree.path} (job {tree.job_id}, {tree.state}, {format_bytes(verdict.size_bytes)})"
    )
    if verdict.protection is not None:
        said += f": {verdict.protection.value}, {WHY[verdict.protection]}"
    elif verb == "keeps":
        said += ": not needed, the prune was done before its turn"
    return said


def show_report(report: PruneReport) -> None:
    """What went (or would), and why each tree that stays stays."""
    for verdict in report.removed:
        click.echo(_line(verdict, "would remove" if report.dry_run else "removed"))
    for verdict in report.kept:
        click.echo(_line(verdict, "keeps"))
    verb = "would remove" if report.dry_run else "removed"
    click.echo(
        f"roomkeeper prune: {verb} {len(report.removed)} tree(s), "
        f"{format_bytes(report.freed_bytes)}; kept {len(report.kept)}",
        err=True,
    )


@click.command()
@click.option("--dry-run", is_flag=True, help="Remove nothing; show what would go and why.")
def prune(dry_run: bool) -> None:
    """Remove finished jobs' git worktrees that hold no work of anyone's.

    A tree stays while its job is not finished, while it has changed or
    untracked files, stash entries, or commits on no other branch; each
    tree that stays says why. Branches are kept. Exits 1, removing nothing,
    when the registry in ROOMKEEPER_HOME cannot be read.
    """
    home = home_dir()
    try:
        journal = open_journal(home, os.environ)
    except Exception as err:  # an unreadable registry protects nobody: prune nothing
        click.echo(
            f"roomkeeper prune: the worktree registry could not be read "
            f"({type(err).__name__}: {err}); nothing was removed",
            err=True,
        )
        sys.exit(1)
    try:
        report = prune_now(journal, workspace_dir(), dry_run=dry_run)
    finally:
        journal.close()
    if report.refused is not None:
        click.echo(f"roomkeeper prune: {report.refused}; nothing was removed", err=True)
        sys.exit(1)
    show_report(report)


# The command's first name, kept so that scripts written for it still run.
reap = click.Command(
    "reap", callback=prune.callback, params=prune.params, help=prune.help, hidden=True
)

"""The disk pruner: remove finished jobs' trees, oldest first, and never anyone's work.

A pruner must never guess which trees are running (say, "the newest six")
nor check for changes with a command that misses untracked files.
Here every protection is a named pure check, asked in this order:

1. :func:`registry_protection`: the registry (the journal) says the tree's
   job is running, suspended, waiting or in doubt: anything but settled.
2. :func:`dispatch_protection`: the tree of the job being dispatched now
   (a re-dispatch must never prune its own tree).
3. :func:`changes_protection`: ``git status --porcelain --untracked-files=all``
   shows anything.
4. :func:`stash_protection`: a stash entry was made on the tree's branch.
5. :func:`unpushed_protection`: HEAD is on no other branch and no
   remote-tracking branch.

A tree git cannot inspect is kept too.  The prune removes unprotected trees
oldest first and stops at its low mark (free space the caller names: the
guard's own line, or the creation prune's mark), so it never takes more than
was asked.  An unreadable registry prunes nothing, and says so, instead of
protecting nobody.  Trees are removed with ``git worktree remove`` (never
``--force``) and their branches are kept: a later attempt on the same branch
finds every commit.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from roomkeeper.kernel.resources import read_disk
from roomkeeper.units import format_bytes
from roomkeeper.worktrees.git import git

log = logging.getLogger("roomkeeper")


class Protection(enum.Enum):
    """Why a tree stays."""

    JOB_ACTIVE = "job_active"  # its job is running, suspended, waiting or in doubt
    DISPATCHING = "dispatching"  # its job is being dispatched right now
    CHANGES = "changes"  # git status shows changed or untracked files
    STASH = "stash"  # stash entries were made on it
    UNPUSHED = "unpushed"  # its HEAD is on no other branch and no remote-tracking branch
    UNINSPECTABLE = "uninspectable"  # git could not say: kept


@dataclass(frozen=True, slots=True)
class RegisteredWorktree:
    """One tree as the registry keeps it.

    Attributes:
        path: the tree's directory.
        repo: the repository's top level.
        branch: the tree's branch.
        job_id: the job it belongs to (the latest that used it).
        state: that job's state, as the journal says it now (shown; the protect
            set is the registry's own lookup, :meth:`Registry.protected_paths`).
        registered_at: when the job took the tree (wall-clock seconds): the prune's order.
    """

    path: str
    repo: str
    branch: str
    job_id: str
    state: str
    registered_at: float


@dataclass(frozen=True, slots=True)
class WorktreeFacts:
    """What git says of one tree.

    Attributes:
        inspected: whether git answered every question (else the tree is kept).
        changes: lines ``git status --porcelain --untracked-files=all`` printed.
        stashes: stash entries made on the tree's branch.
        pushed: whether HEAD is on another branch or a remote-tracking branch.
    """

    inspected: bool
    changes: int = 0
    stashes: int = 0
    pushed: bool = False


@dataclass(frozen=True, slots=True)
class WorktreeVerdict:
    """One tree, its size, and why it stays (None: it may go)."""

    tree: RegisteredWorktree
    size_bytes: int
    protection: Protection | None


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What one prune did.

    Attributes:
        removed: the trees removed (or, in a dry run, that would be).
        kept: the trees that stay, each with its protection (None: the low mark
            was reached before its turn).
        freed_bytes: what the removed trees took.
        refused: why nothing was pruned (the registry could not be read), else None.
        dry_run: nothing was removed; ``removed`` is what would have gone.
    """

    removed: tuple[WorktreeVerdict, ...]
    kept: tuple[WorktreeVerdict, ...]
    freed_bytes: int
    refused: str | None = None
    dry_run: bool = False


class Registry(Protocol):
    """The registry's reads and its one write, as the pruner needs them (the journal's)."""

    def registered_worktrees(self) -> list[RegisteredWorktree]:
        """Every registered tree with its job's state now."""
        ...

    def protected_paths(self) -> frozenset[str]:
        """The trees whose jobs are not settled: running, suspended, waiting, in doubt."""
        ...

    def forget_worktree(self, path: str) -> object:
        """Drop a removed tree's row."""
        ...


# ------------------------------------------------------------ the checks


def registry_protection(tree: RegisteredWorktree, protect: frozenset[str]) -> Protection | None:
    """The protect set the journal gave: a tree whose job is not settled stays."""
    return Protection.JOB_ACTIVE if tree.path in protect else None


def dispatch_protection(tree: RegisteredWorktree, dispatching: frozenset[str]) -> Protection | None:
    """The tree of the job being dispatched stays (a re-dispatch reuses it)."""
    return Protection.DISPATCHING if tree.path in dispatching else None


def changes_protection(facts: WorktreeFacts) -> Protection | None:
    """Anything git status shows, untracked files included, keeps the tree."""
    return Protection.CHANGES if facts.changes else None


def stash_protection(facts: WorktreeFacts) -> Protection | None:
    """A stash entry made on the tree keeps it (stashes live in the repository, not the tree)."""
    return Protection.STASH if facts.stashes else None


def unpushed_protection(facts: WorktreeFacts) -> Protection | None:
    """A HEAD on no other branch and no remote-tracking branch keeps the tree."""
    return Protection.UNPUSHED if not facts.pushed else None


def git_protection(facts: WorktreeFacts) -> Protection | None:
    """The checks git answers, in order; a tree git could not inspect stays."""
    if not facts.inspected:
        return Protection.UNINSPECTABLE
    for check in (changes_protection, stash_protection, unpushed_protection):
        found = check(facts)
        if found is not None:
            return found
    return None


# ------------------------------------------------------------ what git says


def inspect_worktree(tree: RegisteredWorktree) -> WorktreeFacts:
    """Ask git about one tree: changes (untracked included), stashes, whether HEAD is pushed."""
    if not os.path.isdir(tree.path):
        return WorktreeFacts(inspected=False)
    status = git(tree.path, "status", "--porcelain", "--untracked-files=all")
    head = git(tree.path, "rev-parse", "HEAD")
    stashes = git(tree.path, "stash", "list", "--format=%gs")
    holders = git(
        tree.path,
        "for-each-ref",
        "--contains",
        "HEAD",
        "--format=%(refname)",
        "refs/heads",
        "refs/remotes",
    )
    if not (status.ok and head.ok and stashes.ok and holders.ok):
        return WorktreeFacts(inspected=False)
    own = f"refs/heads/{tree.branch}"
    return WorktreeFacts(
        inspected=True,
        changes=sum(1 for line in status.out.splitlines() if line.strip()),
        stashes=_stashes_of(stashes.out, tree.branch),
        pushed=any(ref and ref != own for ref in holders.out.splitlines()),
    )


def _stashes_of(listing: str, branch: str) -> int:
    """Stash entries made on ``branch``: git names the branch in each entry's subject
    (``WIP on B: ...`` or ``On B: ...``).  Stashes live in the repository, shared by
    every tree, so the parent commit alone would blame every tree cut from the same base."""
    marks = (f"WIP on {branch}:", f"On {branch}:")
    return sum(1 for line in listing.splitlines() if line.startswith(marks))


def worktree_size(path: str) -> int:
    """Bytes the tree takes on disk (allocated blocks, links not followed)."""
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def judge(
    tree: RegisteredWorktree,
    protect: frozenset[str],
    dispatching: frozenset[str],
    inspect: Callable[[RegisteredWorktree], WorktreeFacts] = inspect_worktree,
) -> Protection | None:
    """Why ``tree`` stays, or None: the registry and the dispatch first, git only then."""
    found = registry_protection(tree, protect) or dispatch_protection(tree, dispatching)
    return found if found is not None else git_protection(inspect(tree))


# ------------------------------------------------------------- the prune


def survey(registry: Registry, dispatching: frozenset[str] = frozenset()) -> list[WorktreeVerdict]:
    """Every registered tree, oldest first, with its size and why it stays.

    Raises:
        Exception: whatever the registry raised when it could not be read.
    """
    return verdicts(registry.registered_worktrees(), registry.protected_paths(), dispatching)


def verdicts(
    trees: list[RegisteredWorktree], protect: frozenset[str], dispatching: frozenset[str]
) -> list[WorktreeVerdict]:
    """Each tree, oldest first, with its size and why it stays."""
    ordered = sorted(trees, key=lambda t: t.registered_at)
    return [
        WorktreeVerdict(t, worktree_size(t.path), judge(t, protect, dispatching)) for t in ordered
    ]


def prune(
    registry: Registry,
    *,
    volume: str | os.PathLike[str],
    target_free: int | None,
    dispatching: frozenset[str] = frozenset(),
    dry_run: bool = False,
    free_bytes: Callable[[], int | None] | None = None,
) -> PruneReport:
    """Remove unprotected trees, oldest first, until ``target_free`` bytes are free.

    Args:
        registry: which tree belongs to which job (the journal).
        volume: the workspace volume, whose free space is the low mark's measure.
        target_free: the low mark: stop once this much is free; None removes
            every tree that may go (a person's ``roomkeeper prune``).
        dispatching: the trees of jobs being dispatched now.
        dry_run: remove nothing; say what would go.
        free_bytes: reads free space now; ``statvfs`` of ``volume`` when omitted.
    """
    read_free = free_bytes or (lambda: read_disk(volume).free_bytes)
    try:
        trees = registry.registered_worktrees()
        protect = registry.protected_paths()
    except Exception as err:  # an unreadable registry protects nobody: prune nothing
        said = f"the worktree registry could not be read ({type(err).__name__}: {err})"
        log.error("reap refused: %s; no tree was removed", said)
        return PruneReport((), (), 0, refused=said, dry_run=dry_run)
    removed: list[WorktreeVerdict] = []
    kept: list[WorktreeVerdict] = []
    freed = 0
    for verdict in verdicts(trees, protect, dispatching):
        if verdict.protection is not None or _low_mark_reached(
            read_free, freed, target_free, dry_run
        ):
            kept.append(verdict)
            continue
        if dry_run or _remove(registry, verdict.tree):
            removed.append(verdict)
            freed += verdict.size_bytes
        else:
            kept.append(replace(verdict, protection=Protection.UNINSPECTABLE))
    report = PruneReport(tuple(removed), tuple(kept), freed, dry_run=dry_run)
    _log(report)
    return report


def _low_mark_reached(
    read_free: Callable[[], int | None], freed: int, target_free: int | None, dry_run: bool
) -> bool:
    """Whether the prune has done what it was asked (a dry run counts what it would free)."""
    if target_free is None:
        return False
    free = read_free()
    if free is None:
        return True  # the volume cannot be measured: a prune for room stops, not guesses
    return free + (freed if dry_run else 0) >= target_free


def _remove(registry: Registry, tree: RegisteredWorktree) -> bool:
    """``git worktree remove`` (no ``--force``: git refuses a tree with changes too)."""
    if os.path.isdir(tree.path):
        done = git(tree.repo, "worktree", "remove", tree.path)
        if not done.ok:
            log.warning("reap kept tree of job %s: git said %s", tree.job_id, done.said())
            return False
        git(tree.repo, "worktree", "prune")
    registry.forget_worktree(tree.path)
    parent = Path(tree.path).parent
    if parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()  # the repository's folder, once its last tree is gone
    return True


def _log(report: PruneReport) -> None:
    """One line: what went, what it freed, and why the rest stayed (counts per reason)."""
    reasons: dict[str, int] = {}
    for verdict in report.kept:
        key = verdict.protection.value if verdict.protection else "low_mark"
        reasons[key] = reasons.get(key, 0) + 1
    why = ", ".join(f"{n} {k}" for k, n in sorted(reasons.items())) or "none"
    verb = "would remove" if report.dry_run else "removed"
    for verdict in report.removed:  # the log may name trees; the history gets numbers only
        log.info(
            "reap %s the tree of job %s (%s, %s)",
            verb,
            verdict.tree.job_id,
            verdict.tree.path,
            format_bytes(verdict.size_bytes),
        )
    log.info(
        "reap %s %d tree(s), %s %s; kept %d (%s)",
        verb,
        len(report.removed),
        "freeing" if report.dry_run else "freed",
        format_bytes(report.freed_bytes),
        len(report.kept),
        why,
    )

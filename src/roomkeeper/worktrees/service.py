"""Worktrees: a git worktree per job, made after admission and before the command starts.

A job that asks for a worktree
gets one under ROOMKEEPER_WORKSPACE, on a branch named for the job
(``roomkeeper/<job id>``) or the branch it gave, and its command runs inside
it.  Running a job again under the same branch reuses the branch and
whatever an earlier attempt committed there: a tree still there is reused
as it is, a branch without a tree is checked out again, and nothing is ever
cut afresh with ``-B`` (a re-dispatch that cut the branch afresh would lose its previous attempt's
unpushed commit that way).

What cannot work is said before anything starts, by
:func:`validate_worktree` at submission and again when the tree is made: a path
that is no repository, a branch checked out in another tree, a dirty base.

:class:`Worktrees` is what a scheduler calls: :meth:`Worktrees.prepare`
(prune first above ROOMKEEPER_REAP_AT_PERCENT, then make or reuse the tree)
and :meth:`Worktrees.reclaim` (the guard's one prune before it refuses for
disk, which stops at the guard's own line).  Both protect the tree of the job
being dispatched; the rest of the protect set comes from the registry
(:mod:`roomkeeper.worktrees.pruner`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from roomkeeper.config import read_reap_at_percent
from roomkeeper.errors import WorktreeError
from roomkeeper.guard.rule import Decision
from roomkeeper.kernel.resources import read_disk
from roomkeeper.worktrees.git import git
from roomkeeper.worktrees.pruner import PruneReport, Registry, prune
from roomkeeper.worktrees.request import Worktree, WorktreeJob, WorktreeRequest

log = logging.getLogger("roomkeeper")

BRANCH_PREFIX = "roomkeeper/"
WORKTREES_DIR = "worktrees"
# Fire at 80 % used, stop at 55 %: the creation prune
# keeps that gap below ROOMKEEPER_REAP_AT_PERCENT, so it is not asked again at once.
REAP_HYSTERESIS_PERCENT = 25.0


@dataclass(frozen=True, slots=True)
class WorktreePlan:
    """Where a job's tree goes and on which branch, before anything is made.

    Attributes:
        root: the repository's top level.
        branch: the branch the tree is on.
        path: the tree's directory under the workspace.
        branch_exists: whether the branch is already there (then it is reused, never reset).
        in_place: whether a tree of this repository is already at ``path`` on ``branch``.
    """

    root: str
    branch: str
    path: str
    branch_exists: bool
    in_place: bool


def job_branch(job_id: str, request: WorktreeRequest) -> str:
    """The branch a job's tree is on: the one it gave, else ``roomkeeper/<job id>``."""
    return request.branch or f"{BRANCH_PREFIX}{job_id}"


def worktree_path(workspace: str | os.PathLike[str], root: str, branch: str) -> str:
    """The directory of ``branch``'s tree of the repository at ``root``.

    One folder per repository (its name and a hash of its path, so two
    repositories of the same name never share one), one tree per branch.
    """
    repo_dir = f"{os.path.basename(root) or 'repo'}-{hashlib.sha1(root.encode()).hexdigest()[:8]}"
    return str(Path(workspace, WORKTREES_DIR, repo_dir, branch.replace("/", "-")))


def repository_root(repo: str) -> str:
    """The top level of the repository ``repo`` lies in.

    Raises:
        WorktreeError: ``not_a_repository``, saying what git said.
    """
    if not os.path.isdir(repo):
        raise WorktreeError(
            f"worktree.repo {repo!r} is not an existing directory; give a git repository's path",
            reason="not_a_repository",
            repo=repo,
        )
    found = git(repo, "rev-parse", "--show-toplevel")
    if not found.ok or not found.out.strip():
        raise WorktreeError(
            f"worktree.repo {repo!r} is not a git repository ({found.said()}); "
            "give the path of one (git init makes one)",
            reason="not_a_repository",
            repo=repo,
        )
    return os.path.realpath(found.out.strip())


def checked_out(root: str) -> dict[str, str]:
    """Every branch checked out in one of the repository's trees: branch -> tree path."""
    git(root, "worktree", "prune")  # forget trees whose directory is gone
    listed = git(root, "worktree", "list", "--porcelain")
    where: dict[str, str] = {}
    path = ""
    for line in listed.out.splitlines():
        if line.startswith("worktree "):
            path = os.path.realpath(line.removeprefix("worktree "))
        elif line.startswith("branch refs/heads/"):
            where[line.removeprefix("branch refs/heads/")] = path
    return where


def plan_worktree(
    request: WorktreeRequest, branch: str, workspace: str | os.PathLike[str]
) -> WorktreePlan:
    """Where ``request``'s tree goes and whether it can be made there.

    Raises:
        WorktreeError: not a repository, an invalid branch name, the branch
            checked out in another tree, or (for a new branch) a dirty base.
    """
    root = repository_root(request.repo)
    if not git(root, "check-ref-format", "--branch", branch).ok:
        raise WorktreeError(
            f"worktree.branch {branch!r} is not a valid branch name; see git check-ref-format",
            reason="invalid_branch",
            repo=request.repo,
        )
    path = worktree_path(workspace, root, branch)
    where = checked_out(root)
    elsewhere = where.get(branch)
    if elsewhere is not None and elsewhere != os.path.realpath(path):
        raise WorktreeError(
            f"branch {branch!r} is checked out in another tree ({elsewhere}); "
            "give another branch, or finish with that tree first",
            reason="branch_checked_out",
            repo=request.repo,
        )
    exists = git(root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}").ok
    if not exists:
        _require_clean_base(root, request.repo)
    return WorktreePlan(root, branch, path, exists, elsewhere is not None)


def _require_clean_base(root: str, repo: str) -> None:
    """A new branch is cut from the repository's HEAD: refuse when its tree has changes,
    which the new tree would silently lack."""
    status = git(root, "status", "--porcelain", "--untracked-files=all")
    if not status.ok:
        raise WorktreeError(
            f"the status of {root!r} could not be read ({status.said()})",
            reason="not_a_repository",
            repo=repo,
        )
    changes = [line for line in status.out.splitlines() if line.strip()]
    if changes:
        raise WorktreeError(
            f"the base {root!r} is dirty ({len(changes)} changed or untracked path(s), "
            f"first {changes[0][3:]!r}); commit or stash them, or name an existing branch",
            reason="dirty_base",
            repo=repo,
        )


def validate_worktree(request: WorktreeRequest, workspace: str | os.PathLike[str]) -> None:
    """What a submission can check before anything is queued (the branch named for the
    job is new, so its base must be clean).

    Raises:
        WorktreeError: the reason says which check failed.
    """
    if request.branch is not None:
        plan_worktree(request, request.branch, workspace)
        return
    _require_clean_base(repository_root(request.repo), request.repo)


def make_worktree(plan: WorktreePlan) -> Worktree:
    """Make (or reuse) the planned tree; an existing branch is checked out, never reset.

    Raises:
        WorktreeError: ``worktree_failed`` with git's words, or a directory in the way.
    """
    if plan.in_place:
        return Worktree(plan.path, plan.root, plan.branch, reused=True)
    if os.path.lexists(plan.path):
        raise WorktreeError(
            f"{plan.path!r} exists and is not a tree of branch {plan.branch!r}; move it away",
            reason="worktree_failed",
            repo=plan.root,
        )
    Path(plan.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if plan.branch_exists:  # the previous attempt's commits stay: no -B, ever
        made = git(plan.root, "worktree", "add", plan.path, plan.branch)
    else:
        made = git(plan.root, "worktree", "add", "-b", plan.branch, plan.path, "HEAD")
    if not made.ok:
        raise WorktreeError(
            f"git could not make the tree of {plan.branch!r}: {made.said()}",
            reason="worktree_failed",
            repo=plan.root,
        )
    return Worktree(plan.path, plan.root, plan.branch, reused=plan.branch_exists)


class Worktrees:
    """Make jobs' trees and prune finished ones, with one protect set.

    Args:
        workspace: ROOMKEEPER_WORKSPACE (the trees' volume); read from ``env`` when a callable.
        registry: which tree belongs to which job, and whether that job runs (the journal).
        on_prune: told of every prune that ran (the log and recovery history).
        env: the variables to read on every call (ROOMKEEPER_REAP_AT_PERCENT).
    """

    def __init__(
        self,
        *,
        workspace: Callable[[], Path],
        registry: Registry,
        on_prune: Callable[[PruneReport], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._workspace = workspace
        self._registry = registry
        self._on_prune = on_prune
        self._env = env

    def prepare(self, view: WorktreeJob) -> Worktree | None:
        """Make or reuse ``view``'s tree (None when it asked for none).

        Above ROOMKEEPER_REAP_AT_PERCENT used, finished trees are pruned first,
        down to that mark less :data:`REAP_HYSTERESIS_PERCENT`; the tree being
        made is protected.

        Raises:
            WorktreeError: the tree cannot be made; the job must not start.
        """
        request = view.spec.worktree
        if request is None:
            return None
        workspace = self._workspace()
        plan = plan_worktree(request, job_branch(view.id, request), workspace)
        if plan.in_place:
            self._refuse_if_in_use(plan, view.id)
        disk = read_disk(workspace)
        if disk.free_bytes is not None and disk.total_bytes:
            used = 100 * (disk.total_bytes - disk.free_bytes) / disk.total_bytes
            high = read_reap_at_percent(self._env)
            if used > high:
                low = max(0.0, high - REAP_HYSTERESIS_PERCENT)
                target = disk.total_bytes - int(disk.total_bytes * low / 100)
                self._prune(target, plan.path, workspace)
        return make_worktree(plan)

    def _refuse_if_in_use(self, plan: WorktreePlan, job_id: str) -> None:
        """A tree that another unsettled job holds is not shared: two jobs never run in one.

        Raises:
            WorktreeError: ``branch_checked_out`` naming the job, or ``worktree_failed``
                when the registry cannot say (a guess could put two jobs in one tree).
        """
        try:
            protected = self._registry.protected_paths()
            owners = [
                t.job_id for t in self._registry.registered_worktrees() if t.path == plan.path
            ]
        except Exception as err:
            raise WorktreeError(
                f"the worktree registry could not be read ({err}), so whether the tree of "
                f"{plan.branch!r} is in use is unknown; try again",
                reason="worktree_failed",
                repo=plan.root,
            ) from err
        if plan.path in protected and owners and owners[0] != job_id:
            raise WorktreeError(
                f"branch {plan.branch!r} is checked out in the tree of job {owners[0]}, which "
                "has not finished; wait for it, or give another branch",
                reason="branch_checked_out",
                repo=plan.root,
            )

    def reclaim(self, view: WorktreeJob, decision: Decision) -> bool:
        """The guard's one prune before it refuses for disk: down to its own line, no further.

        Returns:
            Whether anything was freed (then the guard judges again).
        """
        if decision.disk_needed_bytes is None:
            return False
        workspace = self._workspace()
        dispatching = None
        request = view.spec.worktree
        if request is not None:
            try:
                root = repository_root(request.repo)
            except WorktreeError:
                root = None
            if root is not None:
                dispatching = worktree_path(workspace, root, job_branch(view.id, request))
        report = self._prune(decision.disk_needed_bytes, dispatching, workspace)
        return report.freed_bytes > 0

    def reclaim_space(self, decision: Decision) -> bool:
        """The same prune for work that has no tree here (a lease): down to the guard's line."""
        if decision.disk_needed_bytes is None:
            return False
        report = self._prune(decision.disk_needed_bytes, None, self._workspace())
        return report.freed_bytes > 0

    def _prune(self, target_free: int, dispatching: str | None, workspace: Path) -> PruneReport:
        report = prune(
            self._registry,
            volume=workspace,
            target_free=target_free,
            dispatching=frozenset({dispatching} if dispatching else ()),
        )
        if self._on_prune is not None:
            self._on_prune(report)
        return report

"""What a job asks of the worktree service, and what it is given.

A job names a repository (and perhaps a branch); the service gives it a
:class:`Worktree` to run in.  :class:`WorktreeJob` is all the service needs of
a job: its id and its request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class WorktreeRequest:
    """A job's ask for a git worktree of a local repository.

    Attributes:
        repo: a path inside the repository (its working tree or a worktree of it).
        branch: the branch the tree is on; ``roomkeeper/<job id>`` when None.
    """

    repo: str
    branch: str | None = None


@dataclass(frozen=True, slots=True)
class Worktree:
    """A job's git worktree, made or reused under ROOMKEEPER_WORKSPACE.

    Attributes:
        path: the tree's directory: the command runs there.
        repo: the repository's top level.
        branch: the branch the tree is on.
        reused: whether the tree was already there (a re-dispatch), not made now.
    """

    path: str
    repo: str
    branch: str
    reused: bool = False


class _AsksForWorktree(Protocol):
    @property
    def worktree(self) -> WorktreeRequest | None: ...


class WorktreeJob(Protocol):
    """A job as the worktree service sees it: its id and its spec's worktree request."""

    @property
    def id(self) -> str: ...

    @property
    def spec(self) -> _AsksForWorktree: ...

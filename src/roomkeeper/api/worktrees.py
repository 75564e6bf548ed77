"""The worktree routes: ``GET /v1/workspaces``, jobs' git worktrees and why each stays."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, params

from roomkeeper.api.responses import RegisteredWorktreeOut
from roomkeeper.gateway.service import Gateway
from roomkeeper.gateway.worktrees import list_worktrees


def worktree_routes(gateway: Gateway, auth: Sequence[params.Depends]) -> APIRouter:
    """``/v1/workspaces`` for ``gateway``, behind ``auth``."""
    router = APIRouter()

    @router.get("/v1/workspaces", dependencies=auth, response_model=list[RegisteredWorktreeOut])
    def worktrees() -> list[RegisteredWorktreeOut]:
        """Every registered tree, oldest first, with its job, state, size and protection."""
        return [
            RegisteredWorktreeOut(
                path=v.tree.path,
                repo=v.tree.repo,
                branch=v.tree.branch,
                job_id=v.tree.job_id,
                state=v.tree.state,
                size_bytes=v.size_bytes,
                protection=v.protection.value if v.protection is not None else None,
                registered_at=v.tree.registered_at,
            )
            for v in list_worktrees(gateway.journal)
        ]

    return router

"""The gateway's worktrees: jobs' git worktrees with the journal as their registry.

Wires :class:`roomkeeper.worktrees.service.Worktrees` to the journal (the
registry, written in the jobs' own transactions) and says what each prune did
in the recovery history, in counts and bytes only: no path, no branch, no
job id (the history keeps numbers only).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.worktrees.pruner import PruneReport, WorktreeVerdict, prune, survey
from roomkeeper.worktrees.service import Worktrees


def prune_event(report: PruneReport) -> HistoryEvent:
    """The recovery-history event of one prune: numbers only."""
    if report.refused is not None:
        return HistoryEvent(time.time(), RecoveryCode.REAP_REFUSED, {"trees": 0})
    return HistoryEvent(
        time.time(),
        RecoveryCode.WORKSPACES_REAPED,
        {"trees": len(report.removed), "kept": len(report.kept), "freed_bytes": report.freed_bytes},
    )


def history_writer(
    journal: Journal, watch: Callable[[concurrent.futures.Future[None]], None] | None = None
) -> Callable[[PruneReport], None]:
    """What a prune calls when it is done: its event in the history (dry runs are not events)."""

    def record(report: PruneReport) -> None:
        if report.dry_run:
            return
        try:
            write = journal.record_history(prune_event(report))
        except Exception:  # the registry's journal may be the unreadable one
            return
        if watch is not None:
            watch(write)

    return record


def gateway_worktrees(
    *,
    journal: Journal,
    workspace: Path,
    env: Mapping[str, str],
    watch: Callable[[concurrent.futures.Future[None]], None] | None = None,
) -> Worktrees:
    """The scheduler's tree maker and disk pruner, over this journal's registry."""
    return Worktrees(
        workspace=lambda: workspace,
        registry=journal,
        on_prune=history_writer(journal, watch),
        env=env,
    )


def list_worktrees(journal: Journal) -> list[WorktreeVerdict]:
    """Every registered tree with its size and why it stays (``GET /v1/workspaces``)."""
    return survey(journal)


def prune_now(journal: Journal, workspace: Path, *, dry_run: bool) -> PruneReport:
    """A person's prune: every tree that may go (``roomkeeper prune``); a dry run removes none."""
    report = prune(journal, volume=workspace, target_free=None, dry_run=dry_run)
    history_writer(journal)(report)
    return report

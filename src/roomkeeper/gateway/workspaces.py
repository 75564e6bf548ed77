"""The gateway's workspaces: jobs' git worktrees with the journal as their registry.

Wires :class:`roomkeeper.worktrees.service.Workspaces` to the journal (the
registry, written in the jobs' own transactions) and says what each reap did
in the recovery history, in counts and bytes only: no path, no branch, no
job id (seed 002's rule for the history).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.worktrees.reaper import ReapReport, TreeVerdict, reap, survey
from roomkeeper.worktrees.service import Workspaces


def reap_event(report: ReapReport) -> HistoryEvent:
    """The recovery-history event of one reap: numbers only."""
    if report.refused is not None:
        return HistoryEvent(time.time(), RecoveryCode.REAP_REFUSED, {"trees": 0})
    return HistoryEvent(
        time.time(),
        RecoveryCode.WORKSPACES_REAPED,
        {"trees": len(report.removed), "kept": len(report.kept), "freed_bytes": report.freed_bytes},
    )


def history_writer(
    journal: Journal, watch: Callable[[concurrent.futures.Future[None]], None] | None = None
) -> Callable[[ReapReport], None]:
    """What a reap calls when it is done: its event in the history (dry runs are not events)."""

    def record(report: ReapReport) -> None:
        if report.dry_run:
            return
        try:
            write = journal.record_history(reap_event(report))
        except Exception:  # the registry's journal may be the unreadable one
            return
        if watch is not None:
            watch(write)

    return record


def gateway_workspaces(
    *,
    journal: Journal,
    workspace: Path,
    env: Mapping[str, str],
    watch: Callable[[concurrent.futures.Future[None]], None] | None = None,
) -> Workspaces:
    """The scheduler's tree maker and disk reaper, over this journal's registry."""
    return Workspaces(
        workspace=lambda: workspace,
        registry=journal,
        on_reap=history_writer(journal, watch),
        env=env,
    )


def list_trees(journal: Journal) -> list[TreeVerdict]:
    """Every registered tree with its size and why it stays (``GET /v1/workspaces``)."""
    return survey(journal)


def reap_now(journal: Journal, workspace: Path, *, dry_run: bool) -> ReapReport:
    """A person's reap: every tree that may go (``roomkeeper reap``); a dry run removes none."""
    report = reap(journal, volume=workspace, target_free=None, dry_run=dry_run)
    history_writer(journal)(report)
    return report

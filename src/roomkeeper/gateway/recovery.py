"""What a gateway does at start, before anything new is launched (save first).

1. Orphans: a managed tree of the previous run that somehow survived is
   stopped: by its recorded leader (pid *and* start time must match, so a
   reused pid is never touched) and by the job cgroups an earlier gateway
   process left under our own group.  Nothing else on the machine is touched.
2. Work in flight when the previous run died: a job that was launched (its
   pending marker is still there) is ``uncertain``, never re-run blindly,
   unless it was submitted as resumable: then it is ``deferred``.  A job that
   was still waiting had not started: it is deferred too, and so is queued
   work an orderly shutdown cancelled (reason ``shutdown``).  Registered calls
   that were pending are uncertain.  Work a person cancelled or stopped stays
   so, even when the crash came before its new state was saved (the request
   itself is saved first, as ``stop_requested``).
3. Records lost: a job log with no job record means the journal lost the
   writes that named it (a damaged WAL keeps only what was written before
   the damage).  Those jobs are reported, by log file, never silently dropped.
4. Every step is a recovery event in the history: codes and numbers only.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from roomkeeper.jobs.spec import JobState
from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.journal.jobs import STOP_REQUESTED
from roomkeeper.kernel.cgroup_hierarchy import remove_group
from roomkeeper.kernel.freezer import FreezerGroup
from roomkeeper.kernel.job_cgroups import stale_job_cgroups
from roomkeeper.kernel.proc import cgroup_members, kill_cgroup

log = logging.getLogger("roomkeeper")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What start-up recovery found and did."""

    crashed: bool
    orphan_pids: int
    orphan_groups: int
    uncertain_jobs: int
    deferred_jobs: int
    uncertain_calls: int
    lost_records: int = 0


def logs_without_records(known_ids: set[str], logs_dir: Path) -> list[Path]:
    """The job logs in ``logs_dir`` whose job the journal has no record of, oldest first.

    A deleted job's log goes with its record, so a log alone is a record lost.
    """
    try:
        logs = [p for p in logs_dir.iterdir() if p.suffix == ".log" and p.is_file()]
    except OSError:
        return []
    lost = [p for p in logs if p.stem not in known_ids]
    return sorted(lost, key=lambda p: p.stat().st_mtime)


def _kill_recorded_leader(pid: int, started: float) -> int:
    """SIGKILL a previous run's job session, if its leader is still that very process."""
    try:
        leader = psutil.Process(pid)
        if abs(leader.create_time() - started) > 0.01:
            return 0  # the pid was reused by something that is not ours
        members = [leader]
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, OSError):
                if proc.pid != pid and os.getsid(proc.pid) == pid:
                    members.append(proc)
    except psutil.Error:
        return 0
    for proc in members:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    return len(members)


def kill_stale_groups(previous_pid: int | None) -> tuple[int, int]:
    """Empty and remove the job cgroups the previous gateway process (by its pid) left behind.

    Its memory groups and, on cgroup v1, its freezer groups: a job suspended
    when it died sits FROZEN there, and a frozen task cannot die until its
    group is thawed.  Only that run's groups: other gateways, batches or runs
    sharing this cgroup are never touched.
    """
    if previous_pid is None or previous_pid == os.getpid():
        return 0, 0
    stale = stale_job_cgroups(previous_pid)
    pids: set[int] = set()
    for directory in stale:
        members = cgroup_members(directory)
        pids |= members
        if not kill_cgroup(directory):  # no cgroup.kill (v1, or v2 before Linux 5.14)
            for pid in members:  # in a group that run made for its jobs: theirs
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    freezers = [d for d in stale if os.path.exists(os.path.join(d, "freezer.state"))]
    # Freezer groups first: each thaws as it goes, so the SIGKILLs land.
    groups = sum(FreezerGroup(d).remove() for d in freezers)
    groups += sum(remove_group(d) for d in stale if d not in freezers)
    return len(pids), groups


def recover(
    journal: Journal,
    *,
    crashed: bool,
    previous_pid: int | None = None,
    logs_dir: Path | None = None,
) -> RecoveryReport:
    """Stop orphans, settle the previous run's work in flight, find records lost; record
    what happened."""
    now = time.time()
    orphan_pids, groups = _stop_orphans(journal, previous_pid)
    uncertain, deferred, writes = _settle_jobs_in_flight(journal, now)
    calls = journal.mark_calls_uncertain()
    lost = [] if logs_dir is None else logs_without_records(journal.job_ids(), logs_dir)
    if lost:
        log.error(
            "the journal has no record of %d job(s) whose logs remain (its last writes were "
            "lost, e.g. a damaged WAL): %s; their outcome is unknown: read the logs, and "
            "`roomkeeper journal check` lists them",
            len(lost),
            ", ".join(str(p) for p in lost[:10]) + (" …" if len(lost) > 10 else ""),
        )
    report = RecoveryReport(
        crashed, orphan_pids, groups, uncertain, deferred, calls.result(), len(lost)
    )
    history = [journal.record_history(e) for e in _events(report, now)]
    for future in [*writes, *history]:
        future.result()  # start-up waits: what it decided must be durable (or it raises)
    _log(report)
    return report


def _stop_orphans(journal: Journal, previous_pid: int | None) -> tuple[int, int]:
    """Stop the previous run's surviving trees: by recorded leader, then by its job cgroups."""
    leaders = journal.running_leaders()
    orphan_pids = sum(_kill_recorded_leader(r.pid, r.started or 0) for r in leaders)
    group_pids, groups = kill_stale_groups(previous_pid)
    return orphan_pids + group_pids, groups


def _settle_jobs_in_flight(
    journal: Journal, now: float
) -> tuple[int, int, list[concurrent.futures.Future[None]]]:
    """Settle each job the previous run left in flight; (uncertain, deferred, the writes)."""
    uncertain = deferred = 0
    writes = []
    for job in journal.jobs_in_flight():
        was_launched = job.marked or job.state in ("running", "suspended", "stopped")
        if job.reason == STOP_REQUESTED:  # a person asked: it stays stopped
            state = JobState.STOPPED
            if job.state == "waiting" and not was_launched:
                state = JobState.CANCELLED
            writes.append(journal.settle_stop_request(job.id, state=state, at=now))
        elif job.reason == "shutdown" and job.state == "stopped" and not job.resumable:
            # Stopped by an orderly shutdown, and not safe to run again: it stays stopped.
            writes.append(journal.keep_stopped(job.id))
        elif was_launched and not job.resumable:
            writes.append(journal.mark_uncertain(job.id, at=now))
            uncertain += 1
        else:  # resumable, or never started: safe to run (again), under a new marker
            writes.append(journal.defer_job(job.id, at=now))
            deferred += 1
    return uncertain, deferred, writes


def _events(report: RecoveryReport, now: float) -> list[HistoryEvent]:
    """The recovery events of this start: codes and numbers only."""
    events = [HistoryEvent(now, RecoveryCode.GATEWAY_STARTED, {})]
    if report.crashed:
        events.append(HistoryEvent(now, RecoveryCode.CRASH_DETECTED, {}))
    if report.orphan_pids or report.orphan_groups:
        numbers = {"pids": report.orphan_pids, "groups": report.orphan_groups}
        events.append(HistoryEvent(now, RecoveryCode.ORPHANS_STOPPED, numbers))
    if report.uncertain_jobs or report.uncertain_calls:
        numbers = {"jobs": report.uncertain_jobs, "calls": report.uncertain_calls}
        events.append(HistoryEvent(now, RecoveryCode.MARKED_UNCERTAIN, numbers))
    if report.deferred_jobs:
        events.append(HistoryEvent(now, RecoveryCode.DEFERRED, {"jobs": report.deferred_jobs}))
    if report.lost_records:
        numbers = {"jobs": report.lost_records}
        events.append(HistoryEvent(now, RecoveryCode.RECORDS_LOST, numbers))
    return events


def _log(report: RecoveryReport) -> None:
    if (
        report.orphan_pids
        or report.uncertain_jobs
        or report.deferred_jobs
        or report.uncertain_calls
    ):
        log.warning(
            "recovered the previous run: %d orphan process(es) stopped, %d job(s) uncertain, "
            "%d deferred, %d call(s) uncertain",
            report.orphan_pids,
            report.uncertain_jobs,
            report.deferred_jobs,
            report.uncertain_calls,
        )

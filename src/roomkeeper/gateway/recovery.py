"""What a gateway does at start, before anything new is launched (seed 002: save first).

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
3. Every step is a recovery event in the history: codes and numbers only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass

import psutil

from roomkeeper.errors import KernelFileError
from roomkeeper.jobs.lifeline import cgroup_members, kill_cgroup
from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.kernel.job_cgroups import job_cgroup_parent

log = logging.getLogger("roomkeeper")

JOB_CGROUP_PREFIX = "roomkeeper-"


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What start-up recovery found and did."""

    crashed: bool
    orphan_pids: int
    orphan_groups: int
    uncertain_jobs: int
    deferred_jobs: int
    uncertain_calls: int


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


def _kill_stale_groups(previous_pid: int | None) -> tuple[int, int]:
    """Empty and remove the job cgroups the previous gateway process (by its pid) left behind.

    Only that run's groups: other gateways, batches or runs sharing this
    cgroup are never touched.
    """
    if previous_pid is None or previous_pid == os.getpid():
        return 0, 0
    try:
        own = job_cgroup_parent()
    except (OSError, KernelFileError):
        return 0, 0
    if own is None:
        return 0, 0
    theirs = f"{JOB_CGROUP_PREFIX}{previous_pid}-"
    pids = groups = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(own.directory):
            if not name.startswith(theirs):
                continue
            directory = os.path.join(own.directory, name)
            if not os.path.isdir(directory):
                continue
            pids += len(cgroup_members(directory))
            kill_cgroup(directory)
            for _ in range(100):
                try:
                    os.rmdir(directory)
                    groups += 1
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
    return pids, groups


def recover(journal: Journal, *, crashed: bool, previous_pid: int | None = None) -> RecoveryReport:
    """Stop orphans, then settle the previous run's work in flight; record what happened."""
    now = time.time()
    leaders = journal.query(
        "SELECT pid, pid_started FROM jobs WHERE state = 'running' AND pid IS NOT NULL"
    )
    orphan_pids = sum(_kill_recorded_leader(r["pid"], r["pid_started"] or 0) for r in leaders)
    group_pids, groups = _kill_stale_groups(previous_pid)
    orphan_pids += group_pids

    launched = {r["id"] for r in journal.query("SELECT id FROM markers WHERE kind = 'job'")}
    uncertain = deferred = 0
    writes = []
    rows = journal.query(
        "SELECT id, state, reason, resumable FROM jobs WHERE state IN ('waiting', 'running') "
        "OR (reason = 'shutdown' AND state IN ('cancelled', 'stopped'))"
    )
    for row in rows:
        was_launched = row["id"] in launched or row["state"] in ("running", "stopped")
        if row["reason"] == "stop_requested":  # a person asked: it stays stopped
            state = "cancelled" if row["state"] == "waiting" and not was_launched else "stopped"
            writes.append(
                journal.execute(
                    "UPDATE jobs SET state=?, ended_at=? WHERE id=?", (state, now, row["id"])
                )
            )
            writes.append(
                journal.execute("DELETE FROM markers WHERE kind='job' AND id=?", (row["id"],))
            )
            continue
        if row["reason"] == "shutdown" and row["state"] == "stopped" and not row["resumable"]:
            # Stopped by an orderly shutdown, and not safe to run again: it stays stopped.
            writes.append(journal.execute("UPDATE jobs SET reason=NULL WHERE id=?", (row["id"],)))
            continue
        if was_launched and not row["resumable"]:
            state = "uncertain"
            uncertain += 1
        else:
            state = "deferred"  # resumable, or never started: safe to run (again)
            deferred += 1
        # ended_at stays empty: an uncertain job's end is not known.
        writes.append(
            journal.execute(
                "UPDATE jobs SET state=?, reason=NULL, ended_at=NULL WHERE id=?", (state, row["id"])
            )
        )
        writes.append(
            journal.execute(
                "INSERT INTO job_events VALUES (?,?,?,?)", (row["id"], state, None, now)
            )
        )
        if state == "deferred":  # it will be launched again under a new marker
            writes.append(
                journal.execute("DELETE FROM markers WHERE kind='job' AND id=?", (row["id"],))
            )
    calls = journal.query("SELECT id FROM calls WHERE state = 'pending'")
    for row in calls:
        writes.append(
            journal.execute("UPDATE calls SET state='uncertain' WHERE id=?", (row["id"],))
        )

    report = RecoveryReport(crashed, orphan_pids, groups, uncertain, deferred, len(calls))
    events = [HistoryEvent(now, RecoveryCode.GATEWAY_STARTED, {})]
    if crashed:
        events.append(HistoryEvent(now, RecoveryCode.CRASH_DETECTED, {}))
    if orphan_pids or groups:
        events.append(
            HistoryEvent(now, RecoveryCode.ORPHANS_STOPPED, {"pids": orphan_pids, "groups": groups})
        )
    if uncertain or calls:
        events.append(
            HistoryEvent(
                now, RecoveryCode.MARKED_UNCERTAIN, {"jobs": uncertain, "calls": len(calls)}
            )
        )
    if deferred:
        events.append(HistoryEvent(now, RecoveryCode.DEFERRED, {"jobs": deferred}))
    futures = writes + [journal.record_history(e) for e in events]
    for future in futures:
        future.result()  # start-up waits: what it decided must be durable (or it raises)
    if orphan_pids or uncertain or deferred or calls:
        log.warning(
            "recovered the previous run: %d orphan process(es) stopped, %d job(s) uncertain, "
            "%d deferred, %d call(s) uncertain",
            orphan_pids,
            uncertain,
            deferred,
            len(calls),
        )
    return report

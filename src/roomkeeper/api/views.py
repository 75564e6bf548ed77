"""How records and the gateway's state look over the HTTP API: JSON shaping only.

The routes in :mod:`roomkeeper.api.app`, :mod:`roomkeeper.api.jobs` and
:mod:`roomkeeper.api.leases` answer with these dicts; nothing here routes,
authorizes or changes the gateway.
"""

from __future__ import annotations

import enum
import os
import time
from typing import Any

from roomkeeper.gateway.calls import CallView
from roomkeeper.gateway.headlines import HEADLINES, PERSON_HEADLINES
from roomkeeper.gateway.samples import Sample
from roomkeeper.gateway.service import Gateway
from roomkeeper.guard.leases import LeaseView, lease_fields
from roomkeeper.guard.rule import Decision
from roomkeeper.jobs.spec import JobState, JobView
from roomkeeper.jobserver.meter import JobserverStatistics
from roomkeeper.journal.jobs import JobRow
from roomkeeper.loopback.hooks import ReleaseHook
from roomkeeper.relief.ladder import PressureReason

LAST_OUTPUT_BYTES = 500
FEED_JOBS = 50  # this run's newest jobs on the Health page
FEED_IN_DOUBT = 25  # of each kind of work in doubt that an earlier run left
FEED_RECOVERIES = 20
JOB_FIELDS = (
    "id",
    "owner",
    "state",
    "reason",
    "exit_code",
    "argv",
    "submitted_at",
    "started_at",
    "ended_at",
    "peak_bytes",
    "error",
    "memory_policy",
    "estimate_bytes",
    "estimate_source",
)


def tokens_json(stats: JobserverStatistics | None) -> dict[str, Any] | None:
    """A running job's jobserver as the API shows it: tokens out, the step estimate and why
    no more tokens were given ("no room: ..."); None without one."""
    if stats is None:
        return None
    return {
        "tokens_out": stats.tokens_out,
        "idle": stats.idle,
        "minted": stats.minted,
        "steps": stats.steps,
        "step_bytes": stats.step_bytes,
        "step_source": stats.step_source.value,
        "claim_bytes": stats.claim_bytes,
        "reason": stats.reason.value,
        "summary": stats.summary,
        "lost": stats.lost,
        "unread": stats.unread,
        "taken_back": stats.taken_back,
        "paused": stats.paused,
        "largest_step_bytes": stats.largest_step_bytes,
    }


def job_json(view: JobView, tokens: JobserverStatistics | None = None) -> dict[str, Any]:
    """A live job as the API shows it (the same fields as a journal row), with its
    jobserver's tokens while it runs with one."""
    return {
        "id": view.id,
        "owner": view.owner,
        "state": view.state.value,
        "reason": view.reason.value if view.reason else None,
        "exit_code": view.exit_code,
        "argv": list(view.spec.argv),
        "submitted_at": view.submitted_at,
        "started_at": view.started_at,
        "ended_at": view.ended_at,
        "peak_bytes": view.peak_bytes,
        "error": view.error,
        # The tree it asked for (its path is in GET /v1/workspaces once made).
        "worktree": None
        if view.spec.worktree is None
        else {"repo": view.spec.worktree.repo, "branch": view.spec.worktree.branch},
        "memory_policy": view.spec.memory_policy.value,
        "estimate_bytes": view.estimate_bytes,
        "estimate_source": view.estimate_source.value,  # stated, learned, default, re-run
        "shape_bytes": view.spec.shape_bytes,  # what its trial is expected to grow to
        "kind": view.spec.kind,
        "jobserver": view.spec.jobserver,
        "tokens": tokens_json(tokens),
    }


def row_json(row: JobRow) -> dict[str, Any]:
    """A job of an earlier run, from the journal."""
    fields = {k: getattr(row, k) for k in JOB_FIELDS if k != "argv"}
    answer = {
        **fields,
        "argv": row.spec.get("argv", []),
        "worktree": row.spec.get("worktree"),
        "kind": row.spec.get("kind"),
        "shape_bytes": row.spec.get("shape_bytes"),
        "jobserver": bool(row.spec.get("jobserver")),
        "tokens": None,  # a job of an earlier run holds no tokens now
        "resolution": row.resolution,
    }
    if row.state == JobState.UNCERTAIN.value:
        answer["last_output"] = _tail(row.log_path)  # what is known of work in doubt
    return answer


def _tail(path: str, size: int = LAST_OUTPUT_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def lease_json(lease: LeaseView) -> dict[str, Any]:
    """A lease as the API shows it: each of its fields by name (its terms' among its own), a
    hook as its method and URL, a state as its word."""
    return {name: _plain(value) for name, value in lease_fields(lease).items()}


def _plain(value: Any) -> Any:
    if isinstance(value, ReleaseHook):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    return value


# needs-you headlines under which admission goes on (a person is asked, nothing is held).
ADMITTING = frozenset({*HEADLINES.values(), "uncertain work needs you", "memory not given back"})


def feed_json(gateway: Gateway) -> dict[str, Any]:
    """What the Health page shows: ids, owners, states, reasons and numbers only."""
    decision = gateway.headlines.check()
    latest = gateway.samples[-1] if gateway.samples else gateway.sample()
    stats = gateway.scheduler.statistics()
    held = gateway.headlines.held_after_pressure()
    said = gateway.headlines.needs_you(decision)  # what a person is told first leads the page too
    person = said["headline"] in PERSON_HEADLINES
    headline = said["headline"] if person or held else HEADLINES.get(decision.reason, "ok")
    return {
        "boot_id": gateway.boot_id,
        "uptime_s": gateway.uptime(),
        "now": time.time(),
        "guard": {
            "admit": decision.admit and held is None and said["headline"] in ADMITTING,
            "reason": PressureReason.PRESSURE.value if held else decision.reason.value,
            "headline": headline,
            "summary": f"{said['body']}; {decision.summary}"
            if person or held
            else decision.summary,
        },
        "memory": _feed_memory(decision, latest),
        "disk": {"free_bytes": latest.disk_free_bytes, "total_bytes": latest.disk_total_bytes},
        "history": [_sample_json(s) for s in list(gateway.samples)],
        "owners": {o: {"waiting": w, "running": r} for o, (w, r) in stats.by_owner.items()},
        "jobs": _feed_jobs(gateway),
        "refusals": [
            {"at": r.at, "reason": r.reason.value, "summary": r.summary}
            for r in reversed(gateway.refusals)
        ],
        "recoveries": [
            {"at": e.at, "reason": e.code.value, "node": e.node}
            for e in gateway.journal.history(limit=FEED_RECOVERIES)
        ],
        "leases": gateway.leases.counts(),
        "sessions": gateway.leases.sessions(),
        "backend": gateway.backend,
        "nodes": nodes_json(gateway),
    }


def nodes_json(gateway: Gateway) -> list[dict[str, Any]]:
    """Each Ray node: its memory, our jobs there, and the headroom its guard last read."""
    return [
        {
            "node_id": n.node_id,
            "address": n.address,
            "alive": n.alive,
            "memory_bytes": n.memory_bytes,
            "cpus": n.cpus,
            "reserved_bytes": n.reserved_bytes,
            "room_bytes": max(0, n.memory_bytes - n.reserved_bytes),
            "running": n.jobs,
            "headroom_bytes": n.headroom_bytes,
            "headroom_at": n.headroom_at,
            "held": n.held,
            "suspended": n.suspended_jobs,
            "pressure_steps": dict(n.steps),
        }
        for n in gateway.nodes()
    ]


def _feed_memory(decision: Decision, latest: Sample) -> dict[str, Any]:
    """The guard's memory reading now, with the chart's latest line."""
    memory = decision.memory
    return {
        "used_bytes": memory.used_bytes if memory else None,
        "limit_bytes": memory.limit_bytes if memory else None,
        "line_bytes": latest.line_bytes,
        "source": memory.source.value if memory else "not read",
    }


def _sample_json(sample: Sample) -> dict[str, Any]:
    """One point of the Health page's chart."""
    return {
        "at": sample.at,
        "used_bytes": sample.used_bytes,
        "limit_bytes": sample.limit_bytes,
        "line_bytes": sample.line_bytes,
        "disk_free_bytes": sample.disk_free_bytes,
        "disk_total_bytes": sample.disk_total_bytes,
        "running": sample.running,
        "waiting": sample.waiting,
        "baseline_bytes": sample.baseline_bytes,
    }


def _feed_jobs(gateway: Gateway) -> list[dict[str, Any]]:
    """This run's newest jobs, then the work in doubt an earlier run left: jobs, then calls."""
    shown = sorted(gateway.scheduler.jobs(), key=lambda v: v.submitted_at, reverse=True)[:FEED_JOBS]
    live = {v.id for v in shown}
    pools = gateway.scheduler.jobserver_statistics()
    # Work in doubt from an earlier run lives only in the journal: show it too.
    in_doubt = [
        r
        for state in (JobState.UNCERTAIN.value, JobState.DEFERRED.value)
        for r in gateway.journal.jobs(state=state, limit=FEED_IN_DOUBT)
        if r.id not in live
    ]
    calls = gateway.calls.list(state="uncertain")[:FEED_IN_DOUBT]
    return (
        [_feed_live_job(v, pools.get(v.id)) for v in shown]
        + [_feed_row(r) for r in in_doubt]
        + [_feed_call(c) for c in calls]
    )


def _feed_live_job(view: JobView, pool: JobserverStatistics | None) -> dict[str, Any]:
    """A job of this run as the Health page lists it: no command line, no path (its
    jobserver's tokens while it has one)."""
    return {
        "id": view.id,
        "owner": view.owner,
        "state": view.state.value,
        "reason": view.reason.value if view.reason else None,
        "exit_code": view.exit_code,
        "submitted_at": view.submitted_at,
        "started_at": view.started_at,
        "ended_at": view.ended_at,
        "tokens": tokens_json(pool),
    }


def _feed_row(row: JobRow) -> dict[str, Any]:
    """A job an earlier run left in doubt, from the journal, listed like a live one."""
    return {
        "id": row.id,
        "owner": row.owner,
        "state": row.state,
        "reason": None,
        "exit_code": row.exit_code,
        "submitted_at": row.submitted_at,
        "started_at": row.started_at,
        "ended_at": row.ended_at,
    }


def _feed_call(call: CallView) -> dict[str, Any]:
    """A registered call left uncertain, listed like a job that started when it was made."""
    return {
        "id": call.id,
        "owner": call.owner,
        "state": call.state.value,
        "reason": None,
        "exit_code": None,
        "submitted_at": call.created_at,
        "started_at": call.created_at,
        "ended_at": None,
    }


def status_json(gateway: Gateway) -> dict[str, Any]:
    """The guard's reading and last decision, queue and running counts per owner, holds."""
    decision = gateway.headlines.check()
    memory, disk = decision.memory, decision.disk
    stats = gateway.scheduler.statistics()
    guard_stats = gateway.guard.statistics()
    pressure = gateway.scheduler.pressure_statistics()
    last = guard_stats.last_decision
    return {
        "boot_id": gateway.boot_id,
        "uptime_s": gateway.uptime(),
        "guard": {
            "admit": decision.admit,
            "reason": decision.reason.value,
            "summary": decision.summary,
            "young": guard_stats.young,
            "reserved_bytes": guard_stats.reserved_bytes,
            "last_decision": None
            if last is None
            else {"admit": last.admit, "reason": last.reason.value, "summary": last.summary},
        },
        "memory": {
            "used_bytes": memory.used_bytes if memory else None,
            "limit_bytes": memory.limit_bytes if memory else None,
            "source": memory.source.value if memory else None,
        },
        "disk": {
            "free_bytes": disk.free_bytes if disk else None,
            "total_bytes": disk.total_bytes if disk else None,
        },
        "queue": {
            "waiting": stats.waiting,
            "running": stats.running,
            "by_owner": {o: {"waiting": w, "running": r} for o, (w, r) in stats.by_owner.items()},
            "refusals": stats.refusals,
            "last_refusal": stats.last_refusal,
        },
        "leases": gateway.leases.counts(),
        "sessions": gateway.leases.sessions(),
        "backend": gateway.backend,
        "nodes": nodes_json(gateway),
        "holds": [
            word
            for word, on in (
                ("shutting down", gateway.closing),
                ("recovery mode", gateway.link.recovery_mode),
                ("relief", gateway.link.relief_holds()),
                ("memory pressure", pressure.holding),
            )
            if on
        ],
        "pressure": {
            "holding": pressure.holding,
            "cooldown_s": gateway.scheduler.cooldown.remaining(),
            "holds": pressure.holds,
            "suspensions": pressure.suspensions,
            "resumes": pressure.resumes,
            "stops": pressure.stops,
            "reruns": pressure.reruns,
            "trial_pauses": pressure.trial_pauses,
            "reaction_p50_s": pressure.reaction_p50_s,
            "reaction_max_s": pressure.reaction_max_s,
            "wakes_on": pressure.wakes_on,
            "relieves": pressure.relieves,
            "relieved": pressure.relieved,
        },
        "baseline": baseline_json(gateway),
    }


def baseline_json(gateway: Gateway) -> dict[str, Any]:
    """Memory no live work explains: the watch's numbers, the leases ended without a release
    hook, and the container's other processes that grew since the gateway started."""
    watch = gateway.baseline.watch.statistics()
    return {
        "baseline_bytes": watch.baseline_bytes,
        "then_bytes": watch.then_bytes,
        "endings": watch.endings,
        "not_given_back": watch.not_given_back,
        "leases_ended_without_hook": gateway.leases.ended_without_hook(),
        "grew": [
            {"pid": g.pid, "name": g.name, "bytes": g.bytes} for g in gateway.baseline.grown()
        ],
    }

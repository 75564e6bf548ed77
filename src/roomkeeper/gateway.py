"""The gateway service: the scheduler, the guard, leases and the journal behind one object.

:mod:`roomkeeper.api` serves it over HTTP.  It keeps room for itself (seed
002): ROOMKEEPER_GATEWAY_RESERVE_MB is taken off the guard's line so admitted
work cannot squeeze the process that must stay responsive.  Managed jobs do
not inherit ``ROOMKEEPER_*`` variables, and the token never lies under the
workspace, so an agent's tool command does not find the keys by accident.

One idempotent shutdown path serves SIGTERM, SIGINT and ``POST /v1/shutdown``:
stop admission, stop timers, save state, stop managed trees, close services,
within ROOMKEEPER_SHUTDOWN_S.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import secrets
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from roomkeeper.admission import Decision, Guard, Reason
from roomkeeper.calls import Calls
from roomkeeper.config import (
    read_gateway_settings,
    read_queue_settings,
    read_watchdog_settings,
    warn_once,
)
from roomkeeper.errors import PersistenceError, UnknownJobError, UsageError
from roomkeeper.history import HistoryEvent, RecoveryCode
from roomkeeper.hooks import ReleaseHook, run_hook
from roomkeeper.ipc import CAPABILITIES, PROTOCOL, RECOVERY_MODE_VARIABLE, Channel
from roomkeeper.jobs import JobSpec, JobState, JobView
from roomkeeper.journal import Journal
from roomkeeper.leases import Leases, LeaseState, LeaseView, guard_key
from roomkeeper.paths import home_dir, workspace_dir, write_private
from roomkeeper.queue import Limits
from roomkeeper.recovery import recover
from roomkeeper.scheduler import Scheduler, cpu_pressure_percent

log = logging.getLogger("roomkeeper")

SAMPLE_EVERY_S = 2.0
SAMPLES_KEPT = 300  # ten minutes at one sample every two seconds
LEASE_CHECK_EVERY_S = 0.5
LEASE_RETRY_S = 0.25
RESUME_CHECK_S = 0.5
STOP_REQUESTED = "stop_requested"  # journal reason: a person asked; never deferred
MARKER_TIMEOUT_S = 30.0
HEALTH_DEADLINE_S = 2.0  # a self-probe slower than this is no heartbeat
RELIEF_HOLD_S = 60.0  # launches held after the supervisor asks for relief
REPAIR_PROBES = 3  # consecutive healthy self-probes before a repair
REPAIR_PROBE_GAP_S = 0.5
MIN_TOKEN_CHARS = 32
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)

HEADLINES = {
    Reason.OK: "ok",
    Reason.NO_CONTAINER: "ok",
    Reason.MEMORY: "no room in the container: memory",
    Reason.DISK: "no room in the container: disk",
    Reason.CPU: "no room: cpu",
    Reason.UNKNOWN: "measurements unavailable",
    Reason.OFF: "guard off",
}


@dataclass(frozen=True, slots=True)
class Sample:
    """One point of the Health page's chart."""

    at: float
    used_bytes: int | None
    limit_bytes: int | None
    line_bytes: int | None
    disk_free_bytes: int | None
    disk_total_bytes: int | None
    running: int
    waiting: int


def load_token(home: Path) -> str:
    """The gateway's bearer token, made on first start (mode 0600).

    Written to a temporary file and renamed, so a crash never leaves an empty
    token behind; a token file that is empty or too short is replaced, since
    an empty token would let anyone in.
    """
    path = home / "token"
    with contextlib.suppress(FileNotFoundError):
        token = path.read_text().strip()
        if len(token) >= MIN_TOKEN_CHARS:
            return token
        log.warning("the token file was empty or too short; a new token was made")
    write_private(path, secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def _journal_sync(env: Mapping[str, str]) -> str:
    """ROOMKEEPER_JOURNAL_SYNCHRONOUS: FULL (default) or, to measure what it costs, NORMAL/OFF."""
    value = env.get("ROOMKEEPER_JOURNAL_SYNCHRONOUS", "FULL").upper()
    if value not in ("FULL", "NORMAL", "OFF"):
        warn_once(
            "ROOMKEEPER_JOURNAL_SYNCHRONOUS",
            value,
            f"ROOMKEEPER_JOURNAL_SYNCHRONOUS={value!r} is not usable: FULL, NORMAL or OFF; "
            "using the default FULL",
        )
        return "FULL"
    return value


def _fsync_file(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def job_environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    """The gateway's environment without ``ROOMKEEPER_*``, plus what the caller asked for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(extra or {})
    return env


class Gateway:
    """What ``roomkeeper serve`` runs.

    Args:
        home: ROOMKEEPER_HOME (journal, logs, token).
        env: the variables to read; ``os.environ`` when omitted.
    """

    def __init__(
        self,
        *,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        channel: Channel | None = None,
    ) -> None:
        self.env = os.environ if env is None else env
        self.channel = channel  # to the supervisor; None when run alone
        # The supervisor's latch: automatic work is held.  Known from the start, so
        # nothing slips out before the channel's first message.
        self.recovery_mode = channel is not None and self.env.get(RECOVERY_MODE_VARIABLE) == "1"
        self.releasing = False  # after a repair: one job at a time until the queue drains
        self.relief_until = 0.0  # monotonic: launches held after a relief request
        self._listen_port: int | None = None
        self._listen_socket: str | None = None
        self.home = home or home_dir(self.env)
        self.workspace = workspace_dir(self.env)
        token_path = (self.home / "token").resolve()
        if token_path.is_relative_to(self.workspace.resolve()):
            raise UsageError(
                f"ROOMKEEPER_WORKSPACE ({self.workspace}) contains the gateway's token "
                f"({token_path}); choose a workspace outside ROOMKEEPER_HOME",
                name="ROOMKEEPER_WORKSPACE",
            )
        self.token = load_token(self.home)
        self.boot_id = uuid.uuid4().hex
        self.started = time.monotonic()
        self.guard = Guard(env=self.env, reserve=self._gateway_reserve)
        # A gateway.json left behind means the previous run did not stop cleanly;
        # its pid names the job cgroups that run may have left.
        crashed, previous_pid = False, None
        with contextlib.suppress(OSError, ValueError):
            previous_pid = int(json.loads((self.home / "gateway.json").read_text())["pid"])
            crashed = True
        self.journal = Journal(
            self.home / "journal.db",
            synchronous=_journal_sync(self.env),
            history_max_events=read_gateway_settings(self.env).history_max_events,
        )
        self.calls = Calls(self.journal)
        self.persistence_error: str | None = None
        self.leases = Leases(self.guard)
        self.hooks: dict[str, ReleaseHook] = {}
        self.samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)
        self.refusals: deque[tuple[float, str, str, str]] = deque(maxlen=20)
        # Cumulative, as Prometheus histograms must be: counts per bucket, sum, count.
        self.wait_buckets = [0] * len(WAIT_BUCKETS)
        self.wait_sum = 0.0
        self.wait_count = 0
        self._writes: dict[str, concurrent.futures.Future[None]] = {}
        self.scheduler = Scheduler(
            logs_dir=self.home / "logs",
            guard=self.guard,
            limits=self._limits,
            on_change=self._job_changed,
            on_end=self._job_ended,
            on_refusal=self._job_refused,
            before_launch=self._mark_launch,
        )
        self.closing = False
        self.server: Any = None  # the uvicorn server, to stop it on POST /v1/shutdown
        self._tasks: list[asyncio.Task[None]] = []
        self._shutdown_lock = asyncio.Lock()
        self._shut = False
        self._resuming: str | None = None  # the deferred job resumed now (one at a time)
        self._restore_leases()
        # Orphans stopped and interrupted work settled before anything new launches.
        try:
            recover(self.journal, crashed=crashed, previous_pid=previous_pid)
        except Exception as err:  # e.g. a full disk: report it and keep serving
            log.error("start-up recovery could not be saved: %s", err)
            self.persistence_error = str(err)

    # ---------------------------------------------------------------- setup

    def _limits(self) -> Limits:
        """The seed's bounds from the variables, with the gateway's holds on top."""
        limits = Limits.from_settings(read_queue_settings(self.env))
        if self.recovery_mode or time.monotonic() < self.relief_until:
            return replace(limits, hold=True)
        if self.releasing:  # after a repair, held work goes out one job at a time
            if not self.scheduler.statistics().waiting:
                self.releasing = False
            return replace(limits, max_running=1)
        return limits

    def shutdown_deadline(self) -> float:
        """min(ROOMKEEPER_SHUTDOWN_S, 2/3 of ROOMKEEPER_WATCHDOG_SHUTDOWN), under a supervisor."""
        own = read_gateway_settings(self.env).shutdown_s
        if self.channel is None:
            return own
        return min(own, read_watchdog_settings(self.env).shutdown_s * 2 / 3)

    # ----------------------------------------------------------- supervisor

    def relief(self) -> str | None:
        """Hold launches for a while and stop the newest managed tree, keeping its output."""
        self.relief_until = time.monotonic() + RELIEF_HOLD_S
        running = [v for v in self.scheduler.jobs() if v.state is JobState.RUNNING]
        if not running:
            return None
        newest = max(running, key=lambda v: v.started_at or 0)
        self.scheduler.cancel(newest.id)
        log.warning(
            "relief requested: launches held for %.0f s, job %s stopped", RELIEF_HOLD_S, newest.id
        )
        return newest.id

    def _listen(self) -> None:
        """The supervisor's messages (a thread); its loss means: shut down."""
        assert self.channel is not None
        for message in self.channel.messages():
            if message["type"] == "relief":
                self.relief()
            elif message["type"] == "recovery_mode":
                self.recovery_mode = bool(message.get("on"))
                log.warning(
                    "recovery mode %s",
                    "on: automatic work is held" if self.recovery_mode else "off",
                )
        if not self.closing:
            log.error("the supervisor is gone: shutting down")
            self.closing = True
            if self.server is not None:
                self.server.should_exit = True
        # If the event loop is blocked, the orderly path never runs: after the deadline
        # the process ends itself, and its lifeline takes the managed trees down.
        timer = threading.Timer(self.shutdown_deadline() + 1.0, os._exit, args=(1,))
        timer.daemon = True
        timer.start()

    async def _heartbeat_loop(self, url: str, transport: Any) -> None:
        """Probe our own GET /health over HTTP; only a real, fast, own answer is a heartbeat."""
        import httpx

        interval = min(read_watchdog_settings(self.env).heartbeat_s / 3, 5.0)
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
            while not self.closing:
                try:
                    answer = await asyncio.wait_for(client.get(url), HEALTH_DEADLINE_S)
                    body = answer.json()
                    if (
                        answer.status_code == 200
                        and isinstance(body, dict)
                        and body.get("boot_id") == self.boot_id
                    ):
                        assert self.channel is not None
                        self.channel.send("heartbeat", boot_id=self.boot_id, at=time.time())
                except Exception as err:  # no heartbeat this time; the loop must go on
                    log.debug("health self-probe failed: %s", err)
                await asyncio.sleep(interval)

    def tell_supervisor(self, kind: str, **fields: Any) -> bool:
        """Send one message to the supervisor; False when there is none."""
        return self.channel is not None and self.channel.send(kind, **fields)

    def _gateway_reserve(self) -> int:
        return read_gateway_settings(self.env).gateway_reserve_bytes

    def _restore_leases(self) -> None:
        """Leases granted before a restart and not yet past their ttl keep their reservation."""
        now = time.time()
        for row in self.journal.query("SELECT * FROM leases WHERE state = 'granted'"):
            if row["expires_at"] <= now:
                self.journal.execute(
                    "UPDATE leases SET state='expired', ended_at=? WHERE id=?", (now, row["id"])
                )
                continue
            release = json.loads(row["release"]) if row["release"] else None
            hook = ReleaseHook(release["method"], release["url"]) if release else None
            lease, _ = self.leases.restore(
                row["id"],
                row["owner"],
                row["memory_bytes"],
                row["disk_bytes"] or None,
                row["ttl_s"],
                row["granted_at"],
                row["expires_at"],
                hook,
            )
            self.guard.hold(
                guard_key(lease.id), lease.memory_bytes or 0, age_s=now - lease.granted_at
            )

    def health_probe(self) -> tuple[str, Any]:
        """Where our own GET /health is, as (url, httpx async transport)."""
        import httpx

        if self._listen_socket is not None:
            return "http://gateway/health", httpx.AsyncHTTPTransport(uds=self._listen_socket)
        return f"http://127.0.0.1:{self._listen_port}/health", httpx.AsyncHTTPTransport()

    async def repair(self, probes: int = REPAIR_PROBES) -> dict[str, Any]:
        """Check stable responsiveness and headroom; then clear the latch and release work gently.

        Nothing is reset: no data, no token.  Held work goes out one job at a time.
        """
        import httpx

        url, transport = self.health_probe()
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
            for n in range(probes):
                try:
                    answer = await client.get(url)
                    healthy = (
                        answer.status_code == 200 and answer.json().get("boot_id") == self.boot_id
                    )
                except (httpx.HTTPError, ValueError):
                    healthy = False
                if not healthy:
                    return {"repaired": False, "why": f"health probe {n + 1} of {probes} failed"}
                await asyncio.sleep(REPAIR_PROBE_GAP_S)
        decision = await asyncio.to_thread(self.check)
        if not decision.admit:
            return {"repaired": False, "why": f"no headroom: {decision.summary}"}
        self.recovery_mode = False
        self.releasing = True
        self.relief_until = 0.0
        self.tell_supervisor("repaired")
        self._watch(
            self.journal.record_history(HistoryEvent(time.time(), RecoveryCode.REPAIRED, {}))
        )
        return {"repaired": True, "why": f"{probes} healthy probes in a row and room for a job"}

    async def start(self, *, port: int | None = None, socket: str | None = None) -> None:
        """Start the scheduler and the timers; say where we listen in ROOMKEEPER_HOME."""
        self._listen_port, self._listen_socket = port, socket
        self.scheduler.start()
        self._tasks = [
            asyncio.create_task(self._sample_loop()),
            asyncio.create_task(self._lease_loop()),
            asyncio.create_task(self._resume_loop()),
        ]
        if self.channel is not None:
            self.channel.send(
                "hello",
                protocol=PROTOCOL,
                capabilities=list(CAPABILITIES),
                boot_id=self.boot_id,
                pid=os.getpid(),
            )
            threading.Thread(target=self._listen, name="supervisor-channel", daemon=True).start()
            url, transport = self.health_probe()
            self._tasks.append(asyncio.create_task(self._heartbeat_loop(url, transport)))
        info = {"pid": os.getpid(), "boot_id": self.boot_id, "port": port, "socket": socket}
        # Atomic: a client or the next start never reads half of it.
        write_private(self.home / "gateway.json", json.dumps(info))

    # ----------------------------------------------------------------- jobs

    def _watch(self, write: concurrent.futures.Future[None]) -> None:
        """Remember whether the journal can save: a failed write is reported, never hidden."""

        def done(future: concurrent.futures.Future[None]) -> None:
            error = future.exception()
            if error is None:
                self.persistence_error = None
            else:
                if self.persistence_error is None:
                    log.error("the journal could not save: %s", error)
                self.persistence_error = str(error)

        write.add_done_callback(done)

    def _mark_launch(self, view: JobView) -> None:
        """The job's row and its pending marker, durable before the spawn (scheduler thread)."""
        write = self.journal.record_job(view, mark_pending=True)
        self._watch(write)
        write.result(timeout=MARKER_TIMEOUT_S)  # a stuck disk fails the launch, not the scheduler

    def _job_changed(self, view: JobView) -> None:
        pid_started = None
        if view.state is JobState.RUNNING and view.pid is not None:
            with contextlib.suppress(psutil.Error):
                pid_started = psutil.Process(view.pid).create_time()
        if view.state.final:
            _fsync_file(view.log_path)  # logs before the index
        write = self.journal.record_job(view, pid_started=pid_started)
        self._watch(write)
        self._writes[view.id] = write
        job_id = view.id

        def forget(done: concurrent.futures.Future[None]) -> None:
            # A failed write is kept: submit_job must see it and answer 507.
            if (
                self._writes.get(job_id) is done
                and not done.cancelled()
                and done.exception() is None
            ):
                self._writes.pop(job_id, None)

        write.add_done_callback(forget)
        if view.state is JobState.RUNNING and view.started_at is not None:
            wait = max(0.0, view.started_at - view.submitted_at)
            self.wait_sum += wait
            self.wait_count += 1
            for i, bound in enumerate(WAIT_BUCKETS):
                if wait <= bound:
                    self.wait_buckets[i] += 1

    def _job_refused(self, job_id: str, decision: Decision) -> None:
        """Keep a refusal for the Health page once, not once per retried round."""
        last = self.refusals[-1] if self.refusals else None
        if last is None or (last[1], last[3]) != (decision.reason.value, job_id):
            self.refusals.append((time.time(), decision.reason.value, decision.summary, job_id))

    def _job_ended(self, view: JobView) -> None:
        """Runs on the scheduler thread before the slot is offered to waiting work."""
        hook = self.hooks.pop(view.id, None)
        if hook is not None:
            outcome = run_hook(hook)
            if not outcome.startswith("ok"):
                log.warning("release hook of job %s %s", view.id, outcome)

    async def submit_job(self, spec: JobSpec, release: ReleaseHook | None) -> JobView:
        """Queue a job; returns once its record is durable.  Never blocks the event loop."""
        if self.closing:
            raise UsageError("the gateway is shutting down", name="shutdown")
        job_id = uuid.uuid4().hex[:12]
        if release is not None:
            self.hooks[job_id] = release  # before the job exists: it may end at once
        try:
            view = await asyncio.to_thread(self.scheduler.submit, spec, job_id=job_id)
        except BaseException:
            self.hooks.pop(job_id, None)
            raise
        write = self._writes.get(job_id)
        if write is not None:
            try:
                await asyncio.wrap_future(write)
            except Exception as err:  # not saved: it must not run, and must not look saved
                await asyncio.to_thread(self.scheduler.cancel, job_id)
                raise PersistenceError(f"the job was not saved, so it will not run: {err}") from err
        return view

    # --------------------------------------------------------------- leases

    def _record_lease(self, lease: LeaseView) -> concurrent.futures.Future[None]:
        release = json.dumps(lease.release.to_json()) if lease.release else None
        self._watch(
            self.journal.execute(
                "INSERT INTO lease_events VALUES (?,?,?)",
                (lease.id, lease.state.value, time.time()),
            )
        )
        return self.journal.execute(
            "INSERT INTO leases VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
            "state=excluded.state, ttl_s=excluded.ttl_s, expires_at=excluded.expires_at, "
            "ended_at=excluded.ended_at, hook_outcome=excluded.hook_outcome",
            (
                lease.id,
                lease.owner,
                lease.state.value,
                lease.memory_bytes or 0,
                lease.disk_bytes or 0,
                lease.ttl_s,
                lease.granted_at,
                lease.expires_at,
                lease.ended_at,
                release,
                lease.hook_outcome,
            ),
        )

    async def grant_lease(
        self,
        lease_id: str | None,
        *,
        owner: str,
        memory_bytes: int | None,
        disk_bytes: int | None,
        ttl_s: float,
        wait_s: float,
        release: ReleaseHook | None,
    ) -> tuple[LeaseView | None, Decision | None, bool]:
        """Grant a lease, waiting up to ``wait_s`` for room; (lease, decision, created)."""
        if self.closing:
            raise UsageError("the gateway is shutting down", name="shutdown")
        lease_id = lease_id or uuid.uuid4().hex[:16]
        deadline = time.monotonic() + wait_s
        while True:
            lease, decision = self.leases.grant(
                lease_id,
                owner=owner,
                memory_bytes=memory_bytes,
                disk_bytes=disk_bytes,
                ttl_s=ttl_s,
                release=release,
            )
            if lease is not None:
                if decision is not None:  # a new grant, not a retried request
                    await asyncio.wrap_future(self._record_lease(lease))
                return lease, decision, decision is not None
            assert decision is not None
            self.refusals.append((time.time(), decision.reason.value, decision.summary, lease_id))
            if time.monotonic() + LEASE_RETRY_S > deadline or self.closing:
                return None, decision, False
            await asyncio.sleep(LEASE_RETRY_S)

    async def end_lease(self, lease_id: str, state: LeaseState = LeaseState.RELEASED) -> LeaseView:
        """End a lease: run its hook, then give its memory back, and record both."""
        lease = self.leases.end(lease_id, state)
        if lease is None:  # it had ended already: releasing twice is not an error
            return self.leases.get(lease_id)
        outcome = await asyncio.to_thread(run_hook, lease.release) if lease.release else None
        lease = self.leases.complete(lease_id, outcome)
        await asyncio.wrap_future(self._record_lease(lease))
        return lease

    async def heartbeat(self, lease_id: str, ttl_s: float | None) -> LeaseView:
        """Extend a lease's ttl from now."""
        lease = self.leases.heartbeat(lease_id, ttl_s)
        await asyncio.wrap_future(self._record_lease(lease))
        return lease

    # --------------------------------------------------------------- timers

    async def _sample_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                self.samples.append(await asyncio.to_thread(self.sample))
            await asyncio.sleep(SAMPLE_EVERY_S)

    def sample(self) -> Sample:
        """One reading for the chart: the guard's own numbers, so the line is the guard's."""
        decision = self.guard.check()
        memory, disk = decision.memory, decision.disk
        stats = self.scheduler.statistics()
        return Sample(
            time.time(),
            memory.used_bytes if memory else None,
            memory.limit_bytes if memory else None,
            decision.memory_line_bytes,
            disk.free_bytes if disk else None,
            disk.total_bytes if disk else None,
            stats.running,
            stats.waiting,
        )

    def spec_from_row(self, spec: dict[str, Any], owner: str, resumable: bool) -> JobSpec:
        """The job as it was asked for, to run it again (its deadline counts from now)."""
        return JobSpec(
            argv=spec["argv"],
            owner=owner,
            cwd=spec.get("cwd"),
            env=spec.get("env") or job_environment(None),
            memory_bytes=spec.get("memory_bytes"),
            disk_bytes=spec.get("disk_bytes"),
            timeout_s=spec.get("timeout_s"),
            shell=bool(spec.get("shell")),
            resumable=resumable,
        )

    def cancel_job(self, job_id: str) -> JobView:
        """Cancel or stop a job; the request is durable before it is acknowledged or signalled.

        A crash right after the answer must not turn a person's cancel into a
        deferred job that runs again.
        """
        view = self.scheduler.get(job_id)
        if not view.state.final:
            self.journal.execute(
                "UPDATE jobs SET reason=? WHERE id=?", (STOP_REQUESTED, job_id)
            ).result()
        view = self.scheduler.cancel(job_id)
        write = self._writes.get(job_id)
        if write is not None and view.state.final:
            write.result(timeout=MARKER_TIMEOUT_S)
        return view

    def resume_next(self) -> str | None:
        """Resume the oldest deferred job if none is resuming now (one at a time)."""
        if self.closing or self.persistence_error is not None or self.recovery_mode:
            return None  # recovery mode holds automatic resumption
        if self._resuming is not None:
            with contextlib.suppress(UnknownJobError):
                if not self.scheduler.get(self._resuming).state.final:
                    return None
        self._resuming = None
        rows = self.journal.query(
            "SELECT id FROM jobs WHERE state='deferred' ORDER BY submitted_at LIMIT 1"
        )
        if not rows:
            return None
        row = self.journal.job(rows[0]["id"])
        assert row is not None
        self.scheduler.submit(self.spec_from_row(row.spec, row.owner, row.resumable), job_id=row.id)
        self._resuming = row.id
        self._watch(
            self.journal.record_history(
                HistoryEvent(time.time(), RecoveryCode.RESUMED, {"jobs": 1})
            )
        )
        return row.id

    def resolve_job(self, job_id: str, resolution: str) -> str:
        """Settle an uncertain job: succeeded or failed, or run it again now."""
        row = self.journal.job(job_id)
        if row is None:
            raise UnknownJobError(f"no job has the id {job_id!r}", job_id=job_id)
        if row.state != JobState.UNCERTAIN.value:
            raise UsageError(f"job {job_id!r} is {row.state}, not uncertain", name="state")
        now = time.time()
        if resolution == "rerun":
            self.scheduler.submit(
                self.spec_from_row(row.spec, row.owner, row.resumable), job_id=job_id
            )
        else:

            def settle(conn: Any) -> None:
                changed = conn.execute(
                    "UPDATE jobs SET state='resolved', resolution=? "
                    "WHERE id=? AND state='uncertain'",
                    (resolution, job_id),
                ).rowcount
                if not changed:
                    raise UsageError(f"job {job_id!r} is no longer uncertain", name="state")
                conn.execute(
                    "INSERT INTO job_events VALUES (?,?,?,?)", (job_id, "resolved", None, now)
                )
                conn.execute("DELETE FROM markers WHERE kind='job' AND id=?", (job_id,))

            self.journal.submit(settle).result()
        self._watch(
            self.journal.record_history(HistoryEvent(now, RecoveryCode.RESOLVED, {"jobs": 1}))
        )
        return resolution

    async def _resume_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.resume_next)
            await asyncio.sleep(RESUME_CHECK_S)

    async def _lease_loop(self) -> None:
        while True:
            for lease_id in self.leases.due():
                with contextlib.suppress(Exception):
                    await self.end_lease(lease_id, LeaseState.EXPIRED)
            await asyncio.sleep(LEASE_CHECK_EVERY_S)

    # ------------------------------------------------------------- answers

    def check(self) -> Decision:
        """The guard's answer for one more job of the default size, now."""
        return self.guard.check()

    def needs_you(self) -> dict[str, str]:
        """A headline from a closed vocabulary and the guard's summary: no path, no command."""
        if self.persistence_error is not None:
            return {
                "headline": "persistence failed",
                "body": "the journal cannot save (the disk may be full); new work is refused",
            }
        if self.recovery_mode:
            return {
                "headline": "recovery mode",
                "body": "the gateway restarted too often: queued jobs, deferred work and "
                "automatic resumption are held until roomkeeper repair",
            }
        doubt = self.journal.query(
            "SELECT (SELECT count(*) FROM jobs WHERE state='uncertain') + "
            "(SELECT count(*) FROM calls WHERE state='uncertain')"
        )[0][0]
        if doubt:
            return {
                "headline": "uncertain work needs you",
                "body": f"{doubt} job(s) or call(s) were in flight when the gateway stopped; "
                "resolve each as succeeded, failed or rerun",
            }
        decision = self.check()
        if decision.admit and self.scheduler.statistics().running:
            cpu = cpu_pressure_percent()
            threshold = read_queue_settings(self.env).cpu_pressure_percent
            if cpu is not None and cpu > threshold:
                return {
                    "headline": HEADLINES[Reason.CPU],
                    "body": f"CPU pressure {cpu:.0f} % is above {threshold:.0f} %: "
                    "no new job starts until it falls",
                }
        return {"headline": HEADLINES.get(decision.reason, "ok"), "body": decision.summary}

    def uptime(self) -> float:
        """Seconds since this gateway process started."""
        return time.monotonic() - self.started

    # ------------------------------------------------------------- shutdown

    async def shutdown(self) -> None:
        """The one shutdown path; safe to call more than once."""
        async with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
            # uvicorn already spent up to a third of the deadline draining connections.
            deadline = self.shutdown_deadline() * 2 / 3
            try:
                await asyncio.wait_for(self._shutdown_steps(deadline), timeout=deadline)
            except TimeoutError:
                log.error("shutdown took longer than ROOMKEEPER_SHUTDOWN_S=%s s", deadline)
            with contextlib.suppress(OSError):
                (self.home / "gateway.json").unlink()
            log.info("roomkeeper gateway stopped")

    async def _shutdown_steps(self, deadline: float) -> None:
        self.closing = True  # 1. stop admission
        for task in self._tasks:  # 2. stop timers
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pending = [asyncio.wrap_future(f) for f in list(self._writes.values()) if not f.done()]
        if pending:  # 3. save state
            await asyncio.gather(*pending, return_exceptions=True)
        grace = max(0.5, min(5.0, deadline / 2))  # 4. stop managed trees
        await asyncio.to_thread(self.scheduler.close, grace=grace)
        await asyncio.to_thread(self.journal.close)  # 5. close services

"""The gateway service: the scheduler, the guard, leases and the journal behind one object.

:mod:`roomkeeper.api.app` serves it over HTTP.  It keeps room for itself:
ROOMKEEPER_GATEWAY_RESERVE_MB is taken off the guard's line so admitted
work cannot squeeze the process that must stay responsive.  Managed jobs do
not inherit ``ROOMKEEPER_*`` variables, and the token never lies under the
workspace, so an agent's tool command does not find the keys by accident.

The Gateway owns its parts and keeps the names :mod:`roomkeeper.api.app` calls:
:mod:`~roomkeeper.gateway.home` (the token, the journal, the run record),
:mod:`~roomkeeper.gateway.jobs` and :mod:`~roomkeeper.gateway.leases` (each
change durable), :mod:`~roomkeeper.gateway.link` (the supervisor, its holds,
repair), :mod:`~roomkeeper.gateway.samples` (the Health page's chart) and
:mod:`~roomkeeper.gateway.refusals` (its recent refusals).  It owns its state
too: the API reads ``closing`` and ``persistence_error`` and calls operations.

One idempotent shutdown path serves SIGTERM, SIGINT and ``POST /v1/shutdown``:
:meth:`Gateway.begin_shutdown` stops admission at once and asks the server to
exit; the server's lifespan then runs :meth:`Gateway.shutdown`, the stop steps
(stop timers, save state, stop managed trees, close the journal), within
ROOMKEEPER_SHUTDOWN_S.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from roomkeeper.config import (
    gateway_reserve_bytes,
    read_backend_settings,
    read_gateway_settings,
    read_pressure_settings,
    read_queue_settings,
    read_watchdog_settings,
)
from roomkeeper.gateway.baseline import BaselineKeeper
from roomkeeper.gateway.calls import Calls
from roomkeeper.gateway.home import (
    open_journal,
    remove_run_record,
    require_token_outside_workspace,
    unclean_stop_pid,
    write_run_record,
)
from roomkeeper.gateway.jobs import DurableJobs
from roomkeeper.gateway.leases import DurableLeases
from roomkeeper.gateway.link import SupervisorLink
from roomkeeper.gateway.recovery import recover
from roomkeeper.gateway.refusals import REFUSALS_KEPT, Refusal
from roomkeeper.gateway.relieve import LeaseRelief
from roomkeeper.gateway.samples import Sample, Sampler
from roomkeeper.gateway.worktrees import gateway_worktrees
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.leases import Leases
from roomkeeper.guard.rule import Decision, Reason, Word, gb
from roomkeeper.ipc import Channel
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.spec import SchedulerReason
from roomkeeper.loopback.hooks import HookRunner, ReleaseHook
from roomkeeper.processes.job_user import JobUser, read_job_user

if TYPE_CHECKING:
    from roomkeeper.cluster.backend import NodeView, RayBackend
from roomkeeper.journal.database import Journal
from roomkeeper.journal.integrity import is_damage
from roomkeeper.kernel.resources import cpu_pressure_percent
from roomkeeper.paths import home_dir, load_token, validate_home, workspace_dir
from roomkeeper.relief.cooldown import CooldownCause
from roomkeeper.relief.ladder import PressureReason

log = logging.getLogger("roomkeeper")

RESUME_CHECK_S = 0.5

# What needs-you (and the Health page's headline) says for the guard's next decision; every
# refusing reason of the rule needs one (a test holds it), else the headline would say "ok".
HEADLINES: dict[Word, str] = {
    Reason.OK: "ok",
    Reason.NO_CONTAINER: "ok",
    Reason.MEMORY: "no room in the container: memory",
    Reason.DISK: "no room in the container: disk",
    SchedulerReason.CPU: "no room: cpu",
    Reason.UNKNOWN: "measurements unavailable",
    Reason.OFF: "guard off",
    PressureReason.PRESSURE: "admission held after pressure",
}
# What needs-you (and the Health page's headline) says first when a person is needed.
PERSON_HEADLINES = (
    "persistence failed",
    "journal damaged",
    "recovery mode",
    "cluster unreachable",
    "uncertain work needs you",
    "memory not given back",
)


class Server(Protocol):
    """What the gateway asks of the HTTP server that serves it (uvicorn's ``Server``)."""

    should_exit: bool


class Gateway:
    """What ``roomkeeper serve`` runs: :meth:`Gateway.open` makes one over ROOMKEEPER_HOME.

    The constructor wires the parts over a journal already open and runs no
    recovery, so a gateway is built in steps: check the home, open the journal,
    wire the parts, settle what the previous run left (:meth:`open` takes them).

    Args:
        home: ROOMKEEPER_HOME (journal, logs, token).
        env: the variables to read.
        token: the bearer token every authorized call carries.
        journal: the open journal behind every durable change.
        channel: to the supervisor; None when run alone.
        job_user: the user managed jobs run as (``ROOMKEEPER_JOB_USER``); None: ours.
    """

    def __init__(
        self,
        *,
        home: Path,
        env: Mapping[str, str],
        token: str,
        journal: Journal,
        channel: Channel | None = None,
        job_user: JobUser | None = None,
    ) -> None:
        self.env = env
        self.job_user = job_user
        self.home = home
        self.workspace = workspace_dir(env)
        self.token = token
        self.journal = journal
        self.boot_id = uuid.uuid4().hex
        self.started = time.monotonic()
        self.guard = Guard(env=env, reserve=self._gateway_reserve)
        self.cluster = open_cluster(env)  # None: jobs run here, as managed trees
        self.calls = Calls(journal)
        self.leases = Leases(self.guard)
        self.hooks = HookRunner()  # release hooks: their own pool, one deadline each
        self.refusals: deque[Refusal] = deque(maxlen=REFUSALS_KEPT)  # newest last
        self._persistence_error: str | None = None  # why the journal cannot save, while so
        self._closing = False  # shutting down: nothing new is admitted
        self._server: Server | None = None  # asked to exit when the shutdown path begins
        self._tasks: list[asyncio.Task[None]] = []
        self._shutdown_lock = asyncio.Lock()
        self._shut = False
        self._shutdown_task: asyncio.Task[None] | None = None  # when no server runs it
        self._run_record_due: tuple[int | None, str | None] | None = None  # refused at start
        self._hooks_due: list[tuple[str, ReleaseHook]] = []  # job hooks owed since before
        # Start-up recovery a full disk refused, with the previous pid: until it is saved, the
        # journal counts as not saving, so no new job starts (recovery would stop its tree).
        self._recovery_due: tuple[int | None] | None = None
        self.worktrees = gateway_worktrees(
            journal=journal, workspace=self.workspace, env=env, watch=self._watch
        )
        self.durable_jobs = self._durable_jobs()
        self.scheduler = self.durable_jobs.scheduler
        self.durable_leases = self._durable_leases()
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start: leases end there
        self.lease_relief = LeaseRelief(
            leases=self.durable_leases,
            journal=journal,
            watch=self._watch,
            end=self._end_relieved,
        )
        self.scheduler.monitor.watch_leases(self.lease_relief)
        self.baseline = BaselineKeeper(
            guard=self.guard,
            scheduler=self.scheduler,
            leases=self.leases,
            journal=journal,
            watch=self._watch,
            env=env,
        )
        self.sampler = Sampler(
            guard=self.guard, scheduler=self.scheduler, explained=self._explained
        )
        self.samples = self.sampler.samples  # the Health page's chart, newest last
        self.link = self._supervisor_link(channel)

    @classmethod
    def open(
        cls,
        *,
        home: Path | None = None,
        env: Mapping[str, str] | None = None,
        channel: Channel | None = None,
    ) -> Gateway:
        """A gateway over ROOMKEEPER_HOME, its journal open and start-up recovery done.

        Args:
            home: ROOMKEEPER_HOME; read from ``env`` when omitted.
            env: the variables to read; ``os.environ`` when omitted.
            channel: to the supervisor; None when run alone.

        Raises:
            UsageError: ROOMKEEPER_WORKSPACE contains the token, or the home or the
                token is not ours alone (:func:`~roomkeeper.paths.validate_home`,
                :func:`~roomkeeper.paths.load_token`); the message says so.
        """
        env = os.environ if env is None else env
        home = home or home_dir(env)
        job_user = read_job_user(env)
        # A job user reaches its workspace inside the home by path: search access only.
        validate_home(home, searchable=job_user is not None)
        require_token_outside_workspace(home, workspace_dir(env))
        token = load_token(home)
        previous_pid = unclean_stop_pid(home)  # before this run writes its own record
        journal = open_journal(home, env)
        gateway = cls(
            home=home, env=env, token=token, journal=journal, channel=channel, job_user=job_user
        )
        gateway.say_who_jobs_run_as()
        if journal.unwritable is not None:
            gateway.note_persistence_error(journal.unwritable)
        # Before recovery: on cgroup v2 the last run's job groups are found beside the
        # leaf this process moves into, so it must be there first.
        gateway.scheduler.prepare()
        if not gateway._recover(previous_pid):
            # Saved nothing (a full disk): the resume loop runs it again once the journal can
            # save, before anything new launches (new work is refused until then).
            gateway._recovery_due = (previous_pid,)
        # Release hooks of jobs the last run ended (or its crash did) without a recorded
        # outcome are made once the gateway serves; deferred jobs get theirs back.
        gateway._hooks_due = gateway.durable_jobs.restore_hooks()
        return gateway

    # ---------------------------------------------------------------- setup

    def _durable_jobs(self) -> DurableJobs:
        """The scheduler, with the journal behind every job (its holds read at each round)."""
        return DurableJobs(
            logs_dir=self.home / "logs",
            guard=self.guard,
            limits=self._limits,
            journal=self.journal,
            refusals=self.refusals,
            closing=lambda: self._closing,
            watch=self._watch,
            hooks=self.hooks,
            job_user=self.job_user,
            pressure_settings=lambda: read_pressure_settings(self.env),
            worktrees=self.worktrees,
            launcher=None if self.cluster is None else self.cluster.launch,
            placement=None if self.cluster is None else self.cluster.place,
        )

    def say_who_jobs_run_as(self) -> None:
        """Say once, at start, which user managed jobs run as and what that protects."""
        if self.job_user is not None:
            log.info("managed jobs run as user %s (uid %d)", self.job_user.name, self.job_user.uid)
            return
        log.warning(
            "managed jobs run as roomkeeper's own user (uid %d): a job can read the token and "
            "the journal, so roomkeeper protects against accidents, not against a hostile job; "
            "run roomkeeper as root with ROOMKEEPER_JOB_USER=USER to keep jobs out",
            os.geteuid(),
        )

    def ensure_workspace(self) -> Path:
        """The workspace, made 0700 if need be: the job user's own when there is one."""
        if self.job_user is not None:
            return self.job_user.own(self.workspace)
        self.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.workspace

    def _durable_leases(self) -> DurableLeases:
        """The leases, with the journal behind every grant, heartbeat and end."""
        return DurableLeases(
            leases=self.leases,
            guard=self.guard,
            journal=self.journal,
            refusals=self.refusals,
            closing=lambda: self._closing,
            watch=self._watch,
            hooks=self.hooks,
            reclaim_disk=self.worktrees.reclaim_space,
        )

    def _supervisor_link(self, channel: Channel | None) -> SupervisorLink:
        """Our side of the supervisor: its holds on launches, heartbeats, repair."""
        return SupervisorLink(
            channel,
            env=self.env,
            boot_id=self.boot_id,
            scheduler=self.scheduler,
            guard=self.guard,
            journal=self.journal,
            closing=lambda: self._closing,
            gone=self._supervisor_gone,
            watch=self._watch,
        )

    def _recover(self, previous_pid: int | None, *, restore: bool = True) -> bool:
        """Restore live leases and settle what the previous run left, before anything launches;
        whether it was saved.

        Args:
            previous_pid: the previous gateway's pid when it did not stop cleanly, else None.
            restore: restore the leases too (not again when recovery runs late).
        """
        if restore:
            self.durable_leases.restore()
        # Orphans stopped and interrupted work settled before anything new launches.
        try:
            recover(
                self.journal,
                crashed=previous_pid is not None,
                previous_pid=previous_pid,
                logs_dir=self.home / "logs",
            )
        except Exception as err:  # e.g. a full disk: report it and keep serving
            log.error("start-up recovery could not be saved: %s", err)
            self.note_persistence_error(err)
            return False
        return True

    def _recover_late(self) -> None:
        """Start-up recovery that a full disk refused: again, once the journal can save."""
        if self._recovery_due is None or self.journal.unwritable is not None:
            return
        (previous_pid,) = self._recovery_due
        if self._recover(previous_pid, restore=False):
            self._recovery_due = None
            self._persistence_error = None
            log.warning("start-up recovery ran once the journal could save again")

    def _limits(self) -> Limits:
        """The bounds from the variables, with the gateway's holds on top."""
        return self.link.holds(Limits.from_settings(read_queue_settings(self.env)))

    @property
    def backend(self) -> str:
        """Where admitted jobs run: ``local`` or ``ray``."""
        return "local" if self.cluster is None else "ray"

    def nodes(self) -> list[NodeView]:
        """The Ray cluster's nodes, our jobs and headroom on each; empty for the local backend."""
        return [] if self.cluster is None else self.cluster.nodes()

    def shutdown_deadline(self) -> float:
        """min(ROOMKEEPER_SHUTDOWN_S, 2/3 of ROOMKEEPER_WATCHDOG_SHUTDOWN), under a supervisor."""
        own = read_gateway_settings(self.env).shutdown_s
        if self.link.channel is None:
            return own
        return min(own, read_watchdog_settings(self.env).shutdown_s * 2 / 3)

    def _explained(self) -> int:
        """What our live work explains of used memory: jobs' footprints, leases' reservations."""
        return self.scheduler.local_footprints() + self.leases.reserved()

    def _end_relieved(self, lease_id: str) -> None:
        """End a lease the ladder counted relieved (its holder has not yet): on the event loop,
        from the monitor's thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # not serving: the lease ends by its holder or its ttl

        async def end() -> None:
            try:
                await self.durable_leases.end(lease_id)
            except Exception:
                log.exception("lease %s was relieved but could not be ended", lease_id)

        asyncio.run_coroutine_threadsafe(end(), loop)

    def _gateway_reserve(self, limit_bytes: int) -> int:
        return gateway_reserve_bytes(limit_bytes, self.env)

    async def start(self, *, port: int | None = None, socket: str | None = None) -> None:
        """Start the scheduler and the timers; say where we listen in ROOMKEEPER_HOME."""
        self._loop = asyncio.get_running_loop()
        self.scheduler.start()
        self._tasks = [
            asyncio.create_task(self.sampler.loop()),
            asyncio.create_task(self.baseline.loop()),
            asyncio.create_task(self.durable_leases.expiry_loop()),
            asyncio.create_task(self.durable_leases.run_due_hooks()),
            asyncio.create_task(self.durable_jobs.run_due_hooks(self._hooks_due)),
            asyncio.create_task(self._resume_loop()),
        ]
        self._tasks += self.link.start(port=port, socket=socket)
        try:
            write_run_record(self.home, boot_id=self.boot_id, port=port, socket=socket)
        except OSError as err:  # a full disk: serve anyway, and say what the CLI lacks
            log.error(
                "could not write %s (%s): the roomkeeper commands cannot find this gateway "
                "until it is written; the API answers on its address",
                self.home / "gateway.json",
                err,
            )
            self.note_persistence_error(err)
            self._run_record_due = (port, socket)  # written by the resume loop once it can be
            # The previous run's record must not outlive it: the next start would take this
            # run's crash for none, or its pid for the previous one's (unlinking frees space).
            with contextlib.suppress(OSError):
                (self.home / "gateway.json").unlink()

    def _watch(self, write: concurrent.futures.Future[None]) -> None:
        """Remember whether the journal can save: a failed write is reported, never hidden."""

        def done(future: concurrent.futures.Future[None]) -> None:
            error = future.exception()
            if error is None:
                self._persistence_error = None
            else:
                if self._persistence_error is None:
                    log.error("the journal could not save: %s", error)
                self.note_persistence_error(error)

        write.add_done_callback(done)

    # ---------------------------------------------------------------- state

    @property
    def closing(self) -> bool:
        """Whether the shutdown path has begun: nothing new is admitted."""
        return self._closing

    @property
    def persistence_error(self) -> str | None:
        """Why the journal cannot save, while it cannot or a job's change is still unsaved
        (new work is refused); else None."""
        if self._recovery_due is not None:
            return self._persistence_error or "start-up recovery is not saved yet"
        if self._persistence_error is None and self.durable_jobs.unsaved:
            return f"{len(self.durable_jobs.unsaved)} job change(s) not saved yet"
        return self._persistence_error

    def note_persistence_error(self, error: BaseException | str) -> None:
        """The journal could not save: report it until a later write succeeds."""
        self._persistence_error = str(error)

    def attach_server(self, server: Server) -> None:
        """The HTTP server that serves this gateway, asked to exit when shutdown begins."""
        self._server = server

    # ----------------------------------------------------------- supervisor

    def _supervisor_gone(self) -> None:
        """The supervisor's channel ended (listener thread): shut down."""
        if not self._closing:
            log.error("the supervisor is gone: shutting down")
            self.begin_shutdown()
        # If the event loop is blocked, the orderly path never runs: after the deadline
        # the process ends itself, and its lifeline takes the managed trees down.
        timer = threading.Timer(self.shutdown_deadline() + 1.0, os._exit, args=(1,))
        timer.daemon = True
        timer.start()

    # -------------------------------------------------------- work in doubt

    def resume_next(self) -> str | None:
        """Resume the oldest deferred job if none is resuming now (one at a time)."""
        if self._closing or self.persistence_error is not None or self.link.recovery_mode:
            return None  # recovery mode holds automatic resumption
        return self.durable_jobs.resume_next()

    async def _resume_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.resume_next)
            if self._run_record_due is not None:
                self._write_run_record_late()
            if self._recovery_due is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._recover_late)
            if self.durable_jobs.unsaved:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.durable_jobs.retry_unsaved)
            await asyncio.sleep(RESUME_CHECK_S)

    def _write_run_record_late(self) -> None:
        """Write ``gateway.json`` that a full disk refused at start, once it can be."""
        assert self._run_record_due is not None
        port, socket = self._run_record_due
        with contextlib.suppress(OSError):
            write_run_record(self.home, boot_id=self.boot_id, port=port, socket=socket)
            self._run_record_due = None
            log.warning("wrote %s: the roomkeeper commands find this gateway now", "gateway.json")

    # ------------------------------------------------------------- answers

    def check(self) -> Decision:
        """The guard's answer, now, for the next waiting job's own estimate (the default
        size when nothing waits): the job admission will judge next."""
        following = self.scheduler.next_waiting()
        if following is None:
            return self.guard.check()
        return self.guard.check(
            memory_bytes=following.estimate_bytes, disk_bytes=following.spec.disk_bytes
        )

    def memory_not_given_back(self) -> str | None:
        """While the baseline stays up after endings: what it rose from and to, in words."""
        watch = self.baseline.watch.statistics()
        if not watch.not_given_back or watch.then_bytes is None or watch.judged_bytes is None:
            return None
        without = self.leases.ended_without_hook()
        return (
            f"memory that no running job or granted lease explains rose from "
            f"{gb(watch.then_bytes)} to {gb(watch.judged_bytes)} GB across job and lease "
            f"endings and has not come back ({without} lease(s) ended without a release "
            "hook); work is judged against the room that is left; the status lists the "
            "processes that grew"
        )

    def held_after_pressure(self) -> str | None:
        """While the cooldown holds admission: why, and for how long, in words; else None."""
        cooldown = self.scheduler.cooldown
        left = cooldown.remaining()
        if left <= 0:
            return None
        if cooldown.cause() is CooldownCause.RELIEF:
            return f"admission is held {left:.0f} s more: the supervisor asked for relief"
        if read_pressure_settings(self.env).cooldown_fixed:
            return (
                f"admission is held {left:.0f} s more after a tree was stopped for memory "
                "pressure (ROOMKEEPER_PRESSURE_COOLDOWN)"
            )
        return (
            "admission is held after a tree was stopped for memory pressure, until its "
            "memory is back and the running jobs' forecast fits under the line "
            f"(at most {left:.0f} s more)"
        )

    def needs_you(self, decision: Decision | None = None) -> dict[str, str]:
        """A headline from a closed vocabulary and the guard's summary: no path, no command.

        Args:
            decision: the guard's answer just taken by :meth:`check`, to say instead of
                taking another reading.
        """
        if self.persistence_error is not None:
            if is_damage(self.persistence_error):
                return {
                    "headline": "journal damaged",
                    "body": "the journal file is damaged (SQLite finds it malformed); new work "
                    "is refused: stop roomkeeper and run roomkeeper journal recover",
                }
            return {
                "headline": "persistence failed",
                "body": "the journal cannot save (the disk may be full); new work is refused",
            }
        if self.link.recovery_mode:
            return {
                "headline": "recovery mode",
                "body": "the gateway restarted too often: queued jobs, deferred work and "
                "automatic resumption are held until roomkeeper repair",
            }
        # Before older doubts: no new work runs anywhere until the cluster answers again.
        silent = None if self.cluster is None else self.cluster.unreachable()
        if silent is not None:
            return {"headline": "cluster unreachable", "body": silent}
        doubt = self.journal.needs_attention_count()
        if doubt:
            return {
                "headline": "uncertain work needs you",
                "body": f"{doubt} job(s) or call(s) were in flight when the gateway stopped; "
                "resolve each as succeeded, failed or rerun",
            }
        held = self.held_after_pressure()
        if held is not None:
            return {"headline": HEADLINES[PressureReason.PRESSURE], "body": held}
        decision = decision if decision is not None else self.check()
        # The CPU gate holds local work only: jobs on a cluster use other machines' CPUs.
        if decision.admit and self.cluster is None and self.scheduler.statistics().running:
            cpu = cpu_pressure_percent()
            threshold = read_queue_settings(self.env).cpu_pressure_percent
            if cpu is not None and cpu > threshold:
                return {
                    "headline": HEADLINES[SchedulerReason.CPU],
                    "body": f"CPU pressure {cpu:.0f} % is above {threshold:.0f} %: "
                    "no new job starts until it falls",
                }
        # After what holds admission now: this one explains why the room keeps shrinking.
        kept = self.memory_not_given_back()
        if kept is not None:
            return {"headline": "memory not given back", "body": f"{kept}; {decision.summary}"}
        return {"headline": HEADLINES.get(decision.reason, "ok"), "body": decision.summary}

    def sample(self) -> Sample:
        """One reading for the chart: the guard's own numbers, so the line is the guard's."""
        return self.sampler.sample()

    def uptime(self) -> float:
        """Seconds since this gateway process started."""
        return time.monotonic() - self.started

    # ------------------------------------------------------------- shutdown

    def begin_shutdown(self) -> bool:
        """Begin the one shutdown path: stop admitting at once, ask the server to exit.

        Safe from any thread and more than once.  The server drains its
        connections, then its lifespan runs :meth:`shutdown`, the stop steps.

        Returns:
            Whether a server was asked to exit; without one the caller runs :meth:`shutdown`.
        """
        self._closing = True
        if self._server is None:
            return False
        self._server.should_exit = True  # read by the server's loop on its next tick
        return True

    def request_stop(self) -> None:
        """Stop the service, not a restart (``POST /v1/shutdown``; on the event loop).

        The path SIGTERM takes, through both layers: the supervisor is told, so that
        the exit that follows is never taken for a crash.
        """
        asked = self.begin_shutdown()
        self.link.tell("stop")
        if not asked:
            self._shutdown_task = asyncio.get_running_loop().create_task(self.shutdown())

    def request_restart(self) -> bool:
        """Ask the supervisor for a fast restart, then shut down (``POST /v1/restart``).

        Returns:
            False when no supervisor runs this gateway; then nothing changes.
        """
        if not self.link.tell("restart"):
            return False
        self.begin_shutdown()
        return True

    async def shutdown(self) -> None:
        """The stop steps, within the shutdown deadline; safe to call more than once."""
        async with self._shutdown_lock:
            if self._shut:
                return
            self._shut = True
            # uvicorn already spent up to a third of the deadline draining connections;
            # the stop steps get the other two thirds.
            deadline = self.shutdown_deadline()
            steps_s = deadline * 2 / 3
            try:
                await asyncio.wait_for(self._shutdown_steps(steps_s), timeout=steps_s)
            except TimeoutError:
                log.error(
                    "the stop steps took longer than their %.1f s (two thirds of the "
                    "shutdown deadline of %.1f s; uvicorn drains connections in the first third)",
                    steps_s,
                    deadline,
                )
            remove_run_record(self.home)
            log.info("roomkeeper gateway stopped")

    async def _shutdown_steps(self, steps_s: float) -> None:
        self._closing = True  # 1. stop admission
        for task in self._tasks:  # 2. stop timers
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        writes = list(self.durable_jobs.writes.values())
        pending = [asyncio.wrap_future(f) for f in writes if not f.done()]
        if pending:  # 3. save state
            await asyncio.gather(*pending, return_exceptions=True)
        grace = max(0.5, min(5.0, steps_s / 2))  # 4. stop managed trees
        # Reaping them has three quarters of the steps' time, so the services below close.
        await asyncio.to_thread(self.scheduler.close, grace=grace, within=steps_s * 3 / 4)
        await asyncio.to_thread(self.hooks.close)  # 5. close services (hooks end by their deadline)
        await asyncio.to_thread(self.lease_relief.close)
        await asyncio.to_thread(self.journal.close)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.close)


def open_cluster(env: Mapping[str, str]) -> RayBackend | None:
    """The Ray backend when ROOMKEEPER_BACKEND=ray (Ray imported only then), else None.

    Raises:
        UsageError: the backend variables are wrong, Ray is not installed
            (the message says ``pip install 'roomkeeper[ray]'``), or no cluster answers.
    """
    settings = read_backend_settings(env)
    if settings.backend != "ray" or settings.ray_address is None:
        return None
    from roomkeeper.cluster.backend import RayBackend

    return RayBackend(settings.ray_address, job_cpus=settings.ray_job_cpus)

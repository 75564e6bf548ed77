"""The gateway service: the scheduler, the guard, leases and the journal behind one object.

:mod:`roomkeeper.api.app` serves it over HTTP.  It keeps room for itself:
ROOMKEEPER_GATEWAY_RESERVE_MB is taken off the guard's line so admitted
work cannot squeeze the process that must stay responsive.  Managed jobs do
not inherit ``ROOMKEEPER_*`` variables, and the token never lies under the
workspace, so an agent's tool command does not find the keys by accident.

The Gateway owns its parts and wires them; each concept lives in its own module:
:mod:`~roomkeeper.gateway.home` (the token, the journal, the run record),
:mod:`~roomkeeper.gateway.jobs` and :mod:`~roomkeeper.gateway.leases` (each
change durable), :mod:`~roomkeeper.gateway.doubt` (work a crash left in doubt),
:mod:`~roomkeeper.gateway.startup` (what it does at start, and what a full disk
left owed), :mod:`~roomkeeper.gateway.background` (what runs while it serves),
:mod:`~roomkeeper.gateway.headlines` (what it says first),
:mod:`~roomkeeper.gateway.persistence` (whether the journal can save),
:mod:`~roomkeeper.gateway.link` (the supervisor, its holds, repair),
:mod:`~roomkeeper.gateway.samples` (the Health page's chart) and
:mod:`~roomkeeper.gateway.refusals` (its recent refusals).  The parts share one
:class:`~roomkeeper.gateway.context.GatewayContext`.  The API reads
``closing`` and ``persistence_error`` and calls the parts' operations.

One idempotent shutdown path serves SIGTERM, SIGINT and ``POST /v1/shutdown``
(:mod:`~roomkeeper.gateway.shutdown`): it stops admission at once and asks the
server to exit; the server's lifespan then runs the Gateway's stop steps (stop
timers, save state, stop managed trees, close the journal), within
ROOMKEEPER_SHUTDOWN_S.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from roomkeeper.config import (
    gateway_reserve_bytes,
    read_backend_settings,
    read_pressure_settings,
    read_queue_settings,
)
from roomkeeper.gateway.background import Background
from roomkeeper.gateway.baseline import BaselineKeeper
from roomkeeper.gateway.calls import Calls
from roomkeeper.gateway.context import GatewayContext
from roomkeeper.gateway.doubt import WorkInDoubt
from roomkeeper.gateway.headlines import Headlines
from roomkeeper.gateway.home import (
    open_journal,
    require_token_outside_workspace,
    unclean_stop_pid,
)
from roomkeeper.gateway.jobs import DurableJobs
from roomkeeper.gateway.leases import DurableLeases
from roomkeeper.gateway.link import SupervisorLink
from roomkeeper.gateway.persistence import Persistence
from roomkeeper.gateway.refusals import REFUSALS_KEPT, Refusal
from roomkeeper.gateway.relieve import LeaseRelief
from roomkeeper.gateway.samples import Sample, Sampler
from roomkeeper.gateway.shutdown import ShutdownPath
from roomkeeper.gateway.startup import Startup, say_who_jobs_run_as
from roomkeeper.gateway.worktrees import gateway_worktrees
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.leases import Leases
from roomkeeper.ipc import Channel
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.settings import SchedulerParts, SchedulerSettings
from roomkeeper.loopback.hook_calls import HookRunner
from roomkeeper.processes.job_user import JobUser, read_job_user
from roomkeeper.relief.ladder import Step
from roomkeeper.relief.monitor import ReliefEvent

if TYPE_CHECKING:
    from roomkeeper.cluster.backend import NodeView, RayBackend
    from roomkeeper.cluster.watch import NodeStep
    from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.journal.database import Journal
from roomkeeper.paths import home_dir, load_token, validate_home, workspace_dir

log = logging.getLogger("roomkeeper")


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
        self.persistence = Persistence()  # whether the journal can save
        self.shutdown_path = ShutdownPath(
            env=env,
            home=home,
            supervised=channel is not None,
            tell=lambda kind: self.link.tell(kind),  # noqa: PLW0108 (the link comes later)
            steps=self._shutdown_steps,
        )
        self.context = GatewayContext(
            env=env,
            journal=journal,
            watch=self.persistence.watch,
            closing=lambda: self.shutdown_path.closing,
        )
        self.guard = Guard(env=env, reserve=self._gateway_reserve)
        self.cluster = open_cluster(env)  # None: jobs run here, as managed trees
        self.calls = Calls(journal, watch=self.persistence.watch)
        self.leases = Leases(self.guard)
        self.hooks = HookRunner()  # release hooks: their own pool, one deadline each
        self.refusals: deque[Refusal] = deque(maxlen=REFUSALS_KEPT)  # newest last
        self.worktrees = gateway_worktrees(
            journal=journal, workspace=self.workspace, env=env, watch=self.persistence.watch
        )
        self.durable_jobs = DurableJobs(
            self.context,
            settings=self._scheduler_settings(),
            parts=self._scheduler_parts(),
            hooks=self.hooks,
            refusals=self.refusals,
        )
        self.scheduler = hear_nodes(self.cluster, self.durable_jobs)
        self.doubt = WorkInDoubt(self.context, scheduler=self.scheduler)
        self.durable_leases = self._durable_leases()
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start: leases end there
        self.lease_relief = LeaseRelief(
            leases=self.durable_leases,
            journal=journal,
            watch=self.persistence.watch,
            end=self._end_relieved,
        )
        self.scheduler.monitor.watch_leases(self.lease_relief)
        self.baseline = BaselineKeeper(
            guard=self.guard,
            scheduler=self.scheduler,
            leases=self.leases,
            journal=journal,
            watch=self.persistence.watch,
            env=env,
        )
        self.sampler = Sampler(
            guard=self.guard, scheduler=self.scheduler, explained=self._explained
        )
        self.samples = self.sampler.samples  # the Health page's chart, newest last
        self.link = SupervisorLink(
            channel,
            self.context,
            boot_id=self.boot_id,
            scheduler=self.scheduler,
            gone=self.shutdown_path.supervisor_gone,
        )
        self.headlines = Headlines(
            self.context,
            scheduler=self.scheduler,
            leases=self.leases,
            baseline=self.baseline,
            cluster=self.cluster,
            link=self.link,
            persistence_error=lambda: self.persistence_error,
        )
        self.startup = Startup(
            self.context,
            home=home,
            boot_id=self.boot_id,
            jobs=self.durable_jobs,
            leases=self.durable_leases,
            persistence=self.persistence,
        )
        self.background = Background(
            startup=self.startup,
            jobs=self.durable_jobs,
            leases=self.durable_leases,
            doubt=self.doubt,
            may_resume=self._may_resume,
        )

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
        say_who_jobs_run_as(job_user)
        gateway.startup.settle(previous_pid)
        return gateway

    # ---------------------------------------------------------------- setup

    def _scheduler_settings(self) -> SchedulerSettings:
        """The scheduler's settings: its bounds and the pressure variables read from our
        variables afresh on each use, with the gateway's holds on top of the bounds."""
        return SchedulerSettings(
            logs_dir=self.home / "logs",
            limits=self._limits,
            pressure_settings=lambda: read_pressure_settings(self.env),
        )

    def _scheduler_parts(self) -> SchedulerParts:
        """The scheduler's parts: our guard, the job user, the jobs' worktrees, and the Ray
        backend's launcher and placement when jobs run there."""
        return SchedulerParts(
            guard=self.guard,
            job_user=self.job_user,
            prepare=self.worktrees.prepare,
            reclaim_disk=self.worktrees.reclaim,
            launcher=None if self.cluster is None else self.cluster.launch,
            placement=None if self.cluster is None else self.cluster.place,
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
            closing=self.context.closing,
            watch=self.persistence.watch,
            hooks=self.hooks,
            reclaim_disk=self.worktrees.reclaim_space,
        )

    def _limits(self) -> Limits:
        """The bounds from the variables, with the gateway's holds on top."""
        limits = self.link.holds(Limits.from_settings(read_queue_settings(self.env)))
        # Owed start-up recovery stops the previous run's trees: nothing of ours may start
        # before it has run, or it would be taken for one of them.
        return replace(limits, hold=True) if self.startup.recovery_due else limits

    @property
    def backend(self) -> str:
        """Where admitted jobs run: ``local`` or ``ray``."""
        return "local" if self.cluster is None else "ray"

    def nodes(self) -> list[NodeView]:
        """The Ray cluster's nodes, our jobs and headroom on each; empty for the local backend."""
        return [] if self.cluster is None else self.cluster.nodes()

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
        self.background.start(self.sampler.loop(), self.baseline.loop())
        self.background.adopt(self.link.start(port=port, socket=socket))
        self.startup.write_run_record(port=port, socket=socket)

    # ---------------------------------------------------------------- state

    @property
    def closing(self) -> bool:
        """Whether the shutdown path has begun: nothing new is admitted."""
        return self.shutdown_path.closing

    @property
    def persistence_error(self) -> str | None:
        """Why the journal cannot save, while it cannot or a job's or lease's change is still
        unsaved (new work is refused); else None."""
        error = self.persistence.error
        if self.startup.recovery_due:
            return error or "start-up recovery is not saved yet"
        if error is None:
            owed = (
                (len(self.durable_jobs.unsaved), "job"),
                (self.durable_leases.records.owed, "lease"),
            )
            said = [f"{n} {what} change(s)" for n, what in owed if n]
            return " and ".join(said) + " not saved yet" if said else None
        return error

    def _may_resume(self) -> bool:
        """Whether nothing holds automatic work: not closing, the journal saving, no
        recovery mode."""
        return not (self.closing or self.persistence_error is not None or self.link.recovery_mode)

    def sample(self) -> Sample:
        """One reading for the chart: the guard's own numbers, so the line is the guard's."""
        return self.sampler.sample()

    def uptime(self) -> float:
        """Seconds since this gateway process started."""
        return time.monotonic() - self.started

    # ------------------------------------------------------------- shutdown

    async def _shutdown_steps(self, steps_s: float) -> None:
        """The stop steps after admission stopped (1.), in order, in ``steps_s`` seconds."""
        await self.background.stop()  # 2. stop timers
        pending = [asyncio.wrap_future(f) for f in self.durable_jobs.pending_writes()]
        if pending:  # 3. save state
            await asyncio.gather(*pending, return_exceptions=True)
        grace = max(0.5, min(5.0, steps_s / 2))  # 4. stop managed trees
        # Reaping them has three quarters of the steps' time, so the services below close.
        await asyncio.to_thread(self.scheduler.close, grace=grace, within=steps_s * 3 / 4)
        # The outcomes of the jobs ended just now: each is saved once its log is synced.
        ended = [asyncio.wrap_future(f) for f in self.durable_jobs.pending_writes()]
        if ended:
            await asyncio.gather(*ended, return_exceptions=True)
        await asyncio.to_thread(self.hooks.close)  # 5. close services (hooks end by their deadline)
        await asyncio.to_thread(self.lease_relief.close)
        await asyncio.to_thread(self.journal.close)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.close)


def hear_nodes(cluster: RayBackend | None, jobs: DurableJobs) -> Scheduler:
    """Have each step a Ray node's own ladder takes recorded here (:func:`record_node_step`);
    the jobs' scheduler."""
    if cluster is not None:
        cluster.on_step = functools.partial(record_node_step, jobs, jobs.scheduler)
    return jobs.scheduler


def record_node_step(jobs: DurableJobs, scheduler: Scheduler, step: NodeStep) -> None:
    """A step a Ray node's own ladder took: in the recovery history with the node's id, in
    the job's state (suspended, running again), and in the log with the node's host."""
    log.warning(
        "node %s (%s): memory pressure: %s%s: %s",
        step.host,
        step.node_id[:12],
        step.step,
        "" if step.job_id is None else f" job {step.job_id}",
        step.why,
    )
    jobs.records.relief_step(node_relief_event(step), node=step.node_id)
    if step.job_id is not None:
        scheduler.relief.note_remote_step(step.job_id, Step(step.step))


def node_relief_event(step: NodeStep) -> ReliefEvent:
    """A Ray node's step as the gateway's own monitor would have told it."""
    return ReliefEvent(
        Step(step.step),
        step.job_id,
        step.used_bytes,
        step.limit_bytes,
        step.footprint_bytes,
        step.reaction_s,
        step.why,
        step.never_fits,
    )


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

    return RayBackend(
        settings.ray_address,
        job_cpus=settings.ray_job_cpus,
        watch_nodes=settings.ray_node_monitors,
    )

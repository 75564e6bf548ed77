"""What a scheduler is built from, in four records passed whole.

:class:`~roomkeeper.jobs.scheduler.Scheduler` takes its settings, its parts,
its listeners and its clocks as one record each, and hands the same records
on to its launch rounds (:mod:`roomkeeper.jobs.rounds`): a value is declared
once, here, never threaded keyword by keyword through each layer.  Every
field has a default but the logs directory, so a test builds only what it
needs.

Settings that a person may change while roomkeeper runs are *readers*
(``limits``, ``pressure_settings``): called afresh on every round or reading,
so there is no restart to reconfigure.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roomkeeper.config import PressureSettings, read_pressure_settings, read_queue_settings
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.rule import Decision
from roomkeeper.jobs.handle import Handle
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.spec import JobView
from roomkeeper.kernel.resources import cpu_pressure_percent, usable_cores
from roomkeeper.processes.job_user import JobUser
from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.relief.cooldown import Cooldown
from roomkeeper.relief.monitor import INTERVAL_S, ReliefEvent
from roomkeeper.worktrees.request import Worktree

STOP_GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL when roomkeeper stops a tree

Launcher = Callable[[str, LaunchSpec], Handle]
Prepare = Callable[[JobView], Worktree | None]
ReclaimDisk = Callable[[JobView, Decision], bool]
Placement = Callable[[str, int], Decision]
"""Asked instead of the guard when jobs run elsewhere: (job id, memory estimate) -> decision."""


def read_limits() -> Limits:
    """The scheduler's bounds from the ``ROOMKEEPER_MAX_*`` and CPU variables, read now."""
    return Limits.from_settings(read_queue_settings())


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Where a scheduler keeps output, and how it runs and relieves.

    Attributes:
        logs_dir: where each job's output file goes (``<id>.log``).
        limits: returns the bounds for a round; by default read from ``ROOMKEEPER_*`` on
            every round (no restart to reconfigure).
        pressure_settings: the ROOMKEEPER_PRESSURE_* variables, read afresh for each
            reading of the pressure monitor and each re-run.
        stop_grace: seconds between SIGTERM and SIGKILL when a tree is stopped.
        pressure: whether the pressure monitor runs beside the scheduler's thread
            (``start`` starts it, ``close`` stops it).
        monitor_interval: seconds between the monitor's readings.
    """

    logs_dir: str | os.PathLike[str]
    limits: Callable[[], Limits] = read_limits
    pressure_settings: Callable[[], PressureSettings] = read_pressure_settings
    stop_grace: float = STOP_GRACE_SECONDS
    pressure: bool = True
    monitor_interval: float = INTERVAL_S

    def retries(self) -> int:
        """ROOMKEEPER_PRESSURE_RETRIES now: how many times restartable work runs again."""
        return self.pressure_settings().retries


@dataclass(frozen=True, slots=True)
class SchedulerParts:
    """What a scheduler works with; each has a default that runs jobs here.

    Attributes:
        guard: the admission guard; a new :class:`~roomkeeper.guard.admission.Guard`
            when omitted.
        launcher: starts a tree; :func:`roomkeeper.processes.launch.launch` with a
            lifeline when omitted.
        job_user: the user jobs run as; None for ours (``ROOMKEEPER_JOB_USER``).
        cooldown: the one cooldown clock (the gateway shares it with the supervisor's
            relief); a new one on the scheduler's clock when omitted.
        prepare: makes or reuses the git worktree of a job that asked for one, after
            admission and before ``before_launch`` (lock not held); the command runs
            inside it.  If it raises, the job fails without starting.  None: a job that
            asks for a worktree fails.
        reclaim_disk: the one worktree prune a refusal for disk gets before it stands,
            given the job and the refusal (its ``disk_needed_bytes`` is the line to
            reach); True when it freed anything, and the guard judges again.
        placement: asked instead of the guard before each launch, when ``launcher``
            runs jobs on other machines (the Ray backend); None: the guard decides.
    """

    guard: Guard | None = None
    launcher: Launcher | None = None
    job_user: JobUser | None = None
    cooldown: Cooldown | None = None
    prepare: Prepare | None = None
    reclaim_disk: ReclaimDisk | None = None
    placement: Placement | None = None


@dataclass(frozen=True, slots=True)
class SchedulerListeners:
    """Who a scheduler tells what happens; each is optional.

    Attributes:
        on_change: called with a job's view after each state change, outside the lock.
        on_end: called for each job that ended, outside the lock and before the next
            launch round.  It may return a future (a release hook started elsewhere):
            until that resolves the job's memory stays reserved, so the hook runs
            before that memory is offered again, and nothing else waits.
        on_refusal: called with the job id and the guard's refusal (every refused round).
        before_launch: called with the job's view just before its spawn, lock not held
            (it waits on the disk); it writes the durable pending marker (save first), and
            the job starts only once it has returned.  If it raises, the job is not started
            and ends as failed; a cancel or a shutdown meanwhile ends it cancelled once it
            has returned.
        on_relief: told of every step the relief ladder takes (the gateway's history).
    """

    on_change: Callable[[JobView], None] | None = None
    on_end: Callable[[JobView], concurrent.futures.Future[Any] | None] | None = None
    on_refusal: Callable[[str, Decision], None] | None = None
    before_launch: Callable[[JobView], None] | None = None
    on_relief: Callable[[ReliefEvent], None] | None = None


@dataclass(frozen=True, slots=True)
class SchedulerClocks:
    """What a scheduler reads of time and the CPU, injected so tests run on fake ones.

    Attributes:
        clock: monotonic seconds (deadlines).
        wall: wall-clock seconds (timestamps people read).
        cpu_percent: CPU pressure in percent, or None when unknown.
        cores: the cores our jobs may use.
    """

    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    cpu_percent: Callable[[], float | None] = cpu_pressure_percent
    cores: Callable[[], int] = usable_cores

"""roomkeeper: admit work only when the container has room for it.

The package map (``docs/ARCHITECTURE.md`` draws it and follows one request
through it).  The top level holds the public face (this module), the
``roomkeeper`` command's entry (``__main__``), the shared basics and the
test fakes; everything else lives in a subpackage one level deep, one
family of concepts each.  Subpackages re-export nothing: import public names
from ``roomkeeper`` itself.

Basics, importable from anywhere: ``errors``, ``units``, ``config``, ``paths``.

Who may import whom, beside the basics (imports point down; no circle anywhere):

- ``kernel``: parsers, our own cgroup and its levels, fresh readings, job
  cgroups, processes as ``/proc`` lists them.  May import: nothing else of ours.
- ``loopback``: calls made out on loopback when work ends or must give memory
  back: release and relieve hooks, each with one deadline and a bounded pool.
  May import: nothing else of ours.
- ``guard``: the admission rule and its reservations, memory policies, the
  lines it draws, leases.  May import: ``loopback``, ``kernel``.
- ``relief``: the pressure monitor, the relief ladder, the cooldown.
  May import: ``guard``, ``loopback``, ``kernel``.
- ``processes``: managed process trees: launching, sampled peaks, suspension,
  orphans, readiness, the job user, the lifeline.  May import: ``kernel``.
- ``jobserver``: GNU make's jobserver for a job (a private FIFO and inherited
  descriptors, ``MAKEFLAGS``), its tokens minted only while the guard says another
  step fits.  May import: ``guard``, ``loopback``, ``kernel``.
- ``worktrees``: a git worktree per job, and the pruning of finished ones.
  May import: ``guard``, ``loopback``, ``kernel``.
- ``jobs``: specs and states, the fair queue, the scheduler and its launch
  rounds, learned-size keys.  May import: ``jobserver``, ``worktrees``, ``processes``, ``relief``,
  ``guard``, ``loopback``, ``kernel``.
- ``journal``: the SQLite journal, one module per table; every SQL string of
  the project.  May import: ``jobs``, ``jobserver``, ``worktrees``, ``processes``, ``relief``,
  ``guard``, ``loopback``, ``kernel``.
- ``cluster``: the Ray backend: placement on the cluster, the task
  that asks a node's own guard and runs the job there, the gateway's handle
  of it.  Ray itself is imported only when chosen.  May import: ``jobs``, ``jobserver``,
  ``worktrees``, ``processes``, ``relief``, ``guard``, ``loopback``, ``kernel``.
- ``gateway``: the service that owns scheduler, guard and journal; durable
  jobs and leases, recovery, registered calls, samples, the supervisor link.
  May import: ``cluster``, ``journal``, ``jobs``, ``jobserver``, ``worktrees``, ``processes``,
  ``relief``, ``guard``, ``loopback``, ``kernel``, ``ipc``.
- ``api``: the HTTP app, one module per resource's routes, models, views,
  metrics, serving.  May import: ``gateway``, ``cluster``, ``journal``, ``jobs``, ``jobserver``,
  ``worktrees``, ``processes``, ``relief``, ``guard``, ``loopback``, ``kernel``, ``ipc``.
- ``client``: the typed Python client of the HTTP API, sync and async, with leases held
  by their own heartbeat; its transport and agent-hook call load neither pydantic nor
  anything of ``api``, for ``roomkeeper hook``.  May import: ``api``, ``gateway``,
  ``cluster``, ``journal``, ``jobs``, ``jobserver``, ``worktrees``, ``processes``,
  ``relief``, ``guard``, ``loopback``, ``kernel``, ``ipc``.
- ``supervisor``: runs the gateway as its child and watches it from outside;
  talks to it through ``ipc`` only.  May import: ``ipc``.
- ``batch``: ``roomkeeper batch``, a memory-aware ``parallel`` on the
  scheduler, without a server.  May import: ``jobs``, ``jobserver``, ``worktrees``, ``processes``,
  ``relief``, ``guard``, ``loopback``, ``kernel``.
- ``cli``: the ``roomkeeper`` command, and what ``batch`` shows a person.
  May import: ``api``, ``gateway``, ``batch``, ``cluster``, ``journal``, ``jobs``, ``jobserver``,
  ``worktrees``, ``processes``, ``relief``, ``guard``, ``loopback``, ``kernel``, ``ipc``,
  ``supervisor``, ``client``.

``ipc`` (the supervisor's socketpair protocol) imports nothing of ours.
``testing`` holds fakes for tests and may import anything.  Only ``api``
imports FastAPI or Starlette.

The public names below are loaded on first use, so that importing one
layer (say ``roomkeeper.errors``) does not load the layers above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roomkeeper.batch.run import BatchResult, run_batch
    from roomkeeper.client.aio import AsyncClient, AsyncLease
    from roomkeeper.client.discovery import ClientSettings, Retries
    from roomkeeper.client.sync import Client, Lease
    from roomkeeper.guard.admission import Guard, GuardStatistics
    from roomkeeper.guard.packing import MemoryPolicy
    from roomkeeper.guard.rule import Decision, Reason, Word
    from roomkeeper.jobs.queue import Limits
    from roomkeeper.jobs.scheduler import Scheduler, SchedulerStatistics
    from roomkeeper.jobs.settings import (
        SchedulerClocks,
        SchedulerListeners,
        SchedulerParts,
        SchedulerSettings,
    )
    from roomkeeper.jobs.spec import EstimateSource, JobSpec, JobState, JobView, SchedulerReason
    from roomkeeper.kernel.resources import (
        DiskReading,
        LimitOrigin,
        MemoryReading,
        MemorySource,
        Resources,
        read_resources,
    )
    from roomkeeper.relief.ladder import PressureReason

_HOMES = {
    "AsyncClient": "client.aio",
    "AsyncLease": "client.aio",
    "Client": "client.sync",
    "ClientSettings": "client.discovery",
    "Lease": "client.sync",
    "Retries": "client.discovery",
    "Decision": "guard.rule",
    "Guard": "guard.admission",
    "GuardStatistics": "guard.admission",
    "Reason": "guard.rule",
    "Word": "guard.rule",
    "MemoryPolicy": "guard.packing",
    "BatchResult": "batch.run",
    "run_batch": "batch.run",
    "Limits": "jobs.queue",
    "Scheduler": "jobs.scheduler",
    "SchedulerStatistics": "jobs.scheduler",
    "SchedulerClocks": "jobs.settings",
    "SchedulerListeners": "jobs.settings",
    "SchedulerParts": "jobs.settings",
    "SchedulerSettings": "jobs.settings",
    "EstimateSource": "jobs.spec",
    "JobSpec": "jobs.spec",
    "JobState": "jobs.spec",
    "JobView": "jobs.spec",
    "SchedulerReason": "jobs.spec",
    "DiskReading": "kernel.resources",
    "LimitOrigin": "kernel.resources",
    "MemoryReading": "kernel.resources",
    "MemorySource": "kernel.resources",
    "Resources": "kernel.resources",
    "read_resources": "kernel.resources",
    "PressureReason": "relief.ladder",
}

__all__ = [
    "AsyncClient",
    "AsyncLease",
    "BatchResult",
    "Client",
    "ClientSettings",
    "Decision",
    "DiskReading",
    "EstimateSource",
    "Guard",
    "GuardStatistics",
    "JobSpec",
    "JobState",
    "JobView",
    "Lease",
    "LimitOrigin",
    "Limits",
    "MemoryPolicy",
    "MemoryReading",
    "MemorySource",
    "PressureReason",
    "Reason",
    "Resources",
    "Retries",
    "Scheduler",
    "SchedulerClocks",
    "SchedulerListeners",
    "SchedulerParts",
    "SchedulerReason",
    "SchedulerSettings",
    "SchedulerStatistics",
    "Word",
    "read_resources",
    "run_batch",
]
__version__ = "0.1.0"


def __dir__() -> list[str]:
    """The module's own names and the public ones loaded on first use."""
    return sorted({*globals(), *_HOMES})


def __getattr__(name: str) -> Any:
    """``roomkeeper.Guard`` and the other public names, imported when first asked for."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"roomkeeper.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'roomkeeper' has no attribute {name!r}")

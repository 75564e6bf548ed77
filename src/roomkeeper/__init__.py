"""roomkeeper: admit work only when the container has room for it.

Layers, bottom to top; each module imports only from its own layer or those below it:

1. ``errors``, ``units``, ``config``, ``paths`` -- words, numbers, variables, places.
2. ``parsers`` (pure kernel text -> records), ``cgroup_hierarchy`` (finding our
   own cgroup and its levels), ``resources`` (fresh readings), ``history``
   (allowlisted recovery events).
3. ``admission`` (the guard), ``jobs`` (job records, in the guard's words),
   ``queue`` (the bounded fair queue), ``jobbook`` (the scheduler's records),
   ``journal`` (SQLite, group commit), ``hooks``.
4. ``cgroups``, ``lifeline``, ``process`` (managed trees), ``launch`` (starting
   one), ``runner`` (launch rounds), ``scheduler``, ``leases``, ``calls``,
   ``recovery``, ``batch``.
5. ``gateway_samples`` (the chart's samples), ``gateway_jobs``, ``gateway_leases``
   (durable jobs and leases), ``gateway_link`` (facing the supervisor),
   ``gateway`` (the service), ``metrics``, ``api_models``, ``bodylimit``,
   ``api_views`` (records as JSON), ``api_jobs``, ``api_leases`` (route groups),
   ``api`` (the HTTP app), ``gateway_main``; ``ipc``, ``watchdog``, ``restarts``,
   ``sdnotify``, ``supervisor_records``, ``gateway_child``, ``supervisor``
   (watching it from outside); ``client``.
6. ``cli``, ``cli_gateway`` (running the service), ``cli_client`` (talking to
   it) -- the ``roomkeeper`` command.

``testing`` holds fakes (a clock) for tests and may import any layer.

The names below are loaded on first use, so that importing one layer (say
``roomkeeper.errors``) does not load the layers above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roomkeeper.admission import Decision, Guard, GuardStatistics, Reason
    from roomkeeper.resources import (
        DiskReading,
        LimitOrigin,
        MemoryReading,
        MemorySource,
        Resources,
        read_resources,
    )

_HOMES = {
    "Decision": "admission",
    "Guard": "admission",
    "GuardStatistics": "admission",
    "Reason": "admission",
    "DiskReading": "resources",
    "LimitOrigin": "resources",
    "MemoryReading": "resources",
    "MemorySource": "resources",
    "Resources": "resources",
    "read_resources": "resources",
}

__all__ = [
    "Decision",
    "DiskReading",
    "Guard",
    "GuardStatistics",
    "LimitOrigin",
    "MemoryReading",
    "MemorySource",
    "Reason",
    "Resources",
    "read_resources",
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

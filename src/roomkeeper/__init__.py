"""roomkeeper: admit work only when the container has room for it.

Layers, bottom to top; each imports only from the layers below it:

1. ``errors``, ``units``, ``config``, ``paths`` -- words, numbers, variables, places.
2. ``parsers`` (pure kernel text -> records), ``resources`` (fresh readings),
   ``history`` (allowlisted recovery events), ``jobs`` (job records).
3. ``admission`` (the guard), ``journal`` (SQLite, group commit), ``hooks``.
4. ``cgroups``, ``lifeline``, ``process`` (managed trees), ``scheduler``,
   ``leases``, ``calls``, ``recovery``, ``batch``.
5. ``gateway`` (the service), ``metrics``, ``api_models``, ``bodylimit``,
   ``api`` (HTTP), ``gateway_main``; ``ipc``, ``watchdog``, ``restarts``,
   ``sdnotify``, ``supervisor`` (watching it from outside); ``client``.
6. ``cli``, ``cli_gateway`` -- the ``roomkeeper`` command.

``testing`` holds fakes (a clock) for tests and may import any layer.
"""

from roomkeeper.admission import Decision, Guard, GuardStatistics, Reason
from roomkeeper.resources import (
    DiskReading,
    LimitOrigin,
    MemoryReading,
    MemorySource,
    Resources,
    read_resources,
)

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

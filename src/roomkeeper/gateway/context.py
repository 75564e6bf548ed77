"""What every part of the gateway shares, in one record passed whole.

The gateway's parts (durable jobs, the supervisor link, the headlines, the
start-up steps) each read the same variables, write to the same journal,
report a failed write the same way and stop taking work at the same moment.
:class:`GatewayContext` carries those four, so no part takes them one
keyword at a time.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from roomkeeper.journal.database import Journal


@dataclass(frozen=True, slots=True)
class GatewayContext:
    """The gateway's variables, its journal, the watch on the journal's writes, and whether
    it is closing.

    Attributes:
        env: the variables to read; every part reads them afresh on each use.
        journal: the open journal behind every durable change.
        watch: told of every journal write, to report one that fails.
        closing: whether the gateway is shutting down (nothing new is admitted).
    """

    env: Mapping[str, str]
    journal: Journal
    watch: Callable[[concurrent.futures.Future[Any]], None]
    closing: Callable[[], bool]

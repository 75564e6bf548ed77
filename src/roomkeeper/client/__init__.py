"""A typed Python client of the gateway's HTTP API: ``Client`` and ``AsyncClient``.

``discovery`` finds the gateway and its token; ``wire`` holds what both clients share
(errors from answers, the retry policy, the API's models); ``sync`` and ``aio`` are the
clients, each with its lease holder that heartbeats on its own thread or task.
Import them from ``roomkeeper`` itself: ``from roomkeeper import Client``.
"""

from __future__ import annotations

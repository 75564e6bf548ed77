"""A typed Python client of the gateway's HTTP API: ``Client`` and ``AsyncClient``.

``discovery`` finds the gateway and its token; ``wire`` holds what both clients share
(errors from answers, the retry policy); ``bodies`` the request bodies, checked by the
API's models; ``transport`` sends a request with those retries, and ``agent_hooks`` a
hook event through it, light enough for a process started per tool call; ``sync`` and
``aio`` are the clients, each with its lease holder that heartbeats on its own thread
or task.
Import them from ``roomkeeper`` itself: ``from roomkeeper import Client``.
"""

from __future__ import annotations

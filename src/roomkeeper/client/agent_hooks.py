"""One coding agent's hook event, handed to the gateway's agent-hook route as the tool
sent it, and the answer the tool reads back.

Only the transport and plain JSON: ``roomkeeper hook`` runs this in a process a tool
starts for every tool call, where loading the API's models would cost more than the
call.  Nothing here checks the event or the query with the API's models: the route
checks both (an unknown mode, an estimate out of bounds, a body that is not an event
are refused with 422, which reaches the caller as a typed error).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roomkeeper.client.transport import Transport
from roomkeeper.client.wire import Call


def agent_hook(
    transport: Transport, tool: str, event: Mapping[str, Any], **settings: Any
) -> dict[str, Any]:
    """Answer one hook event of ``tool`` (``claude-code`` or ``codex``) as the tool reads
    it: ``{}`` for no decision, else its decision (``POST /v1/agent-hooks/{tool}``).

    Args:
        transport: the gateway's transport.
        tool: the route's tool.
        event: the hook event, as the tool sent it.
        settings: ``mode``, ``memory_mb``, ``wait_s``, ``ttl_s``, ``bash``: the route's query.

    Raises:
        GatewayError: the gateway refused the request (a 422 for a bad event or query).
        GatewayUnavailable: no answer.
    """
    wait = float(settings.get("wait_s", 0)) if settings.get("mode", "wait") == "wait" else 0.0
    query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in settings.items()}
    # Safe to send again: a grant is keyed by the call's own tool_use_id, a release is one.
    call = Call(
        "POST", f"/v1/agent-hooks/{tool}", dict(event), query, idempotent=True, extra_s=wait
    )
    answer: dict[str, Any] = transport.send(call).json()
    return answer

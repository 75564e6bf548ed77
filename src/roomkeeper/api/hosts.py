"""An ASGI middleware that answers only requests meant for this machine's loopback.

A DNS-rebinding page makes a browser send its requests to 127.0.0.1 under
the attacker's own name; the ``Host`` header still says that name.  So only
``127.0.0.1``, ``localhost`` and ``[::1]`` (any port) are answered, and a
request whose ``Origin`` is another site (a page elsewhere posting to us) is
refused: both with 403 and a ``reason`` from the API's closed vocabulary.
"""

from __future__ import annotations

import json
from typing import Any

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port, lower case (``[::1]`` keeps brackets)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


class LoopbackOnly:
    """Refuse a request whose Host is not loopback or whose Origin is not the Host's own."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if host_name(host) not in LOOPBACK_NAMES:
            await _refuse(
                send,
                "host_not_allowed",
                f"Host {host!r} is not this machine's loopback; "
                "use http://127.0.0.1, http://localhost or http://[::1] (any port)",
            )
            return
        origin = headers.get(b"origin")
        if origin is not None:
            given = origin.decode("latin-1").strip().lower()
            if given not in (f"http://{host.lower()}", f"https://{host.lower()}"):
                await _refuse(
                    send,
                    "origin_not_allowed",
                    f"requests from the page at {given!r} are refused: only this gateway's "
                    "own pages may call it from a browser",
                )
                return
        await self.app(scope, receive, send)


async def _refuse(send: Any, reason: str, detail: str) -> None:
    body = json.dumps({"reason": reason, "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})

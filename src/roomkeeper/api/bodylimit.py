"""An ASGI middleware that refuses request bodies over a limit with 413, chunked ones included."""

from __future__ import annotations

from typing import Any


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, chunked ones included.

    Content-Length is checked first; a body without one is counted as it arrives.
    """

    def __init__(self, app: Any, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _too_large(send, self.limit)
            return
        if length is not None:
            await self.app(scope, receive, send)
            return
        # No Content-Length (a chunked body): read it here, up to the limit, then replay it.
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await _too_large(send, self.limit)
                return
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def replayed() -> Any:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


async def _too_large(send: Any, limit: int) -> None:
    body = (
        f'{{"reason": "body_too_large", "detail": "bodies are limited to {limit} bytes"}}'.encode()
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})

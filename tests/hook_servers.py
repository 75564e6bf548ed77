"""A loopback server that records the release hooks it is sent, for tests of durable hooks."""

from __future__ import annotations

import http.server
import threading
import time


class SlowHooks:
    """A loopback server that records (method, path, Idempotency-Key) and answers after
    ``delay_s``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[str, str, str | None]] = []
        calls, self.delay_s = self.calls, delay_s
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_DELETE(self) -> None:
                calls.append((self.command, self.path, self.headers.get("Idempotency-Key")))
                time.sleep(owner.delay_s)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def paths(self) -> list[str]:
        """The path of each call, in order."""
        return [path for _, path, _ in self.calls]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

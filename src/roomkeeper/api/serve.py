"""Running the gateway process: uvicorn, the lifespan, and the supervisor's channel.

``roomkeeper gateway`` runs this alone; ``roomkeeper serve`` runs it as the
supervisor's child with a private channel (:mod:`roomkeeper.ipc`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

# FastAPI imports pydantic.v1 while it builds the routes, after the gateway opened; the Ray
# backend's threads, started as it opens, may import it too (through Ray).  Two threads
# importing one module cycle at once end in a _DeadlockError, which once stopped a gateway
# at its start: it is imported here, on the main thread, before any other thread runs.
import pydantic.v1  # noqa: F401

from roomkeeper.api.app import create_app
from roomkeeper.gateway.service import Gateway
from roomkeeper.ipc import Channel


def run_gateway(port: int, socket_path: str | None) -> None:
    """Serve until stopped (SIGTERM, SIGINT, POST /v1/shutdown, or the supervisor's loss).

    Raises:
        UsageError: the configuration cannot be used (the message says why).
    """
    import uvicorn

    from roomkeeper.api.connections import (
        KEEP_ALIVE_S,
        MAX_CONNECTIONS,
        HeaderDeadlineProtocol,
        raise_file_limit,
    )

    channel = Channel.from_env()
    gateway = Gateway.open(channel=channel)
    app = create_app(gateway, port=None if socket_path else port, socket=socket_path)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        uds=socket_path,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # Open streams may hold the door for a third of the deadline, no more.
        timeout_graceful_shutdown=gateway.shutdown_path.deadline() / 3,  # type: ignore[arg-type]
        http=HeaderDeadlineProtocol,  # request headers within HEADER_TIMEOUT_S
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=MAX_CONNECTIONS,
    )
    raise_file_limit()
    server = _server_class()(config, gateway)
    gateway.shutdown_path.attach_server(server)
    where = socket_path or f"http://127.0.0.1:{port}"
    click.echo(
        f"roomkeeper gateway on {where} (Health page at /); journal in {gateway.home}", err=True
    )
    try:
        server.run()
    finally:
        # What start-up froze is collectable again: the collection at exit finalizes it
        # (the journal's last connections among it, which put their WAL away as they close).
        gc.unfreeze()
    if sys.exc_info()[0] is None and server.started is False:
        raise SystemExit(1)  # uvicorn could not start (it has said why)


YOUNG_OBJECTS_PER_COLLECTION = 10_000  # Python's default is 700


def settle_collector() -> None:
    """Keep the garbage collector's pauses short while the gateway serves.

    A full collection walks every tracked object, and after start-up that is
    mostly the libraries' own (FastAPI, pydantic, the journal's code): under a
    flood of API requests, full collections paused every thread of the gateway
    for 50 to 90 ms, two dozen times in 30 s, and /health answers waited for
    them.  Everything alive now lives as long as the process, so it is frozen
    out of the collector's walks; and the youngest generation is collected
    after 10,000 new objects instead of 700, so the older generations, which
    count its collections, are walked far less often.  Cyclic garbage lives a
    little longer; nothing else changes.
    """
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS_PER_COLLECTION, middle, old)


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, but SIGTERM and SIGINT begin the gateway's one shutdown path.

        uvicorn re-raises a captured signal after its graceful shutdown; for us
        the signal *is* the request to stop, and our one shutdown path has run,
        so the process ends normally with status 0 (a supervisor must not see a
        crash).
        """

        def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
            super().__init__(config)
            self.gateway = gateway

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.config.uds:  # uvicorn leaves it 0666: only our own user may connect
                os.chmod(self.config.uds, 0o600)
            settle_collector()

        def handle_exit(self, sig: int, frame: Any) -> None:
            # uvicorn's own handler first: it tells a first signal (exit gracefully)
            # from a second SIGINT (force the exit) by whether should_exit is set.
            super().handle_exit(sig, frame)
            self.gateway.shutdown_path.begin()  # stop admitting at once

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server

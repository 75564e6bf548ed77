"""The gateway's one shutdown path: SIGTERM, SIGINT, ``POST /v1/shutdown``, a lost supervisor.

:meth:`ShutdownPath.begin` stops admission at once and asks the server to
exit; the server's lifespan then runs :meth:`ShutdownPath.run`, the gateway's
stop steps (stop timers, save state, stop managed trees, close the journal),
within ROOMKEEPER_SHUTDOWN_S.  Every step is idempotent, and safe from any
thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

from roomkeeper.config import read_gateway_settings, read_watchdog_settings
from roomkeeper.gateway.home import remove_run_record

log = logging.getLogger("roomkeeper")


class Server(Protocol):
    """What the gateway asks of the HTTP server that serves it (uvicorn's ``Server``)."""

    should_exit: bool


class ShutdownPath:
    """Whether the gateway is closing, and how it stops.

    Args:
        env: the variables to read (the deadlines, on each use).
        home: ROOMKEEPER_HOME, whose run record the stop's last step removes.
        supervised: whether a supervisor runs the gateway (then its deadline bounds ours).
        tell: sends one message to the supervisor; False when there is none.
        steps: the gateway's stop steps, given the seconds they may take.
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str],
        home: Path,
        supervised: bool,
        tell: Callable[[str], bool],
        steps: Callable[[float], Coroutine[Any, Any, None]],
    ) -> None:
        self._env = env
        self._home = home
        self._supervised = supervised
        self._tell = tell
        self._steps = steps
        self._closing = False  # shutting down: nothing new is admitted
        self._server: Server | None = None  # asked to exit when the shutdown path begins
        self._lock = asyncio.Lock()
        self._shut = False
        self._task: asyncio.Task[None] | None = None  # when no server runs it

    @property
    def closing(self) -> bool:
        """Whether the shutdown path has begun: nothing new is admitted."""
        return self._closing

    def attach_server(self, server: Server) -> None:
        """The HTTP server that serves this gateway, asked to exit when shutdown begins."""
        self._server = server

    def deadline(self) -> float:
        """min(ROOMKEEPER_SHUTDOWN_S, 2/3 of ROOMKEEPER_WATCHDOG_SHUTDOWN), under a supervisor."""
        own = read_gateway_settings(self._env).shutdown_s
        if not self._supervised:
            return own
        return min(own, read_watchdog_settings(self._env).shutdown_s * 2 / 3)

    def begin(self) -> bool:
        """Begin the one shutdown path: stop admitting at once, ask the server to exit.

        Safe from any thread and more than once.  The server drains its
        connections, then its lifespan runs :meth:`run`, the stop steps.

        Returns:
            Whether a server was asked to exit; without one the caller runs :meth:`run`.
        """
        self._closing = True
        if self._server is None:
            return False
        self._server.should_exit = True  # read by the server's loop on its next tick
        return True

    def request_stop(self) -> None:
        """Stop the service, not a restart (``POST /v1/shutdown``; on the event loop).

        The path SIGTERM takes, through both layers: the supervisor is told, so that
        the exit that follows is never taken for a crash.
        """
        asked = self.begin()
        self._tell("stop")
        if not asked:
            self._task = asyncio.get_running_loop().create_task(self.run())

    def request_restart(self) -> bool:
        """Ask the supervisor for a fast restart, then shut down (``POST /v1/restart``).

        Returns:
            False when no supervisor runs this gateway; then nothing changes.
        """
        if not self._tell("restart"):
            return False
        self.begin()
        return True

    def supervisor_gone(self) -> None:
        """The supervisor's channel ended (listener thread): shut down."""
        if not self._closing:
            log.error("the supervisor is gone: shutting down")
            self.begin()
        # If the event loop is blocked, the orderly path never runs: after the deadline
        # the process ends itself, and its lifeline takes the managed trees down.
        timer = threading.Timer(self.deadline() + 1.0, os._exit, args=(1,))
        timer.daemon = True
        timer.start()

    async def run(self) -> None:
        """The stop steps, within the shutdown deadline; safe to call more than once."""
        async with self._lock:
            if self._shut:
                return
            self._shut = True
            self._closing = True  # 1. stop admission
            # uvicorn already spent up to a third of the deadline draining connections;
            # the stop steps get the other two thirds.
            deadline = self.deadline()
            steps_s = deadline * 2 / 3
            try:
                await asyncio.wait_for(self._steps(steps_s), timeout=steps_s)
            except TimeoutError:
                log.error(
                    "the stop steps took longer than their %.1f s (two thirds of the "
                    "shutdown deadline of %.1f s; uvicorn drains connections in the first third)",
                    steps_s,
                    deadline,
                )
            remove_run_record(self._home)
            log.info("roomkeeper gateway stopped")

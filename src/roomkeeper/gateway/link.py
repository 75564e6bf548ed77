"""The gateway's side of its supervisor: the channel (:mod:`roomkeeper.ipc`) and the holds.

It says hello, listens on a thread for ``relief`` and ``recovery_mode``, and
sends a heartbeat only after the gateway's own ``GET /health`` answered over
HTTP.  It keeps the holds the supervisor puts on launches (the recovery mode
latch, a relief hold) and lifts the latch on a repair, after which held work
goes out one job at a time.  The channel's loss is handed to the gateway,
which shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from roomkeeper.config import read_pressure_settings, read_watchdog_settings
from roomkeeper.gateway.context import GatewayContext
from roomkeeper.ipc import CAPABILITIES, PROTOCOL, RECOVERY_MODE_VARIABLE, Channel
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.relief.cooldown import CooldownCause

log = logging.getLogger("roomkeeper")

HEALTH_DEADLINE_S = 2.0  # a self-probe slower than this is no heartbeat
REPAIR_PROBES = 3  # consecutive healthy self-probes before a repair
REPAIR_PROBE_GAP_S = 0.5


class SupervisorLink:
    """What the gateway says to its supervisor, and what it does when asked.

    Args:
        channel: to the supervisor; None when the gateway runs alone.
        context: the variables to read, the journal a repair is recorded in (its
            writes watched), and whether the gateway is shutting down (heartbeats stop).
        boot_id: this gateway process's boot id, carried by hello and heartbeats.
        scheduler: whose newest running job relief stops, and whose launches are held;
            its guard is asked for headroom before a repair.
        gone: called on the listener thread when the channel ends.
    """

    def __init__(
        self,
        channel: Channel | None,
        context: GatewayContext,
        *,
        boot_id: str,
        scheduler: Scheduler,
        gone: Callable[[], None],
    ) -> None:
        env = context.env
        self.channel = channel
        self.boot_id = boot_id
        self._env = env
        self._scheduler = scheduler
        self._guard = scheduler.guard
        self._journal = context.journal
        self._closing = context.closing
        self._gone = gone
        self._watch = context.watch
        # The supervisor's latch: automatic work is held.  Known from the start, so
        # nothing slips out before the channel's first message.
        self.recovery_mode = channel is not None and env.get(RECOVERY_MODE_VARIABLE) == "1"
        self.releasing = False  # after a repair: one job at a time until the queue drains
        self._listen_port: int | None = None
        self._listen_socket: str | None = None

    def start(self, *, port: int | None, socket: str | None) -> list[asyncio.Task[None]]:
        """Remember where we listen; when supervised, say hello, listen and send heartbeats.

        Returns:
            The heartbeat task (none when the gateway runs alone), to cancel at shutdown.
        """
        self._listen_port, self._listen_socket = port, socket
        if self.channel is None:
            return []
        self.channel.send(
            "hello",
            protocol=PROTOCOL,
            capabilities=list(CAPABILITIES),
            boot_id=self.boot_id,
            pid=os.getpid(),
        )
        threading.Thread(target=self._listen, name="supervisor-channel", daemon=True).start()
        url, transport = self.health_probe()
        return [asyncio.create_task(self._heartbeat_loop(url, transport))]

    def relief(self) -> str | None:
        """Hold launches for a while and stop the newest managed tree, keeping its output.

        The hold is ROOMKEEPER_PRESSURE_COOLDOWN on the scheduler's one cooldown
        clock, the same the relief ladder's stops start: one clock, not two.
        """
        hold_s = read_pressure_settings(self._env).cooldown_s
        self._scheduler.cooldown.start(hold_s, CooldownCause.RELIEF)
        running = [v for v in self._scheduler.jobs() if v.state.live]
        if not running:
            return None
        newest = max(running, key=lambda v: v.started_at or 0)
        self._scheduler.cancel(newest.id)
        log.warning("relief requested: launches held for %.0f s, job %s stopped", hold_s, newest.id)
        return newest.id

    def relief_holds(self) -> bool:
        """Whether a relief request's cooldown holds launches now."""
        return self._scheduler.cooldown.holding(CooldownCause.RELIEF)

    def _listen(self) -> None:
        """The supervisor's messages (a thread); its loss means: shut down."""
        assert self.channel is not None
        for message in self.channel.messages():
            if message["type"] == "relief":
                self.relief()
            elif message["type"] == "recovery_mode":
                self.recovery_mode = bool(message.get("on"))
                log.warning(
                    "recovery mode %s",
                    "on: automatic work is held" if self.recovery_mode else "off",
                )
        self._gone()

    async def _heartbeat_loop(self, url: str, transport: Any) -> None:
        """Probe our own GET /health over HTTP; only a real, fast, own answer is a heartbeat."""
        import httpx

        interval = min(read_watchdog_settings(self._env).heartbeat_s / 3, 5.0)
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
            while not self._closing():
                try:
                    answer = await asyncio.wait_for(client.get(url), HEALTH_DEADLINE_S)
                    body = answer.json()
                    if (
                        answer.status_code == 200
                        and isinstance(body, dict)
                        and body.get("boot_id") == self.boot_id
                    ):
                        assert self.channel is not None
                        self.channel.send("heartbeat", boot_id=self.boot_id, at=time.time())
                except Exception as err:  # no heartbeat this time; the loop must go on
                    log.debug("health self-probe failed: %s", err)
                await asyncio.sleep(interval)

    def tell(self, kind: str, **fields: Any) -> bool:
        """Send one message to the supervisor; False when there is none."""
        return self.channel is not None and self.channel.send(kind, **fields)

    def health_probe(self) -> tuple[str, Any]:
        """Where our own GET /health is, as (url, httpx async transport)."""
        import httpx

        if self._listen_socket is not None:
            # The Host must be a loopback name: the gateway refuses any other (DNS rebinding),
            # its own probe included, and a probe refused is a heartbeat never sent.
            return "http://localhost/health", httpx.AsyncHTTPTransport(uds=self._listen_socket)
        return f"http://127.0.0.1:{self._listen_port}/health", httpx.AsyncHTTPTransport()

    def holds(self, limits: Limits) -> Limits:
        """``limits`` with the supervisor's holds on top, and the gentle release after a repair."""
        if self.recovery_mode or self.relief_holds():
            return replace(limits, hold=True)
        if self.releasing:  # after a repair, held work goes out one job at a time
            if not self._scheduler.statistics().waiting:
                self.releasing = False
            return replace(limits, max_running=1)
        return limits

    async def repair(self, probes: int = REPAIR_PROBES) -> dict[str, Any]:
        """Check stable responsiveness and headroom; then clear the latch and release work gently.

        Nothing is reset: no data, no token.  Held work goes out one job at a time.
        """
        import httpx

        url, transport = self.health_probe()
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as client:
            for n in range(probes):
                try:
                    answer = await client.get(url)
                    healthy = (
                        answer.status_code == 200 and answer.json().get("boot_id") == self.boot_id
                    )
                except (httpx.HTTPError, ValueError):
                    healthy = False
                if not healthy:
                    return {"repaired": False, "why": f"health probe {n + 1} of {probes} failed"}
                await asyncio.sleep(REPAIR_PROBE_GAP_S)
        decision = await asyncio.to_thread(self._guard.check)
        if not decision.admit:
            return {"repaired": False, "why": f"no headroom: {decision.summary}"}
        self.recovery_mode = False
        self.releasing = True
        self._scheduler.cooldown.clear()
        self.tell("repaired")
        self._watch(
            self._journal.record_history(HistoryEvent(time.time(), RecoveryCode.REPAIRED, {}))
        )
        return {"repaired": True, "why": f"{probes} healthy probes in a row and room for a job"}

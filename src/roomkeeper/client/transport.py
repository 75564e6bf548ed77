"""The blocking client's transport: one gateway's connections, each request sent again
where that is safe (:mod:`~roomkeeper.client.wire`), its answer or its typed error.

It knows the wire and nothing of the API's models, so what only sends and reads JSON
(``roomkeeper hook``, a process a tool starts for every tool call) loads httpx and the
basics, not pydantic, the API or the gateway.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from roomkeeper.client.discovery import ClientSettings, check_it_is_ours
from roomkeeper.client.wire import Call, error_of, next_wait_s, timeout_of, unavailable
from roomkeeper.errors import GatewayUnavailable, NoGatewayError


class Transport:
    """Requests to one gateway, with the settings' timeouts, retries and token.

    Constructing it does no I/O; the first request proves a gateway found through
    ``gateway.json`` is that gateway before the token goes out.

    Args:
        settings: where the gateway is, its token, timeouts, retries.
        transport: an httpx transport to use instead of the settings' own.
        sleep: how it waits between tries (real by default).
        rand: the jitter's random source in [0, 1).
    """

    def __init__(
        self,
        settings: ClientSettings,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        if transport is None and settings.socket:
            transport = httpx.HTTPTransport(uds=settings.socket)
        self.http = httpx.Client(
            base_url=settings.url, transport=transport, timeout=settings.timeout_s
        )
        self._sleep = sleep
        self._rand = rand
        self._checked = settings.checked_record is None
        self._check_lock = threading.Lock()
        if self._checked and settings.token:
            self.http.headers["Authorization"] = f"Bearer {settings.token}"

    def close(self) -> None:
        """Close the connections."""
        self.http.close()

    def send(self, call: Call) -> httpx.Response:
        """Send ``call``, again where that is safe; its answer, or its typed error.

        Raises:
            GatewayError: the gateway's refusal, typed (``NoRoom``, ``QueueFull``...).
            GatewayUnavailable: no answer, or the recorded gateway is not the one answering.
        """
        self.check_once()
        attempt = 0
        retries = self.settings.retries
        while True:
            try:
                answer = self.http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    params=call.params,
                    timeout=timeout_of(call, self.settings.timeout_s),
                )
            except httpx.HTTPError as err:
                wait = next_wait_s(call, attempt, retries, error=err, rand=self._rand)
                if wait is None:
                    raise unavailable(self.settings.url, err) from err
            else:
                if answer.status_code < 400:
                    return answer
                wait = next_wait_s(call, attempt, retries, response=answer, rand=self._rand)
                if wait is None:
                    raise error_of(answer)
            self._sleep(wait)
            attempt += 1

    def check_once(self) -> None:
        """Before the token first goes out: prove the gateway is the one recorded.

        Raises:
            GatewayUnavailable: the recorded gateway is gone, or another answers in its place.
        """
        if self._checked:
            return
        with self._check_lock:
            if not self._checked:
                assert self.settings.checked_record is not None
                try:
                    check_it_is_ours(self.http, Path(self.settings.checked_record))
                except NoGatewayError as err:
                    raise GatewayUnavailable(str(err)) from err
                if self.settings.token:
                    self.http.headers["Authorization"] = f"Bearer {self.settings.token}"
                self._checked = True

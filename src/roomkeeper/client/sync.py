"""The blocking client: :class:`Client`, and :class:`Lease`, a lease held with its own
heartbeat thread.

::

    with Client.from_env() as client:
        with client.lease(memory="600M", ttl=60) as lease:
            run_the_turn()             # released on exit, exceptions included
            if lease.relieved: ...     # the gateway asked for the memory back
        job = client.submit(["make", "test"], memory_bytes="2G")
        for chunk in client.output(job.id, follow=True): ...
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from roomkeeper.api.responses import HealthOut, JobCreated, JobOut, LeaseOut, StatusOut
from roomkeeper.client.agent_hooks import agent_hook
from roomkeeper.client.bodies import LeaseAsk, job_body
from roomkeeper.client.discovery import ClientSettings, settings_from_env
from roomkeeper.client.transport import Transport
from roomkeeper.client.wire import (
    NEXT_HEADER,
    POLL_S,
    WAIT_CHUNK_S,
    Call,
    error_of,
    unavailable,
)
from roomkeeper.errors import GatewayError, GatewayUnavailable, NoRoom

log = logging.getLogger("roomkeeper.client")
_M = TypeVar("_M", bound=BaseModel)


class Client:
    """A blocking client of one gateway, typed by the API's own models.

    Constructing it does no I/O; the first request proves a gateway found through
    ``gateway.json`` is that gateway before the token goes out.  Close it, or use it
    in a ``with`` block.

    Args:
        settings: where the gateway is, its token, timeouts, retries.
        transport: an httpx transport to use instead of the settings' own.
        sleep: how the client waits between tries (real by default).
        rand: the jitter's random source in [0, 1).
    """

    def __init__(
        self,
        settings: ClientSettings | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings or ClientSettings()
        self._wire = Transport(self.settings, transport=transport, sleep=sleep, rand=rand)
        self._sleep = sleep

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Client:
        """A client of the gateway the environment names (:mod:`~roomkeeper.client.discovery`)."""
        return cls(settings_from_env(os.environ if env is None else env))

    def close(self) -> None:
        """Close the connections."""
        self._wire.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the service

    def health(self) -> HealthOut:
        """``GET /health``: the gateway's boot id and uptime."""
        return self._model(HealthOut, Call("GET", "/health", idempotent=True))

    def status(self) -> StatusOut:
        """``GET /v1/status``: the guard, memory, queue, leases and their sessions."""
        return self._model(StatusOut, Call("GET", "/v1/status", idempotent=True))

    # ------------------------------------------------------------ leases

    def grant(self, ask: LeaseAsk, *, lease_id: str | None = None, wait_s: float = 0.0) -> LeaseOut:
        """Grant a lease now, or within ``wait_s`` (at most 600 s in one request).

        Raises:
            NoRoom: the guard refused it (its ``summary`` says why).
            QueueFull: a cap on granted leases is reached.
        """
        lease_id = lease_id or uuid.uuid4().hex[:16]
        call = Call(
            "POST", "/v1/leases", ask.body(lease_id, wait_s), idempotent=True, extra_s=wait_s
        )
        return self._model(LeaseOut, call)

    def heartbeat(self, lease_id: str, ttl_s: float | None = None) -> LeaseOut:
        """Extend a lease's ttl from now."""
        body = None if ttl_s is None else {"ttl_s": ttl_s}
        call = Call("POST", f"/v1/leases/{lease_id}/heartbeat", body, idempotent=True)
        return self._model(LeaseOut, call)

    def release(self, lease_id: str) -> LeaseOut | None:
        """Release a lease; None when it had already ended (a release sent twice, its ttl)."""
        try:
            return self._model(LeaseOut, Call("DELETE", f"/v1/leases/{lease_id}", idempotent=True))
        except GatewayError as err:
            if err.reason == "already_ended":
                return None
            raise

    def leases(self, *, limit: int = 500) -> Iterator[LeaseOut]:
        """Every lease of this run, newest first, every page followed."""
        for item in self._pages("/v1/leases", {"limit": limit}):
            yield LeaseOut.model_validate(item)

    @contextlib.contextmanager
    def lease(
        self,
        memory: int | str | None = None,
        *,
        ttl: float = 60.0,
        wait: float | None = None,
        lease_id: str | None = None,
        **terms: Any,
    ) -> Iterator[Lease]:
        """Hold a lease for a ``with`` block: wait for room (for ever when ``wait`` is None),
        heartbeat on a thread of its own, release on exit, exceptions included.

        Args:
            memory: bytes or a size such as ``600M``; the guard's estimate when None.
            ttl: seconds it lives without a heartbeat; beats go every third of it.
            wait: the longest wait for room in seconds; None waits until room comes.
            lease_id: the lease's id (a turn's own name, say); a fresh one when None.
            terms: ``owner``, ``release``, ``relieve``, ``session``, ``disk``, ``kind``
                (:class:`~roomkeeper.client.bodies.LeaseAsk`).

        Raises:
            NoRoom: no room came within ``wait``.
        """
        ask = LeaseAsk(memory=memory, ttl=ttl, **terms)
        held = Lease(self, self._grant_waiting(ask, wait, lease_id), ttl)
        held.start()
        try:
            yield held
        finally:
            held.stop()
            held.released = self.release(held.id)

    def _grant_waiting(
        self, ask: LeaseAsk, wait: float | None, lease_id: str | None = None
    ) -> LeaseOut:
        """Grant under one id, asking again while room may still come within ``wait``."""
        lease_id = lease_id or uuid.uuid4().hex[:16]
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            left = WAIT_CHUNK_S if deadline is None else deadline - time.monotonic()
            try:
                return self.grant(ask, lease_id=lease_id, wait_s=max(0.0, min(WAIT_CHUNK_S, left)))
            except NoRoom:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def agent_hook(self, tool: str, event: Mapping[str, Any], **settings: Any) -> dict[str, Any]:
        """Answer one hook event of ``tool`` (``claude-code`` or ``codex``) as the tool reads
        it: ``{}`` for no decision, else its decision (``POST /v1/agent-hooks/{tool}``).

        Args:
            settings: ``mode``, ``memory_mb``, ``wait_s``, ``ttl_s``, ``bash``: the route's query.
        """
        return agent_hook(self._wire, tool, event, **settings)

    # ------------------------------------------------------------ jobs

    def submit(self, argv: list[str], **options: Any) -> JobCreated:
        """Queue a job (``argv``, no shell); ``options`` are the API's job fields by name
        (``owner``, ``memory_bytes`` as bytes or ``"2G"``, ``cwd``, ``env``, ``kind``...).

        Raises:
            QueueFull: a queue bound is reached (nothing was queued).
        """
        return self._model(JobCreated, Call("POST", "/v1/jobs", job_body(argv, options)))

    def job(self, job_id: str) -> JobOut:
        """One job, of this run or an earlier one."""
        return self._model(JobOut, Call("GET", f"/v1/jobs/{job_id}", idempotent=True))

    def jobs(self, *, owner: str | None = None, state: str | None = None) -> Iterator[JobOut]:
        """Jobs, newest first, every page followed."""
        query = {k: v for k, v in {"owner": owner, "state": state}.items() if v is not None}
        for item in self._pages("/v1/jobs", query):
            yield JobOut.model_validate(item)

    def wait(self, job_id: str, timeout: float | None = None) -> JobOut:
        """The job once it has ended.

        Raises:
            TimeoutError: it had not ended within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.state.final:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id!r} is still {job.state.value} after {timeout} s")
            self._sleep(POLL_S)

    def output(self, job_id: str, *, follow: bool = False) -> Iterator[bytes]:
        """The job's output as it comes; with ``follow``, until the job ends."""
        params = {"follow": "true"} if follow else {}
        self._wire.check_once()
        try:
            with self._wire.http.stream(
                "GET", f"/v1/jobs/{job_id}/output", params=params, timeout=None
            ) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    raise error_of(answer)
                yield from answer.iter_bytes()
        except httpx.HTTPError as err:
            raise unavailable(self.settings.url, err) from err

    def cancel(self, job_id: str) -> JobOut:
        """Cancel a waiting job, or stop a running one's whole tree."""
        return self._model(JobOut, Call("POST", f"/v1/jobs/{job_id}/cancel", idempotent=True))

    # ------------------------------------------------------------ the wire

    def _model(self, model: type[_M], call: Call) -> _M:
        return model.model_validate(self._send(call).json())

    def _pages(self, path: str, query: Mapping[str, Any]) -> Iterator[Any]:
        params = dict(query)
        while True:
            answer = self._send(Call("GET", path, params=params, idempotent=True))
            yield from answer.json()
            cursor = answer.headers.get(NEXT_HEADER)
            if not cursor:
                return
            params = {**query, "cursor": cursor}

    def _send(self, call: Call) -> httpx.Response:
        return self._wire.send(call)


class Lease:
    """A granted lease kept alive by a heartbeat thread until :meth:`stop`.

    A beat goes every third of the ttl; a beat that fails is tried again with backoff
    until the ttl would pass, so one dropped answer never loses the lease.

    Attributes:
        id: the lease's id.
        info: the lease as the last grant or heartbeat answered it.
        lost: why the lease was lost (it ended, or no beat got through within its ttl);
            None while it holds.
        released: the lease as its release answered it (its state, how its release hook
            went), once the ``with`` block has ended; None before, or when it had ended.
    """

    def __init__(self, client: Client, granted: LeaseOut, ttl: float) -> None:
        self.id = granted.id
        self.info = granted
        self.lost: str | None = None
        self.released: LeaseOut | None = None
        self._client = client
        self._ttl = ttl
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.id}", daemon=True)

    @property
    def memory_bytes(self) -> int | None:
        """The memory the lease reserves."""
        return self.info.memory_bytes

    @property
    def relieved(self) -> bool:
        """Whether the gateway asked the holder to give the memory back (end the turn now)."""
        return self.info.relieve_outcome is not None

    def start(self) -> None:
        """Start the heartbeat thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (the lease is not released here)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        every = self._ttl / 3
        last_ok = time.monotonic()
        wait = every
        attempt = 0
        while not self._stopped.wait(wait):
            try:
                self.info = self._client.heartbeat(self.id)
            except GatewayError as err:
                if isinstance(err, GatewayUnavailable) and time.monotonic() - last_ok < self._ttl:
                    attempt += 1
                    wait = min(every, 0.2 * 2**attempt * random.random())
                    continue
                self.lost = f"the lease {self.id!r} was lost: {err}"
                log.warning("%s", self.lost)
                return
            last_ok = time.monotonic()
            wait, attempt = every, 0

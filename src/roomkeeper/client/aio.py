"""The asyncio client: :class:`AsyncClient`, and :class:`AsyncLease`, a lease held with its
own heartbeat task.  The same calls as :class:`~roomkeeper.client.sync.Client`, awaited.

::

    async with AsyncClient.from_env() as client:
        async with client.lease(memory="600M", ttl=60) as lease:
            await run_the_turn()       # released on exit, exceptions and cancels included
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from roomkeeper.api.responses import HealthOut, JobCreated, JobOut, LeaseOut, StatusOut
from roomkeeper.client.bodies import LeaseAsk, job_body
from roomkeeper.client.discovery import ClientSettings, check_it_is_ours, settings_from_env
from roomkeeper.client.wire import (
    NEXT_HEADER,
    POLL_S,
    WAIT_CHUNK_S,
    Call,
    error_of,
    next_wait_s,
    timeout_of,
    unavailable,
)
from roomkeeper.errors import GatewayError, GatewayUnavailable, NoGatewayError, NoRoom

log = logging.getLogger("roomkeeper.client")
_M = TypeVar("_M", bound=BaseModel)


class AsyncClient:
    """An asyncio client of one gateway, typed by the API's own models.

    Constructing it does no I/O; close it with ``await client.aclose()`` or use it in an
    ``async with`` block.

    Args:
        settings: where the gateway is, its token, timeouts, retries.
        transport: an httpx async transport to use instead of the settings' own.
        sleep: how the client waits between tries (real by default).
        rand: the jitter's random source in [0, 1).
    """

    def __init__(
        self,
        settings: ClientSettings | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings or ClientSettings()
        if transport is None and self.settings.socket:
            transport = httpx.AsyncHTTPTransport(uds=self.settings.socket)
        self._http = httpx.AsyncClient(
            base_url=self.settings.url, transport=transport, timeout=self.settings.timeout_s
        )
        self._sleep = sleep
        self._rand = rand
        self._checked = self.settings.checked_record is None
        if self._checked and self.settings.token:
            self._http.headers["Authorization"] = f"Bearer {self.settings.token}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AsyncClient:
        """A client of the gateway the environment names (:mod:`~roomkeeper.client.discovery`)."""
        return cls(settings_from_env(os.environ if env is None else env))

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def health(self) -> HealthOut:
        """``GET /health``: the gateway's boot id and uptime."""
        return await self._model(HealthOut, Call("GET", "/health", idempotent=True))

    async def status(self) -> StatusOut:
        """``GET /v1/status``: the guard, memory, queue, leases and their sessions."""
        return await self._model(StatusOut, Call("GET", "/v1/status", idempotent=True))

    # ------------------------------------------------------------ leases

    async def grant(
        self, ask: LeaseAsk, *, lease_id: str | None = None, wait_s: float = 0.0
    ) -> LeaseOut:
        """Grant a lease now, or within ``wait_s`` (at most 600 s in one request).

        Raises:
            NoRoom: the guard refused it.
            QueueFull: a cap on granted leases is reached.
        """
        lease_id = lease_id or uuid.uuid4().hex[:16]
        call = Call(
            "POST", "/v1/leases", ask.body(lease_id, wait_s), idempotent=True, extra_s=wait_s
        )
        return await self._model(LeaseOut, call)

    async def heartbeat(self, lease_id: str, ttl_s: float | None = None) -> LeaseOut:
        """Extend a lease's ttl from now."""
        body = None if ttl_s is None else {"ttl_s": ttl_s}
        call = Call("POST", f"/v1/leases/{lease_id}/heartbeat", body, idempotent=True)
        return await self._model(LeaseOut, call)

    async def release(self, lease_id: str) -> LeaseOut | None:
        """Release a lease; None when it had already ended."""
        try:
            call = Call("DELETE", f"/v1/leases/{lease_id}", idempotent=True)
            return await self._model(LeaseOut, call)
        except GatewayError as err:
            if err.reason == "already_ended":
                return None
            raise

    async def leases(self, *, limit: int = 500) -> AsyncIterator[LeaseOut]:
        """Every lease of this run, newest first, every page followed."""
        async for item in self._pages("/v1/leases", {"limit": limit}):
            yield LeaseOut.model_validate(item)

    @contextlib.asynccontextmanager
    async def lease(
        self,
        memory: int | str | None = None,
        *,
        ttl: float = 60.0,
        wait: float | None = None,
        lease_id: str | None = None,
        **terms: Any,
    ) -> AsyncIterator[AsyncLease]:
        """Hold a lease for an ``async with`` block: wait for room (for ever when ``wait`` is
        None), heartbeat on a task of its own, release on exit, exceptions included.

        Raises:
            NoRoom: no room came within ``wait``.
        """
        ask = LeaseAsk(memory=memory, ttl=ttl, **terms)
        held = AsyncLease(self, await self._grant_waiting(ask, wait, lease_id), ttl)
        held.start()
        try:
            yield held
        finally:
            await held.stop()
            # Released even when the block was cancelled: the release must not be.
            held.released = await asyncio.shield(self.release(held.id))

    async def _grant_waiting(
        self, ask: LeaseAsk, wait: float | None, lease_id: str | None = None
    ) -> LeaseOut:
        lease_id = lease_id or uuid.uuid4().hex[:16]
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            left = WAIT_CHUNK_S if deadline is None else deadline - time.monotonic()
            chunk = max(0.0, min(WAIT_CHUNK_S, left))
            try:
                return await self.grant(ask, lease_id=lease_id, wait_s=chunk)
            except NoRoom:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    # ------------------------------------------------------------ jobs

    async def submit(self, argv: list[str], **options: Any) -> JobCreated:
        """Queue a job; ``options`` are the API's job fields by name.

        Raises:
            QueueFull: a queue bound is reached (nothing was queued).
        """
        return await self._model(JobCreated, Call("POST", "/v1/jobs", job_body(argv, options)))

    async def job(self, job_id: str) -> JobOut:
        """One job, of this run or an earlier one."""
        return await self._model(JobOut, Call("GET", f"/v1/jobs/{job_id}", idempotent=True))

    async def jobs(
        self, *, owner: str | None = None, state: str | None = None
    ) -> AsyncIterator[JobOut]:
        """Jobs, newest first, every page followed."""
        query = {k: v for k, v in {"owner": owner, "state": state}.items() if v is not None}
        async for item in self._pages("/v1/jobs", query):
            yield JobOut.model_validate(item)

    async def wait(self, job_id: str, timeout: float | None = None) -> JobOut:
        """The job once it has ended.

        Raises:
            TimeoutError: it had not ended within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.job(job_id)
            if job.state.final:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id!r} is still {job.state.value} after {timeout} s")
            await self._sleep(POLL_S)

    async def output(self, job_id: str, *, follow: bool = False) -> AsyncIterator[bytes]:
        """The job's output as it comes; with ``follow``, until the job ends."""
        params = {"follow": "true"} if follow else {}
        await self._check_once()
        try:
            async with self._http.stream(
                "GET", f"/v1/jobs/{job_id}/output", params=params, timeout=None
            ) as answer:
                if answer.status_code >= 400:
                    await answer.aread()
                    raise error_of(answer)
                async for chunk in answer.aiter_bytes():
                    yield chunk
        except httpx.HTTPError as err:
            raise unavailable(self.settings.url, err) from err

    async def cancel(self, job_id: str) -> JobOut:
        """Cancel a waiting job, or stop a running one's whole tree."""
        call = Call("POST", f"/v1/jobs/{job_id}/cancel", idempotent=True)
        return await self._model(JobOut, call)

    # ------------------------------------------------------------ the wire

    async def _model(self, model: type[_M], call: Call) -> _M:
        return model.model_validate((await self._send(call)).json())

    async def _pages(self, path: str, query: Mapping[str, Any]) -> AsyncIterator[Any]:
        params = dict(query)
        while True:
            answer = await self._send(Call("GET", path, params=params, idempotent=True))
            for item in answer.json():
                yield item
            cursor = answer.headers.get(NEXT_HEADER)
            if not cursor:
                return
            params = {**query, "cursor": cursor}

    async def _send(self, call: Call) -> httpx.Response:
        """Send ``call``, again where that is safe; its answer, or its typed error."""
        await self._check_once()
        attempt = 0
        while True:
            try:
                answer = await self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    params=call.params,
                    timeout=timeout_of(call, self.settings.timeout_s),
                )
            except httpx.HTTPError as err:
                wait = next_wait_s(call, attempt, self.settings.retries, error=err, rand=self._rand)
                if wait is None:
                    raise unavailable(self.settings.url, err) from err
            else:
                if answer.status_code < 400:
                    return answer
                wait = next_wait_s(
                    call, attempt, self.settings.retries, response=answer, rand=self._rand
                )
                if wait is None:
                    raise error_of(answer)
            await self._sleep(wait)
            attempt += 1

    async def _check_once(self) -> None:
        """Before the token first goes out: prove the gateway is the one recorded."""
        if self._checked:
            return
        assert self.settings.checked_record is not None
        record = Path(self.settings.checked_record)
        transport = httpx.HTTPTransport(uds=self.settings.socket) if self.settings.socket else None
        with httpx.Client(base_url=self.settings.url, transport=transport) as probe:
            try:
                await asyncio.to_thread(check_it_is_ours, probe, record)
            except NoGatewayError as err:
                raise GatewayUnavailable(str(err)) from err
        if self.settings.token:
            self._http.headers["Authorization"] = f"Bearer {self.settings.token}"
        self._checked = True


class AsyncLease:
    """A granted lease kept alive by a heartbeat task until :meth:`stop`.

    Attributes:
        id: the lease's id.
        info: the lease as the last grant or heartbeat answered it.
        lost: why the lease was lost; None while it holds.
    """

    def __init__(self, client: AsyncClient, granted: LeaseOut, ttl: float) -> None:
        self.id = granted.id
        self.info = granted
        self.lost: str | None = None
        self.released: LeaseOut | None = None  # the release's answer, once the block ended
        self._client = client
        self._ttl = ttl
        self._task: asyncio.Task[None] | None = None

    @property
    def memory_bytes(self) -> int | None:
        """The memory the lease reserves."""
        return self.info.memory_bytes

    @property
    def relieved(self) -> bool:
        """Whether the gateway asked the holder to give the memory back (end the turn now)."""
        return self.info.relieve_outcome is not None

    def start(self) -> None:
        """Start the heartbeat task."""
        self._task = asyncio.create_task(self._beat(), name=f"lease-{self.id}")

    async def stop(self) -> None:
        """Stop beating (the lease is not released here)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _beat(self) -> None:
        every = self._ttl / 3
        last_ok = time.monotonic()
        wait = every
        attempt = 0
        while True:
            await asyncio.sleep(wait)
            try:
                self.info = await self._client.heartbeat(self.id)
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

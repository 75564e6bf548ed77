"""``GET /v1/jobs/{id}/output``: a job's kept output, streamed, never loaded whole.

A job may write hundreds of megabytes; reading its log into memory for one
request (and once more for each parallel one) would grow the gateway by as
much.  The file is streamed in :data:`CHUNK` pieces, ``?tail=BYTES`` starts
that many bytes before the end, and ``follow=true`` streams as the job
writes, with at most :data:`MAX_FOLLOWERS` such streams at once (a clear 429
beyond it, since each holds a connection open for the job's whole life).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, params
from fastapi.responses import StreamingResponse

from roomkeeper.api.models import Id
from roomkeeper.errors import QueueFullError
from roomkeeper.gateway.service import Gateway
from roomkeeper.jobs.spec import JobState

CHUNK = 256 * 1024  # bytes read and sent at a time
FOLLOW_EVERY_S = 0.2  # how often a followed job's output is read again
MAX_FOLLOWERS = 16  # follow=true streams at once
RUNNING_STATES = frozenset(
    {JobState.WAITING.value, JobState.RUNNING.value, JobState.SUSPENDED.value}
)
TEXT = {"schema": {"type": "string"}}


class Followers:
    """Counts the open ``follow=true`` streams and refuses one past the bound.

    A place is taken inside the response, once its stream runs, and given back when
    the stream ends, however it ends: a client gone before its answer started never
    ran the stream, so it never held a place (taken before the response, such a
    place was never given back, and 16 of them refused every follow for good).
    """

    def __init__(self, bound: int = MAX_FOLLOWERS) -> None:
        self.bound = bound
        self.open = 0

    def refuse_when_full(self) -> None:
        """Before the answer starts: refuse a follow with a 429 while every place is taken.

        Raises:
            QueueFullError: ``followers_full``: every place is taken.
        """
        if self.open >= self.bound:
            raise QueueFullError(
                f"{self.open} output streams are being followed, the most at once; "
                "read the output without follow=true, or try again when one ends",
                reason="followers_full",
            )

    @contextlib.contextmanager
    def place(self) -> Iterator[bool]:
        """Hold one place while a stream runs (the event loop's thread only); False when
        every place was taken meanwhile (the stream then says so and ends)."""
        if self.open >= self.bound:
            yield False
            return
        self.open += 1
        try:
            yield True
        finally:
            self.open -= 1


def output_routes(
    router: APIRouter,
    gateway: Gateway,
    auth: Sequence[params.Depends],
    find_job: Callable[[Gateway, str], dict[str, object]],
) -> None:
    """Register the output route; ``find_job`` answers 404 for an unknown job."""
    followers = Followers()

    # Documented as what it is, text/plain, while its errors stay JSON (a response_class
    # of text/plain would document them as text too).
    @router.get(
        "/v1/jobs/{job_id}/output",
        dependencies=auth,
        response_model=None,
        response_class=StreamingResponse,
        responses={200: {"description": "The output", "content": {"text/plain": TEXT}}},
    )
    async def job_output(
        job_id: Id,
        follow: bool = False,
        tail: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    ) -> StreamingResponse:
        """The job's kept output, streamed; ``tail=BYTES`` only its last bytes;
        ``follow=true`` goes on until the job ends."""
        await asyncio.to_thread(find_job, gateway, job_id)  # 404 for an unknown job
        row = await asyncio.to_thread(gateway.journal.job, job_id)
        path = Path(row.log_path if row else gateway.home / "logs" / f"{job_id}.log")
        start = await asyncio.to_thread(_start_offset, path, tail)
        if not follow:
            return StreamingResponse(_stream(path, start), media_type="text/plain")
        followers.refuse_when_full()  # a 429 while the answer can still say so

        async def followed() -> AsyncIterator[bytes]:
            with followers.place() as placed:
                if not placed:  # taken between the check and the stream's start
                    yield b"roomkeeper: too many output streams are followed; try again\n"
                    return
                async for chunk in _follow(gateway, job_id, path, start, find_job):
                    yield chunk

        return StreamingResponse(followed(), media_type="text/plain")


def _start_offset(path: Path, tail: int | None) -> int:
    """Where reading starts: the beginning, or ``tail`` bytes before the end."""
    if tail is None:
        return 0
    try:
        return max(0, os.stat(path).st_size - tail)
    except FileNotFoundError:
        return 0


async def _stream(path: Path, offset: int) -> AsyncIterator[bytes]:
    """The file from ``offset`` to its end as it is now, a chunk at a time."""
    while True:
        data = await asyncio.to_thread(read_chunk, path, offset)
        if not data:
            return
        offset += len(data)
        yield data


async def _follow(
    gateway: Gateway,
    job_id: str,
    path: Path,
    offset: int,
    find_job: Callable[[Gateway, str], dict[str, object]],
) -> AsyncIterator[bytes]:
    """The job's output as it grows, until the job ends or the gateway shuts down."""
    while True:
        async for data in _stream(path, offset):
            offset += len(data)
            yield data
        state = (await asyncio.to_thread(find_job, gateway, job_id))["state"]
        if state not in RUNNING_STATES or gateway.closing:
            async for data in _stream(path, offset):  # what it wrote as it ended
                yield data
            return
        await asyncio.sleep(FOLLOW_EVERY_S)


def read_chunk(path: Path, offset: int, size: int = CHUNK) -> bytes:
    """At most ``size`` bytes of ``path`` from ``offset``; nothing for a missing file."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(size)
    except FileNotFoundError:
        return b""

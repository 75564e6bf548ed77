"""What the sync and async clients share: requests as records, errors from answers, and
when to ask again and how long to wait first (the bodies they send are
:mod:`~roomkeeper.client.bodies`').  Plain httpx: no model of the API is loaded here.

A request is sent again only where that is safe:

- it never reached the gateway (no connection could be made);
- the gateway refused it before doing anything (429: a bound was reached, nothing was
  queued or granted), after its ``Retry-After``;
- or it is idempotent (a read, a heartbeat, a release, a cancel, a lease grant under its
  own id, which the gateway answers 200 with the lease already granted) and its answer
  was lost or was a 503.

A job submission whose answer was lost is never sent again: it may have been queued.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from roomkeeper.client.discovery import Retries
from roomkeeper.errors import (
    GatewayError,
    GatewayUnavailable,
    NoRoom,
    NotFound,
    QueueFull,
    Unauthorized,
)

NEXT_HEADER = "X-Next-Cursor"
WAIT_CHUNK_S = 60.0  # one grant request waits at most this long; a longer wait asks again
POLL_S = 0.5  # how often ``wait`` reads a job's state


@dataclass(frozen=True, slots=True)
class Call:
    """One request of a client.

    Attributes:
        method: the HTTP method.
        path: the path below the gateway's URL.
        body: the JSON body, or None.
        params: the query, or None.
        idempotent: whether sending it twice does what sending it once does.
        extra_s: added to the read timeout (a grant that waits for room).
    """

    method: str
    path: str
    body: Any = None
    params: Mapping[str, Any] | None = None
    idempotent: bool = False
    extra_s: float = 0.0


def timeout_of(call: Call, base_s: float) -> httpx.Timeout:
    """Explicit timeouts: ``base_s`` to connect, write and pool; read adds ``call.extra_s``."""
    return httpx.Timeout(base_s, read=base_s + call.extra_s)


def error_of(response: httpx.Response) -> GatewayError:
    """The typed error an answer of 400 or more stands for, with its reason and words."""
    try:
        body = response.json()
    except ValueError:
        body = None
    body = body if isinstance(body, dict) else {}
    status = response.status_code
    reason = str(body.get("reason") or "")
    detail = str(body.get("detail") or response.text[:500] or f"HTTP {status}")
    said = f"the gateway answered {status} {reason or response.reason_phrase}: {detail}"
    if status == 401:
        return Unauthorized(said, status=status, reason=reason)
    if status == 404:
        return NotFound(said, status=status, reason=reason)
    if status == 409 and "summary" in body:  # the guard's refusal carries its numbers
        return NoRoom(said, status=status, reason=reason, summary=str(body["summary"]))
    if status == 429:
        return QueueFull(said, status=status, reason=reason)
    if status == 503:
        return GatewayUnavailable(said, status=status, reason=reason)
    return GatewayError(said, status=status, reason=reason)


def unavailable(url: str, err: httpx.HTTPError) -> GatewayUnavailable:
    """The error for a request that got no answer."""
    return GatewayUnavailable(
        f"no answer from the roomkeeper gateway at {url}: {type(err).__name__}: {err}; "
        "is it running? (roomkeeper serve)"
    )


def retry_after_s(
    response: httpx.Response | None, now: Callable[[], float] = time.time
) -> float | None:
    """The ``Retry-After`` of an answer in seconds (a number or an HTTP date); None without."""
    text = response.headers.get("Retry-After") if response is not None else None
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


def next_wait_s(
    call: Call,
    attempt: int,
    retries: Retries,
    *,
    response: httpx.Response | None = None,
    error: httpx.HTTPError | None = None,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """How long to wait before sending ``call`` again after try ``attempt`` (0 the first);
    None when it must not be sent again (see the module docstring).

    The wait is the answer's ``Retry-After`` when it has one, plus a jitter of up to
    ``base_s``; else a full jitter of the doubled backoff, so that clients refused
    together do not come back together.
    """
    if attempt + 1 >= retries.attempts:
        return None
    if error is not None:
        never_sent = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
        if not (never_sent or call.idempotent):
            return None
    elif response is not None:
        status = response.status_code
        if not (status == 429 or (status == 503 and call.idempotent)):
            return None
    after = retry_after_s(response)
    if after is not None:
        if after > retries.max_retry_after_s:
            return None
        return float(after + rand() * retries.base_s)
    return float(rand() * min(retries.cap_s, retries.base_s * 2**attempt))

"""Whether the journal can save, as the gateway reports it, and how long a request waits.

A failed write is reported, never hidden: it stands as the gateway's
persistence error (new work is refused, the Health page says so) until a
later write succeeds.  A request that waits for a save waits at most
:data:`SAVE_DEADLINE_S`: a hung disk answers 503 ``not_saved_in_time``, never a
request held for ever (nor its place in the API's line), and a full disk 507
``not_saved``; the message says what became of the change and what to do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sqlite3
from typing import Any, TypeVar

from roomkeeper.errors import PersistenceError, SaveTimeoutError

log = logging.getLogger("roomkeeper")

_T = TypeVar("_T")

SAVE_DEADLINE_S = 10.0  # a request waits this long for its save, no longer
FREE_SPACE = (
    "if its disk is full, free space on the volume of ROOMKEEPER_HOME; "
    "GET /v1/needs-you says when the journal saves again"
)
"""The way out of a save refused or late, as the messages say it."""


class Persistence:
    """The journal's last failure to save, until a later write succeeds."""

    def __init__(self) -> None:
        self._error: str | None = None

    @property
    def error(self) -> str | None:
        """Why the journal could not save, while it cannot; else None."""
        return self._error

    def watch(self, write: concurrent.futures.Future[Any]) -> None:
        """Remember whether ``write`` saved: a failure is logged once and kept until a later
        write succeeds."""

        def done(future: concurrent.futures.Future[Any]) -> None:
            error = future.exception()
            if error is None:
                self._error = None
            else:
                if self._error is None:
                    log.error("the journal could not save: %s", error)
                self.note(error)

        write.add_done_callback(done)

    def note(self, error: BaseException | str) -> None:
        """The journal could not save: report it until a later write succeeds."""
        self._error = str(error)

    def clear(self) -> None:
        """What failed to save is saved now."""
        self._error = None


def saved(
    write: concurrent.futures.Future[_T], what: str, *, then: str, timeout_s: float | None = None
) -> _T:
    """What ``write`` returned, waited for on this thread within the save deadline.

    Args:
        write: the journal's write.
        what: what it saves, as the message names it (``"job 1a2b's cancel"``).
        then: what became of the change and what to do, the message's last words (none
            when empty: the caller says them).
        timeout_s: the deadline; :data:`SAVE_DEADLINE_S` when None.

    Raises:
        PersistenceError: the journal refused the write (a full disk, a damaged file).
        SaveTimeoutError: no answer within the deadline; the write is still queued.
    """
    deadline = SAVE_DEADLINE_S if timeout_s is None else timeout_s
    try:
        return write.result(timeout=deadline)
    except concurrent.futures.TimeoutError as err:
        raise _late(what, deadline, then) from err
    except (sqlite3.Error, OSError) as err:
        raise _refused(what, err, then) from err


async def awaited(
    write: concurrent.futures.Future[_T], what: str, *, then: str, timeout_s: float | None = None
) -> _T:
    """:func:`saved` on the event loop: the request waits, the loop does not.

    Raises:
        PersistenceError: the journal refused the write (a full disk, a damaged file).
        SaveTimeoutError: no answer within the deadline; the write is still queued.
    """
    deadline = SAVE_DEADLINE_S if timeout_s is None else timeout_s
    waiting = asyncio.wrap_future(write)
    # Given up on, its outcome is the watch's to report, not the loop's to complain of.
    waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
    done, _ = await asyncio.wait({waiting}, timeout=deadline)
    if not done:
        raise _late(what, deadline, then)
    try:
        return waiting.result()
    except (sqlite3.Error, OSError) as err:
        raise _refused(what, err, then) from err


def _late(what: str, deadline: float, then: str) -> SaveTimeoutError:
    said = (
        f"{what} is not saved: the journal did not answer within {deadline:g} s (a slow or "
        "hung disk under ROOMKEEPER_HOME)"
    )
    return SaveTimeoutError(f"{said}; {then}" if then else said)


def _refused(what: str, err: BaseException, then: str) -> PersistenceError:
    said = f"{what} is not saved: the journal could not write ({err})"
    return PersistenceError(f"{said}; {then}" if then else said)

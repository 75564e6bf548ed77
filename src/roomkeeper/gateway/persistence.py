"""Whether the journal can save, as the gateway reports it.

A failed write is reported, never hidden: it stands as the gateway's
persistence error (new work is refused, the Health page says so) until a
later write succeeds.
"""

from __future__ import annotations

import concurrent.futures
import logging

log = logging.getLogger("roomkeeper")


class Persistence:
    """The journal's last failure to save, until a later write succeeds."""

    def __init__(self) -> None:
        self._error: str | None = None

    @property
    def error(self) -> str | None:
        """Why the journal could not save, while it cannot; else None."""
        return self._error

    def watch(self, write: concurrent.futures.Future[None]) -> None:
        """Remember whether ``write`` saved: a failure is logged once and kept until a later
        write succeeds."""

        def done(future: concurrent.futures.Future[None]) -> None:
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

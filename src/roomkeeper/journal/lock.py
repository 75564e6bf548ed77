"""Who holds the journal open: an advisory lock on the journal file itself.

Every :class:`~roomkeeper.journal.database.Journal` holds a shared ``flock`` on
its file for as long as it is open, and ``roomkeeper journal recover`` takes
the exclusive one before it moves the file aside.  The lock is the kernel's,
so it holds where no record could be written (a full disk at start) and is
let go by the kernel when its holder dies, even by SIGKILL.  SQLite's own
locks are POSIX record locks, which ``flock`` neither sees nor disturbs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from roomkeeper.errors import RoomkeeperError


class JournalInUseError(RoomkeeperError):
    """Another process holds the journal open (a gateway), or is recovering it.

    Attributes:
        path: the journal file.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


def hold_shared(path: str | Path) -> int | None:
    """Take the shared lock a reader or writer of the journal holds while it is open.

    Returns the descriptor to pass to :func:`let_go`, or None where the file does
    not exist yet or cannot be opened (SQLite then says why, in its own words).

    Raises:
        JournalInUseError: the journal is being recovered right now.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalInUseError(
            f"the journal {path} is being recovered (`roomkeeper journal recover`); "
            "start again once it has finished",
            path=str(path),
        ) from None
    return fd


def let_go(fd: int | None) -> None:
    """Release a lock taken by :func:`hold_shared` (closing the descriptor releases it)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


@contextlib.contextmanager
def held_alone(path: str | Path) -> Iterator[None]:
    """Hold the journal exclusively for a recovery: no process may have it open.

    Raises:
        JournalInUseError: a process holds the journal open; the message says how to stop it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalInUseError(
                f"a process holds the journal {path} open (a roomkeeper gateway, or a command "
                "reading it); stop it first (`roomkeeper stop`), then recover",
                path=str(path),
            ) from None
        yield
    finally:
        os.close(fd)

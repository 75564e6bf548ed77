"""One job's token pool: a private FIFO, the descriptors its clients inherit, and our end.

The FIFO (mode 0600) lives in a directory of ours (mode 0700) under the
temporary directory, named for the job, the roomkeeper process that made it
and a random part: two runs of ``roomkeeper batch`` number their lines
alike, and a job resumed or run again after a crash keeps its id, so a name
of the job's alone would be taken.  A path that exists already is never
reused.  The process that made a FIFO holds an exclusive ``flock`` on its own
descriptor of it while the pool lives, and the kernel lets go when that
process ends, however it ends: a FIFO whose lock anyone can take was left by
a crash, and is removed as the next pool is made.  A pid says nothing there,
since a temporary directory shared between containers holds FIFOs of
processes in other pid namespaces.  The FIFO is made under a name ending in
``.new``, locked, and only then linked to its ``.fifo`` name (renamed where
the file system has no hard links), so a sweep never finds a live FIFO before
its lock; a ``.new`` is swept only once it is old and unlocked.

It is opened three times: our end (read and write, non-blocking, so no call
of ours ever waits on a client), and a read and a write descriptor that the
job inherits, blocking as make expects.  A FIFO opened both ways by
us never shows end of file to a client, however many of them come and go.

The bytes in the FIFO are the idle tokens; ``FIONREAD`` counts them without
taking any, so the tokens out (taken by clients, not yet written back) are
what we minted less what is there.  Nothing else is trusted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import stat
import struct
import tempfile
import termios
import time
from collections.abc import Callable
from pathlib import Path

from roomkeeper.errors import RoomkeeperError
from roomkeeper.jobserver.flags import Auth

log = logging.getLogger("roomkeeper")

TOKEN = b"+"  # the byte make 4.4 writes; clients write back whatever they read
_SAFE_ID = str.maketrans({c: "_" for c in "/\\\x00 "})


class JobserverError(RoomkeeperError):
    """A job's jobserver could not be made; the job does not start.

    Attributes:
        job_id: the job.
        reason: what was wrong, and the way out.
    """

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id!r} has no jobserver: {reason}")
        self.job_id = job_id
        self.reason = reason


def pools_dir(base: str | None = None) -> Path:
    """Where FIFOs go: ``roomkeeper-jobserver-<uid>`` in ``base`` (the temporary directory)."""
    return Path(base or tempfile.gettempdir()) / f"roomkeeper-jobserver-{os.getuid()}"


class TokenPool:
    """A job's FIFO and descriptors; nothing exists until :meth:`open`.

    Args:
        job_id: the job it serves; names the FIFO.
        directory: where the FIFO goes; :func:`pools_dir` when None.
        mkfifo: :func:`os.mkfifo`, replaceable to test a full file system.
    """

    def __init__(
        self,
        job_id: str,
        *,
        directory: Path | None = None,
        mkfifo: Callable[[str, int], None] = os.mkfifo,
    ) -> None:
        self.job_id = job_id
        self._directory = directory
        self._mkfifo = mkfifo
        self.path: Path | None = None
        self._ours: int | None = None
        self._client_fds: tuple[int, ...] = ()

    def open(self) -> Auth:
        """Make the FIFO and open it; where clients find it.

        Raises:
            JobserverError: the path exists already, the directory is not ours, or the
                file system refused (full, read-only); nothing is left behind.
        """
        try:
            directory = self._directory or pools_dir()
        except OSError as err:  # tempfile found no directory it could write a file in
            raise JobserverError(
                self.job_id,
                f"no usable temporary directory to make its FIFO in ({err}); set TMPDIR to a "
                "writable place with room",
            ) from err
        name = f"{self.job_id.translate(_SAFE_ID)}.{os.getpid()}.{secrets.token_hex(4)}"
        path, making = directory / f"{name}.fifo", directory / f"{name}.new"
        try:
            _private_dir(directory)
            _remove_leftovers(directory)
            self._mkfifo(str(making), 0o600)
        except FileExistsError:
            raise _taken(self.job_id, making) from None
        except OSError as err:
            raise JobserverError(self.job_id, _fs_fault(directory, err)) from err
        self.path = making
        try:
            # Ours first: a read-only open of a FIFO waits for a writer, and ours is one.
            self._ours = os.open(making, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            fcntl.flock(self._ours, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours alone: just made
            try:
                _publish(making, path)
            except FileExistsError:
                self.close()
                raise _taken(self.job_id, path) from None
            self.path = path
            read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.set_blocking(read_fd, True)  # one flag per open: ours stays non-blocking
            write_fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as err:
            self.close()
            raise JobserverError(self.job_id, f"cannot open its FIFO {path}: {err}") from err
        self._client_fds = (read_fd, write_fd)
        return Auth(str(path), read_fd, write_fd)

    @property
    def client_fds(self) -> tuple[int, ...]:
        """The descriptors the job inherits (empty before :meth:`open` and after :meth:`close`)."""
        return self._client_fds

    def release_client_fds(self) -> None:
        """Close our copies of the job's descriptors once it has inherited them: a client
        that holds a token and dies is then the only one who could have written it."""
        for fd in self._client_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._client_fds = ()

    def idle(self) -> int:
        """The tokens in the FIFO now (``FIONREAD``), taken by nobody."""
        if self._ours is None:
            return 0
        raw = fcntl.ioctl(self._ours, termios.FIONREAD, struct.pack("i", 0))
        count: int = struct.unpack("i", raw)[0]
        return count

    def mint(self, count: int = 1) -> int:
        """Put ``count`` tokens in the FIFO; how many went in (a full pipe takes fewer)."""
        if self._ours is None or count <= 0:
            return 0
        try:
            return os.write(self._ours, TOKEN * count)
        except BlockingIOError:
            return 0

    def take_back(self, count: int) -> int:
        """Take up to ``count`` idle tokens out; how many were there to take."""
        if self._ours is None or count <= 0:
            return 0
        try:
            return len(os.read(self._ours, count))
        except BlockingIOError:
            return 0

    def close(self) -> None:
        """Remove the FIFO and close every descriptor of ours; safe to call again.  Removed
        while our lock still holds it, so no other process's sweep takes it for a leftover."""
        self.release_client_fds()
        try:
            if self.path is not None:
                path, self.path = self.path, None
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
                except OSError as err:  # the lock goes with our descriptor: a sweep takes it
                    log.warning("cannot remove the jobserver FIFO %s: %s", path, err)
        finally:
            if self._ours is not None:
                with contextlib.suppress(OSError):
                    os.close(self._ours)
                self._ours = None


_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP, errno.EMLINK})


def _publish(making: Path, path: Path) -> None:
    """Give the locked FIFO at ``making`` its name ``path``; FileExistsError where a file is
    there already.  A hard link never replaces a file; where the file system has none, a
    rename after a look does (the name holds our pid and a random part: nothing else
    makes it)."""
    try:
        os.link(making, path)
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from err
        os.rename(making, path)
        return
    with contextlib.suppress(OSError):  # a .new left here is old and unlocked soon: swept
        os.unlink(making)


def _taken(job_id: str, path: Path) -> JobserverError:
    """A FIFO's path taken by something else, in words, with the way out."""
    return JobserverError(
        job_id,
        f"its FIFO {path} exists already (something else made a file of that name there): "
        "remove it, or set TMPDIR to another place",
    )


def _private_dir(directory: Path) -> None:
    """Make ``directory`` (0700) or check that an existing one is ours and private."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise OSError(
            errno.EPERM,
            f"{directory} is not a directory of ours that only we may open (mode 0700); "
            "remove it, or set TMPDIR to another place",
        )


NEW_LEFT_AFTER_S = 60.0  # a FIFO still named .new this long after it was made was left


def _remove_leftovers(directory: Path) -> None:
    """Remove the FIFOs in ``directory`` whose lock nobody holds: the process that made each
    ended (a crash leaves its pools behind).  Files of other shapes are left alone, and so is
    a FIFO still being made (``.new``) until it is :data:`NEW_LEFT_AFTER_S` old: its maker
    locks it an instant after making it, and must find nobody else holding the lock then."""
    for entry in os.scandir(directory):
        parts = entry.name.rsplit(".", 3)
        if len(parts) != 4 or parts[3] not in ("fifo", "new"):
            continue
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISFIFO(info.st_mode):
                continue
            if parts[3] == "new" and time.time() - info.st_mtime < NEW_LEFT_AFTER_S:
                continue
            if _unlocked(entry.path):
                os.unlink(entry.path)
                log.info("removed %s: a jobserver FIFO whose maker ended", entry.path)


def _unlocked(path: str) -> bool:
    """Whether no process holds the lock of the FIFO at ``path`` (an open for reading and
    writing at once never waits on a FIFO)."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _fs_fault(directory: Path, err: OSError) -> str:
    """A file system's refusal in words, with the way out."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"no space (or no inode) left in {directory.parent} to make its FIFO; "
            "free some there, or set TMPDIR to a file system with room"
        )
    if err.errno == errno.EROFS:
        return f"{directory.parent} is read-only; set TMPDIR to a writable place"
    return f"cannot make its FIFO in {directory}: {err.strerror or err}"

"""A remote job's output on its way to the gateway: in bounded pieces, as it is written.

On the node the job writes into a file of its own (0600, in a directory of
its runner's, 0700).  The runner (:func:`roomkeeper.cluster.node.run_job`)
reads that file from where it last stopped, at most :data:`CHUNK_BYTES` at a
time (:class:`LogTail`), and sends each piece as an :class:`Output` answer of
its streaming task as soon as it is there.  Ray holds at most
:data:`IN_FLIGHT_CHUNKS` answers the gateway has not taken yet (the task's
generator backpressure); past that the runner waits, and the job's output
waits on the node's disk, in nobody's memory.  On the gateway the job's
handle appends each piece to the job's log (:class:`LogAppender`, created
0600) as it arrives, so the output API shows it while the job runs.  Memory
is bounded on both sides: one piece being read or written, and the pieces in
flight.

A stop cancels the task, and from then on Ray drops the answers the gateway
has not taken and refuses new ones.  So a cancelled runner stops the tree and
leaves its directory behind, and the gateway fetches what it has not received
with a second, small task pinned to that node (:func:`collect_output`), from
the offset it reached: that task waits until the runner has let go of the
directory (the runner holds a lock on it while the tree may still write,
which the kernel lets go of when the runner dies), sends the rest in the
same pieces and removes the directory.  A directory nobody collects (the
gateway went away in between) is removed by a later runner on that node,
once nobody holds its lock and it has been left :data:`UNCOLLECTED_AFTER_S`
(:func:`sweep_uncollected`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

log = logging.getLogger("roomkeeper")

# Ray sends a task's answer of up to 100 KiB inline, in its reply, instead of through the
# object store: a piece this size never waits for room in a node's object store.
CHUNK_BYTES = 64 * 1024
IN_FLIGHT_CHUNKS = 16  # answers sent and not yet taken: 1 MiB a job on each side
UNCOLLECTED_AFTER_S = 3600.0  # a stopped job's directory nobody fetched is removed after this
LOCK_STEP_S = 0.1  # how often a collection tries the runner's lock again
DIRECTORY_PREFIX = "roomkeeper-node-"
LOG_NAME = "output.log"
LOCK_NAME = "runner.lock"


@dataclass(frozen=True, slots=True)
class Output:
    """A piece of the job's output, at most :data:`CHUNK_BYTES`, in the order it was written."""

    data: bytes


def make_directory(root: str | None = None) -> str:
    """A new private directory (0700) for one job's output on this node, under ``root``
    (the temporary directory when None)."""
    return tempfile.mkdtemp(prefix=DIRECTORY_PREFIX, dir=root)


def log_path(directory: str) -> str:
    """The file the job's output goes to in its directory."""
    return os.path.join(directory, LOG_NAME)


def hold(directory: str) -> int:
    """Take the directory's lock for its runner; held until :func:`let_go` (or its death).

    Returns:
        The lock's descriptor.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    fd = os.open(os.path.join(directory, LOCK_NAME), flags, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def let_go(fd: int, *, left: str | None = None) -> None:
    """Give the lock back; ``left``: the directory stays for a collection, so its age
    (for :func:`sweep_uncollected`) counts from now."""
    if left is not None:
        with contextlib.suppress(OSError):
            os.utime(os.path.join(left, LOCK_NAME))
    os.close(fd)


def _try_lock(path: str) -> int | None:
    """The lock of ``path`` taken now, as a descriptor; None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _wait_lock(
    directory: str,
    wait_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int | None:
    """The runner's lock, once its runner lets go or within ``wait_s``; None if not by then."""
    path = os.path.join(directory, LOCK_NAME)
    deadline = clock() + wait_s
    while True:
        try:
            fd = _try_lock(path)
        except FileNotFoundError:
            return None
        if fd is not None or clock() >= deadline:
            return fd
        sleep(LOCK_STEP_S)


class LogTail:
    """A growing file read from an offset, a piece at a time (the node's side).

    Args:
        path: the file; a missing one reads as empty until it appears.
        offset: where reading starts.
    """

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._file: BinaryIO | None = None

    def read(self) -> bytes:
        """The next at most :data:`CHUNK_BYTES` written since the last read; empty when none."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 (kept open)
            except FileNotFoundError:
                return b""
            self._file.seek(self.offset)
        data = self._file.read(CHUNK_BYTES) or b""
        self.offset += len(data)
        return data

    def rest(self) -> Iterator[Output]:
        """Every piece written since the last read, until the end of the file as it is now."""
        while data := self.read():
            yield Output(data)

    def close(self) -> None:
        """Close the file (reading again opens it anew, at the offset reached)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def collect_output(directory: str, offset: int, wait_s: float) -> Iterator[Output]:
    """The Ray task that fetches a stopped job's output from ``offset`` on, then removes it.

    It runs on the node that ran the job (the gateway pins it there) and waits
    up to ``wait_s`` for the job's runner to let go of the directory, which it
    does once the tree is stopped, so what the tree wrote while it was being
    stopped comes too.  Not let go by then, it sends what there is.

    Raises:
        ValueError: ``directory`` is not a job's output directory.
    """
    if not os.path.basename(directory).startswith(DIRECTORY_PREFIX):
        raise ValueError(f"{directory!r} is not a job's output directory ({DIRECTORY_PREFIX}*)")
    lock = _wait_lock(directory, wait_s)
    tail = LogTail(log_path(directory), offset)
    try:
        yield from tail.rest()
    finally:
        tail.close()
        if lock is not None:
            os.close(lock)
        shutil.rmtree(directory, ignore_errors=True)


def sweep_uncollected(
    root: str | None = None,
    *,
    older_than_s: float = UNCOLLECTED_AFTER_S,
    now: Callable[[], float] = time.time,
) -> list[str]:
    """Remove this user's job directories under ``root`` that nobody holds or fetched in time.

    A directory is left behind only by a stopped job whose gateway never
    collected it; one whose lock is held belongs to a running job or to a
    collection, and is kept whatever its age.

    Returns:
        The directories removed.
    """
    removed = []
    with os.scandir(root or tempfile.gettempdir()) as entries:
        for entry in entries:
            if not entry.name.startswith(DIRECTORY_PREFIX):
                continue
            with contextlib.suppress(OSError):
                if _stale(entry, older_than_s, now()):
                    removed.append(entry.path)
    return removed


def _stale(entry: os.DirEntry[str], older_than_s: float, now: float) -> bool:
    """Remove ``entry`` if it is ours, left long enough, and unheld; whether it was removed.

    Raises:
        OSError: it could not be read (gone meanwhile, not ours to read).
    """
    if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
        return False
    lock_path = os.path.join(entry.path, LOCK_NAME)
    times = [os.stat(lock_path).st_mtime]
    with contextlib.suppress(FileNotFoundError):
        times.append(os.stat(log_path(entry.path)).st_mtime)
    if now - max(times) < older_than_s:
        return False
    fd = _try_lock(lock_path)
    if fd is None:
        return False
    try:
        shutil.rmtree(entry.path)
    finally:
        os.close(fd)
    return True


class LogAppender:
    """A remote job's log on the gateway: each piece appended as it arrives.

    The file is created 0600 (a job's output is its owner's) when the job
    starts on its node, and appended to, never rewritten (a re-run adds to it).
    A write that fails loses that piece only (said once a job); :attr:`received`
    still counts it, so a collection after a stop fetches only what never arrived.

    Args:
        path: the job's log file here.
        job_id: the job, for the warning.
    """

    def __init__(self, path: str, job_id: str) -> None:
        self._path, self._job_id = path, job_id
        self._fd: int | None = None
        self._warned = False
        self.received = 0  # bytes of output that came from the node

    def open(self) -> None:
        """Create the file if it is not there (the job has begun, so it has a log)."""
        if self._fd is not None:
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        try:
            self._fd = os.open(self._path, flags, 0o600)
        except OSError as err:
            self._lost(err)

    def append(self, data: bytes) -> None:
        """Append a piece to the file."""
        self.received += len(data)
        self.open()
        if self._fd is None:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as err:
            self._lost(err)

    def _lost(self, err: OSError) -> None:
        if not self._warned:
            log.warning("job %s: its output from the node is not all kept: %s", self._job_id, err)
        self._warned = True

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

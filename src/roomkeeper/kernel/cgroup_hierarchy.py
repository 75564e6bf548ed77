"""This process's memory cgroup: where it is, and what each level of its path holds and allows.

The kernel's word only, no judgement: :func:`locate` finds the hierarchy the
process is charged in (v2 first, then v1) from ``/proc/self/cgroup`` and the
mount table, and :func:`walk` reads every level from the process's own group
up to the root of the mount, with its limit and what it holds that the
kernel cannot give back (``docs/DESIGN.md``'s "used").  Which level is tightest, and
what an unreadable file means, is :mod:`roomkeeper.kernel.resources`' to decide.

The roots (``/proc`` and ``/sys/fs/cgroup``) are parameters so tests can
point these functions at captured trees (``tests/kernel_fixtures``).  Unlike the
readers of :mod:`roomkeeper.kernel.resources`, everything here raises ``OSError``
or :class:`~roomkeeper.errors.KernelFileError` when a file cannot be read.
:func:`read_file`, the kernel-file reader every module uses, lives here
because this is the lowest module that reads kernel files; the process's own
files, read on every decision, are kept open (:func:`read_own_file`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from roomkeeper.kernel import parsers
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT

# memory.stat keys that count as "can be given back".  slab_reclaimable is
# only subtracted on v2; v1's memory.stat has no such key.
_V2_RECLAIMABLE = ("active_file", "inactive_file", "slab_reclaimable")
_V1_RECLAIMABLE = ("total_active_file", "total_inactive_file")
_V2_KEYS = frozenset(_V2_RECLAIMABLE)
_V1_KEYS = frozenset((*_V1_RECLAIMABLE, "hierarchical_memory_limit"))
_CHUNK = 65536


@dataclass(frozen=True, slots=True)
class Level:
    """One level of the path: its limit, and what it holds where that matters."""

    path: str  # the cgroup path, as a person would look it up
    limit: int | None
    used: int | None  # None where the level has no limit and is not our own


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """The memory hierarchy the process is charged in, and its own group there."""

    version: int  # 1 or 2
    own_dir: str  # the process's own group, as a directory under the (injected) root
    own_path: str  # the same group as a cgroup path inside the mount
    mount_dir: str


def read_file(path: str) -> bytes:
    """A kernel file's bytes (the one reader every module uses)."""
    return _read(path)


def _read(path: str) -> bytes:
    # os.open/os.read: the guard reads about six kernel files per decision,
    # and the buffered io layer costs more than the syscalls on small files.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _CHUNK)
        if len(data) < _CHUNK:  # a short read of a kernel file is its end
            return data
        chunks = [data]
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _KeptFiles:
    """The guard's own kernel files, kept open and read again with ``pread`` at offset 0.

    A decision reads the same few files every time (our membership, our levels'
    usage, ``memory.stat`` and limits, ``/proc/meminfo``); opening and closing
    each costs as much as reading it.  Kernel files give a fresh value on every
    read from offset 0.  Only the process's own files are kept (never a job's
    group, whose removal an open file would hold up), at most :data:`KEPT_FILES`;
    a file that fails is closed and opened once more, so a removed group reads
    as missing.  The read happens under the lock (microseconds), so no other
    thread closes a descriptor while it is read.  A forked child closes its
    copies and opens its own (``/proc/self`` names the opener).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a lock held at the fork would never be released
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}

    def read(self, path: str) -> bytes:
        if not path.startswith(_KEPT_ROOTS):  # a test's injected tree may be replaced whole
            return _read(path)
        with self._lock:
            fd = self._fds.get(path)
            if fd is not None:
                try:
                    data = os.pread(fd, _CHUNK, 0)
                except OSError:
                    data = None  # gone or stale: opened again below, or its error raised
                    del self._fds[path]
                    with contextlib.suppress(OSError):
                        os.close(fd)
                if data is not None:
                    return data if len(data) < _CHUNK else _read(path)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            if len(self._fds) >= KEPT_FILES:
                os.close(self._fds.pop(next(iter(self._fds))))
            self._fds[path] = fd
            data = os.pread(fd, _CHUNK, 0)
        return data if len(data) < _CHUNK else _read(path)

    def kept(self) -> list[str]:
        """The paths kept open now, oldest first."""
        with self._lock:
            return list(self._fds)


KEPT_FILES = 32
_KEPT_ROOTS = (PROC_ROOT + "/", CGROUP_ROOT + "/")
_kept = _KeptFiles()


def read_own_file(path: str) -> bytes:
    """One of this process's own kernel files (membership, its levels, ``/proc/meminfo``),
    kept open between readings; never a job's group."""
    return _kept.read(path)


class _MountTable:
    """The cgroup mounts of ``/proc/self/mountinfo``, parsed again whenever the kernel says so.

    Not a cache of a reading: proc(5) lets a process poll its mountinfo for
    POLLPRI, which the kernel raises on every change of the mount table, so
    the parsed table is never stale.  Parsing the file is the single most
    expensive step of a decision (about 30 us of the guard's budget), and it
    almost never changes.  Used only for the real ``/proc``; an injected root
    is a plain file, which cannot signal, and is read on every call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1
        self._poll = select.poll()
        self._mounts: list[parsers.Mount] = []

    def mounts(self) -> list[parsers.Mount]:
        with self._lock:
            if self._pid != os.getpid():  # a forked child must not share our file position
                self._open()
            elif self._poll.poll(0):  # the kernel says the mount table changed
                os.lseek(self._fd, 0, os.SEEK_SET)
                self._mounts = self._parse()
            return self._mounts

    def _open(self) -> None:
        fd = os.open(f"{PROC_ROOT}/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(fd, select.POLLPRI | select.POLLERR)
        self._fd, self._pid = fd, os.getpid()
        self._mounts = self._parse()
        self._poll.poll(0)  # consume the event that opening may report

    def _parse(self) -> list[parsers.Mount]:
        chunks = []
        while chunk := os.read(self._fd, 65536):
            chunks.append(chunk)
        return parsers.parse_mountinfo(b"".join(chunks))


_mount_table = _MountTable()


def _rebase(mount_point: str, cgroup_root: str) -> str:
    """Map a mount point from mountinfo onto the (possibly injected) cgroup root."""
    if mount_point == CGROUP_ROOT or mount_point.startswith(CGROUP_ROOT + "/"):
        return cgroup_root + mount_point[len(CGROUP_ROOT) :]
    return mount_point


def _relative(cgroup_path: str, mount: parsers.Mount) -> str:
    """The process's cgroup path as seen inside this mount."""
    root = mount.root.rstrip("/")
    if root and (cgroup_path == root or cgroup_path.startswith(root + "/")):
        return cgroup_path[len(root) :] or "/"
    return cgroup_path


def _join(base: str, rel: str) -> str:
    rel = rel.strip("/")
    return f"{base}/{rel}" if rel else base


def _membership(proc_root: str) -> tuple[str | None, str | None, list[parsers.Mount]]:
    """The process's v2 path, its v1 memory path, and the cgroup mounts it sees."""
    v2_path, v1_path = _membership_paths(_kept.read(f"{proc_root}/self/cgroup"))
    return v2_path, v1_path, _mounts(proc_root)


def _mounts(proc_root: str) -> list[parsers.Mount]:
    """The cgroup mounts the process sees (the real table watched for changes)."""
    if proc_root == PROC_ROOT:
        return _mount_table.mounts()
    return parsers.parse_mountinfo(_read(f"{proc_root}/self/mountinfo"))


@functools.lru_cache(maxsize=8)
def _membership_paths(raw: bytes) -> tuple[str | None, str | None]:
    """The parsed ``/proc/self/cgroup``: the same bytes, the same answer (it seldom changes)."""
    return parsers.parse_proc_self_cgroup(raw)


def _v2_groups(
    v2_path: str | None, mounts: list[parsers.Mount], cgroup_root: str
) -> list[Hierarchy]:
    """The process's v2 group in each cgroup2 mount that may show it."""
    if v2_path is None:
        return []
    found = []
    for mount in mounts:
        if mount.fs_type == "cgroup2":
            rel = _relative(v2_path, mount)
            base = _rebase(mount.mount_point, cgroup_root)
            found.append(Hierarchy(2, _join(base, rel), rel, base))
    return found


def locate(proc_root: str, cgroup_root: str) -> Hierarchy | None:
    """Find the memory hierarchy the process is charged in: v2 first, then v1.

    Returns None when no cgroup memory controller can be found at all.
    Raises OSError or KernelFileError when the files cannot be read.
    """
    v2_path, v1_path, mounts = _membership(proc_root)
    missing_v2 = ""
    for group in _v2_groups(v2_path, mounts, cgroup_root):
        # A v2 group charges memory only where the controller is enabled,
        # which shows as memory.current (absent on this development
        # machine, whose memory controller is bound to v1, and in the root
        # group, which the kernel does not account).
        if _charges_memory(group.own_dir, cgroup_root == CGROUP_ROOT):
            return group
        missing_v2 = group.own_dir
    v1 = _v1_group("memory", v1_path, mounts, cgroup_root)
    if v1 is not None:
        return v1
    if missing_v2 and not os.path.isdir(missing_v2):
        # Our own v2 group must be readable: it vanished, or this mount does
        # not show it.  Guessing from meminfo would be wrong.
        raise FileNotFoundError(errno.ENOENT, "the process's own cgroup is gone", missing_v2)
    return None


CHARGE_RECHECK_S = 1.0  # whether a v2 group charges memory is looked at again after this long
_charges: dict[str, tuple[bool, float]] = {}


def _charges_memory(own_dir: str, real: bool) -> bool:
    """Whether a v2 group charges memory (has ``memory.current``).  On the real roots the
    answer is kept for :data:`CHARGE_RECHECK_S`: it changes only when a parent's
    ``subtree_control`` does, and every decision asks (on a cgroup v1 machine, about a file
    that is never there)."""
    path = f"{own_dir}/memory.current"
    if not real:
        return os.path.exists(path)
    now = time.monotonic()
    kept = _charges.get(path)
    if kept is not None and now - kept[1] < CHARGE_RECHECK_S:
        return kept[0]
    answer = os.path.exists(path)
    if len(_charges) > 64:  # a process moved between many groups: keep the map small
        _charges.clear()
    _charges[path] = (answer, now)
    return answer


def locate_v2(proc_root: str, cgroup_root: str) -> Hierarchy | None:
    """This process's own cgroup v2 group, whatever it charges; None where no mount shows it.

    Unlike :func:`locate`, the group is returned without ``memory.current``:
    the root group has none, yet its children can have the memory
    controller.  Whether they can is in the group's ``cgroup.controllers``
    (:func:`controllers`).

    Raises:
        OSError, KernelFileError: the membership files could not be read.
    """
    v2_path, _, mounts = _membership(proc_root)
    for group in _v2_groups(v2_path, mounts, cgroup_root):
        if os.path.isdir(group.own_dir):
            return group
    return None


def _v1_group(
    controller: str, path: str | None, mounts: list[parsers.Mount], cgroup_root: str
) -> Hierarchy | None:
    """The process's group in the v1 hierarchy of ``controller``, None where none is mounted."""
    if path is None:
        return None
    for mount in mounts:
        if mount.fs_type == "cgroup" and controller in mount.super_options:
            rel = _relative(path, mount)
            base = _rebase(mount.mount_point, cgroup_root)
            return Hierarchy(1, _join(base, rel), rel, base)
    return None


def v1_memory_group(proc_root: str, cgroup_root: str) -> Hierarchy | None:
    """This process's own group in the v1 memory hierarchy; None where none is mounted.

    Raises:
        OSError, KernelFileError: the membership files could not be read.
    """
    _, v1_path, mounts = _membership(proc_root)
    return _v1_group("memory", v1_path, mounts, cgroup_root)


def v1_controller_group(controller: str, proc_root: str, cgroup_root: str) -> Hierarchy | None:
    """This process's own group in the v1 hierarchy of ``controller`` (``freezer``), if mounted.

    Raises:
        OSError, KernelFileError: the membership files could not be read.
    """
    # Read once per job (its freezer group): the kept file, parsed again only when it changes.
    path = _v1_controller_path(_kept.read(f"{proc_root}/self/cgroup"), controller)
    return _v1_group(controller, path, _mounts(proc_root), cgroup_root)


@functools.lru_cache(maxsize=8)
def _v1_controller_path(raw: bytes, controller: str) -> str | None:
    """The path of ``controller`` in a ``/proc/self/cgroup``: the same bytes, the same answer."""
    return parsers.parse_v1_controller_path(raw, controller)


def controllers(directory: str) -> frozenset[str]:
    """The controllers a v2 group may use (its ``cgroup.controllers``).

    Raises:
        OSError: the file could not be read.
    """
    return frozenset(_read(f"{directory}/cgroup.controllers").decode("ascii", "replace").split())


def _level_used(
    directory: str, version: int, read: Callable[[str], bytes] = _read
) -> tuple[int, dict[str, int]]:
    """Memory the level holds that the kernel cannot give back, and the stat keys read."""
    if version == 2:
        usage = parsers.parse_single_value(read(f"{directory}/memory.current"), "memory.current")
        stat = parsers.parse_flat_keyed(read(f"{directory}/memory.stat"), "memory.stat", _V2_KEYS)
        active, inactive = parsers.stat_fields(stat, _V2_RECLAIMABLE[:2], "memory.stat")
        # slab_reclaimable is in v2's memory.stat since Linux 4.14; a file
        # without it has nothing more to subtract.
        reclaimable = active + inactive + stat.get("slab_reclaimable", 0)
    else:
        usage = parsers.parse_single_value(
            read(f"{directory}/memory.usage_in_bytes"), "memory.usage_in_bytes"
        )
        stat = parsers.parse_flat_keyed(read(f"{directory}/memory.stat"), "memory.stat", _V1_KEYS)
        reclaimable = sum(parsers.stat_fields(stat, _V1_RECLAIMABLE, "memory.stat"))
    # v1's usage is batched per CPU and can lag the stat counters a little:
    # never report less than nothing.
    return max(0, usage - reclaimable), stat


def own_memory_level(
    proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> tuple[int, str] | None:
    """The level of the memory hierarchy this process is charged at, None without one.

    Returns:
        (cgroup version, directory of our own group): the first of the
        levels :func:`walk` reads, without reading them.

    Raises:
        OSError, KernelFileError: the membership files could not be read, or
            our own v2 group is gone.
    """
    hierarchy = locate(proc_root, cgroup_root)
    return None if hierarchy is None else (hierarchy.version, hierarchy.own_dir)


def group_used_bytes(directory: str, version: int) -> int:
    """What a cgroup holds that the kernel cannot give back (``docs/DESIGN.md``'s "used").

    Raises:
        OSError, KernelFileError: the group's files could not be read.
    """
    return _level_used(directory, version)[0]


def _level_limit(directory: str, version: int) -> int | None:
    """The level's limit, None for no limit or for a level that has no limit file."""
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    try:
        raw = _kept.read(f"{directory}/{name}")
    except FileNotFoundError:
        return None  # the root of a v2 mount has no memory.max
    return parsers.parse_v2_limit(raw, name) if version == 2 else parsers.parse_v1_limit(raw, name)


def walk(hierarchy: Hierarchy) -> list[Level]:
    """Every level from the process's own group up to the root of the mount, own first."""
    version = hierarchy.version
    own_used, stat = _level_used(hierarchy.own_dir, version, _kept.read)
    hierarchical = stat.get("hierarchical_memory_limit")
    if version == 1 and hierarchical is not None and hierarchical >= parsers.V1_UNLIMITED_THRESHOLD:
        # v1 reports the tightest limit of the whole path in the group's own
        # memory.stat: when that is "unlimited", no level has a limit and
        # there is nothing to walk.
        return [Level(hierarchy.own_path, None, own_used)]
    levels = [Level(hierarchy.own_path, _level_limit(hierarchy.own_dir, version), own_used)]
    rel, directory = hierarchy.own_path.rstrip("/"), hierarchy.own_dir
    while directory != hierarchy.mount_dir and rel:
        rel, directory = rel.rsplit("/", 1)[0], directory.rsplit("/", 1)[0]
        try:
            limit = _level_limit(directory, version)
        except (PermissionError, NotADirectoryError):
            continue  # lies outside what this mount lets us read
        used = _level_used(directory, version)[0] if limit is not None else None
        levels.append(Level(rel or "/", limit, used))
    return levels


def remove_group(directory: str, attempts: int = 100) -> bool:
    """rmdir a cgroup, retrying while its last tasks drain; True once it is gone.

    The kernel refuses (EBUSY) while an exiting task still counts as a member.
    Between attempts, never after the last: one attempt is a question, answered at once.
    """
    for attempt in range(attempts):
        try:
            os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if attempt < attempts - 1:
                time.sleep(0.01)
    return False

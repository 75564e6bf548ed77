"""Fresh resource readings: memory, pressure (PSI) and disk, nothing cached.

Every call reads the kernel's files afresh, so the line moves with the
container and no restart is needed (seed 000).  Memory comes from cgroup v2,
then cgroup v1, then ``/proc/meminfo``; what "used" means is in DESIGN.md:
what the container holds that the kernel cannot give back (the file cache
and, on v2, reclaimable slab are left out).

The roots (``/proc`` and ``/sys/fs/cgroup``) are parameters so tests can
point the readers at captured trees (``shared/fixtures``).  This module is
the one boundary where ``OSError`` and
:class:`~roomkeeper.errors.KernelFileError` become a reading marked
*unknown* with a reason: no reader raises.
"""

from __future__ import annotations

import enum
import errno
import os
import select
import sys
import threading
import time
from dataclasses import dataclass

import psutil

from roomkeeper import parsers
from roomkeeper.config import Settings, read_settings, warn_once
from roomkeeper.errors import KernelFileError
from roomkeeper.paths import workspace_dir
from roomkeeper.units import format_gb

PROC_ROOT = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"

# memory.stat keys that count as "can be given back".  slab_reclaimable is
# only subtracted on v2 (DESIGN.md); v1's memory.stat has no such key.
_V2_RECLAIMABLE = ("active_file", "inactive_file", "slab_reclaimable")
_V1_RECLAIMABLE = ("total_active_file", "total_inactive_file")
_V2_KEYS = frozenset(_V2_RECLAIMABLE)
_V1_KEYS = frozenset((*_V1_RECLAIMABLE, "hierarchical_memory_limit"))
_MEMINFO_KEYS = frozenset(("MemTotal", "MemAvailable"))
_CHUNK = 65536


class MemorySource(enum.Enum):
    """Where the memory reading came from."""

    CGROUP_V2 = "cgroup v2"
    CGROUP_V1 = "cgroup v1"
    MEMINFO = "meminfo"
    PORTABLE = "portable"
    UNKNOWN = "unknown"


class LimitOrigin(enum.Enum):
    """Who drew the memory line."""

    CGROUP = "cgroup"
    STATED = "stated"  # ROOMKEEPER_MEMORY_LIMIT_MB
    MACHINE = "machine"  # no container: the machine's MemTotal
    NONE = "none"  # unknown reading


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """Memory in use against the effective limit.

    Attributes:
        source: the files the numbers came from.
        used_bytes: memory the kernel cannot give back; None when unknown.
        limit_bytes: the effective limit, after any stated override; None when unknown.
        limit_origin: who drew the line (cgroup, stated, machine).
        group: the cgroup path of the level reported (the tightest), if any.
        unknown_reason: a sentence saying why the reading is unknown, else None.
    """

    source: MemorySource
    used_bytes: int | None
    limit_bytes: int | None
    limit_origin: LimitOrigin
    group: str | None = None
    unknown_reason: str | None = None

    @property
    def known(self) -> bool:
        """Whether both numbers could be read."""
        return self.unknown_reason is None

    @classmethod
    def unknown(cls, reason: str) -> MemoryReading:
        """A reading that could not be taken, and why."""
        return cls(MemorySource.UNKNOWN, None, None, LimitOrigin.NONE, None, reason)

    def describe(self) -> str:
        """What is read, in words, without numbers that change every call."""
        if not self.known:
            return f"memory unknown ({self.unknown_reason})"
        assert self.limit_bytes is not None
        return (
            f"memory from {self.source.value}, limit {format_gb(self.limit_bytes)} "
            f"from {self.limit_origin.value}"
        )


@dataclass(frozen=True, slots=True)
class DiskReading:
    """Free and total space of the workspace volume.

    Attributes:
        path: the directory that was measured (the nearest existing parent of the workspace).
        free_bytes: space an unprivileged user may still write; None when unknown.
        total_bytes: the volume's size; None when unknown.
        unknown_reason: why the reading is unknown, else None.
    """

    path: str
    free_bytes: int | None
    total_bytes: int | None
    unknown_reason: str | None = None

    @property
    def known(self) -> bool:
        """Whether both numbers could be read."""
        return self.unknown_reason is None


@dataclass(frozen=True, slots=True)
class Resources:
    """One full reading.

    ``memory_pressure`` and ``cpu_pressure`` are None where PSI is not
    available: absent is not zero.  ``load_per_core`` is the one-minute load
    average divided by the usable cores, the portable fallback for CPU pressure.
    """

    memory: MemoryReading
    disk: DiskReading
    memory_pressure: parsers.Pressure | None
    cpu_pressure: parsers.Pressure | None
    pressure_source: str
    load_per_core: float | None
    platform: str
    taken_at: float


@dataclass(frozen=True, slots=True)
class _Level:
    path: str  # the cgroup path, as a person would look it up
    limit: int | None
    used: int | None  # None where the level has no limit and is not our own


@dataclass(frozen=True, slots=True)
class _Hierarchy:
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


def _locate(proc_root: str, cgroup_root: str) -> _Hierarchy | None:
    """Find the memory hierarchy the process is charged in: v2 first, then v1.

    Returns None when no cgroup memory controller can be found at all.
    Raises OSError or KernelFileError when the files cannot be read.
    """
    v2_path, v1_path = parsers.parse_proc_self_cgroup(_read(f"{proc_root}/self/cgroup"))
    if proc_root == PROC_ROOT:
        mounts = _mount_table.mounts()
    else:
        mounts = parsers.parse_mountinfo(_read(f"{proc_root}/self/mountinfo"))
    missing_v2 = ""
    if v2_path is not None:
        for mount in mounts:
            if mount.fs_type != "cgroup2":
                continue
            rel = _relative(v2_path, mount)
            base = _rebase(mount.mount_point, cgroup_root)
            own = _join(base, rel)
            # A v2 group charges memory only where the controller is enabled,
            # which shows as memory.current (absent on this development
            # machine, whose memory controller is bound to v1).
            if os.path.exists(f"{own}/memory.current"):
                return _Hierarchy(2, own, rel, base)
            missing_v2 = own
    if v1_path is not None:
        for mount in mounts:
            if mount.fs_type == "cgroup" and "memory" in mount.super_options:
                rel = _relative(v1_path, mount)
                base = _rebase(mount.mount_point, cgroup_root)
                return _Hierarchy(1, _join(base, rel), rel, base)
    if missing_v2 and not os.path.isdir(missing_v2):
        # Our own v2 group must be readable: it vanished, or this mount does
        # not show it.  Guessing from meminfo would be wrong.
        raise FileNotFoundError(errno.ENOENT, "the process's own cgroup is gone", missing_v2)
    return None


def _level_used(directory: str, version: int) -> tuple[int, dict[str, int]]:
    """Memory the level holds that the kernel cannot give back, and the stat keys read."""
    if version == 2:
        usage = parsers.parse_single_value(_read(f"{directory}/memory.current"), "memory.current")
        stat = parsers.parse_flat_keyed(_read(f"{directory}/memory.stat"), "memory.stat", _V2_KEYS)
        active, inactive = parsers.stat_fields(stat, _V2_RECLAIMABLE[:2], "memory.stat")
        # slab_reclaimable is in v2's memory.stat since Linux 4.14; a file
        # without it has nothing more to subtract.
        reclaimable = active + inactive + stat.get("slab_reclaimable", 0)
    else:
        usage = parsers.parse_single_value(
            _read(f"{directory}/memory.usage_in_bytes"), "memory.usage_in_bytes"
        )
        stat = parsers.parse_flat_keyed(_read(f"{directory}/memory.stat"), "memory.stat", _V1_KEYS)
        reclaimable = sum(parsers.stat_fields(stat, _V1_RECLAIMABLE, "memory.stat"))
    # v1's usage is batched per CPU and can lag the stat counters a little:
    # never report less than nothing.
    return max(0, usage - reclaimable), stat


def own_memory_group(
    proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> tuple[int, str] | None:
    """This process's own memory cgroup as (version, directory), None without one.

    Raises:
        OSError, KernelFileError: the membership files could not be read, or
            our own v2 group is gone.
    """
    hierarchy = _locate(proc_root, cgroup_root)
    return None if hierarchy is None else (hierarchy.version, hierarchy.own_dir)


def group_used_bytes(directory: str, version: int) -> int:
    """What a cgroup holds that the kernel cannot give back (DESIGN.md's "used").

    Raises:
        OSError, KernelFileError: the group's files could not be read.
    """
    return _level_used(directory, version)[0]


def _level_limit(directory: str, version: int) -> int | None:
    """The level's limit, None for no limit or for a level that has no limit file."""
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    try:
        raw = _read(f"{directory}/{name}")
    except FileNotFoundError:
        return None  # the root of a v2 mount has no memory.max
    return parsers.parse_v2_limit(raw, name) if version == 2 else parsers.parse_v1_limit(raw, name)


def _walk(hierarchy: _Hierarchy) -> list[_Level]:
    """Every level from the process's own group up to the root of the mount, own first."""
    version = hierarchy.version
    own_used, stat = _level_used(hierarchy.own_dir, version)
    hierarchical = stat.get("hierarchical_memory_limit")
    if version == 1 and hierarchical is not None and hierarchical >= parsers.V1_UNLIMITED_THRESHOLD:
        # v1 reports the tightest limit of the whole path in the group's own
        # memory.stat: when that is "unlimited", no level has a limit and
        # there is nothing to walk.
        return [_Level(hierarchy.own_path, None, own_used)]
    levels = [_Level(hierarchy.own_path, _level_limit(hierarchy.own_dir, version), own_used)]
    rel, directory = hierarchy.own_path.rstrip("/"), hierarchy.own_dir
    while directory != hierarchy.mount_dir and rel:
        rel, directory = rel.rsplit("/", 1)[0], directory.rsplit("/", 1)[0]
        try:
            limit = _level_limit(directory, version)
        except (PermissionError, NotADirectoryError):
            continue  # lies outside what this mount lets us read
        used = _level_used(directory, version)[0] if limit is not None else None
        levels.append(_Level(rel or "/", limit, used))
    return levels


def _meminfo(proc_root: str) -> tuple[int, int]:
    info = parsers.parse_meminfo(_read(f"{proc_root}/meminfo"), _MEMINFO_KEYS)
    try:
        total, available = info["MemTotal"], info["MemAvailable"]  # MemAvailable: Linux 3.14
    except KeyError as err:
        raise KernelFileError("meminfo", f"has no {err.args[0]} line") from err
    return total, max(0, total - available)


def _judge_levels(
    hierarchy: _Hierarchy, levels: list[_Level], stated: int | None, proc_root: str
) -> MemoryReading:
    source = MemorySource.CGROUP_V2 if hierarchy.version == 2 else MemorySource.CGROUP_V1
    own = levels[0]
    assert own.used is not None
    candidates = [
        (lv.limit - lv.used, lv.used, lv.limit, LimitOrigin.CGROUP, lv.path)
        for lv in levels
        if lv.limit is not None and lv.used is not None
    ]
    if stated is not None:
        tightest_kernel = min(candidates, default=None)
        if tightest_kernel is not None and stated > tightest_kernel[2]:
            warn_once(
                "ROOMKEEPER_MEMORY_LIMIT_MB>kernel",
                f"{stated}>{tightest_kernel[2]}",
                f"ROOMKEEPER_MEMORY_LIMIT_MB ({format_gb(stated)}) would raise the kernel's "
                f"limit ({format_gb(tightest_kernel[2])}); it can only lower it, so the "
                "kernel's limit is used",
            )
        candidates.append((stated - own.used, own.used, stated, LimitOrigin.STATED, own.path))
    if not candidates:
        # No level on the path has a limit: the machine is the container.
        total, used = _meminfo(proc_root)
        return MemoryReading(MemorySource.MEMINFO, used, total, LimitOrigin.MACHINE)
    _, used, limit, origin, path = min(candidates, key=lambda c: c[0])
    return MemoryReading(source, used, limit, origin, path)


def _portable_memory() -> MemoryReading:
    vm = psutil.virtual_memory()
    return MemoryReading(
        MemorySource.PORTABLE, int(vm.total - vm.available), int(vm.total), LimitOrigin.MACHINE
    )


def read_memory(
    *,
    proc_root: str = PROC_ROOT,
    cgroup_root: str = CGROUP_ROOT,
    settings: Settings | None = None,
    platform: str = sys.platform,
) -> MemoryReading:
    """Read memory used and the effective limit now.

    Every level of the process's own cgroup path that has a limit is judged
    against its own usage; the level with the least room is reported.  With
    no limit on the path, ROOMKEEPER_MEMORY_LIMIT_MB (if set) is judged
    against the process's own group, else the machine is the container
    (``/proc/meminfo``).  The stated limit can only lower the kernel's line.

    Never raises: an unreadable or malformed file gives an unknown reading
    with a reason.
    """
    settings = read_settings() if settings is None else settings
    if not platform.startswith("linux"):
        return _portable_memory()
    stated = settings.memory_limit_bytes
    try:
        hierarchy = _locate(proc_root, cgroup_root)
        if hierarchy is None:
            if stated is not None:
                return MemoryReading.unknown(
                    "no cgroup could be read, and /proc/meminfo measures the whole machine, "
                    f"which cannot be held against the stated limit of {format_gb(stated)}"
                )
            total, used = _meminfo(proc_root)
            return MemoryReading(MemorySource.MEMINFO, used, total, LimitOrigin.MACHINE)
        return _judge_levels(hierarchy, _walk(hierarchy), stated, proc_root)
    except OSError as err:
        # Name the file, never its path: the reason ends up in summaries.
        name = os.path.basename(str(err.filename)) if err.filename else "a kernel file"
        return MemoryReading.unknown(f"could not read {name}: {err.strerror or err}")
    except KernelFileError as err:
        return MemoryReading.unknown(f"malformed kernel file: {err}")


def read_disk(workspace: str | os.PathLike[str] | None = None) -> DiskReading:
    """Free and total space of the workspace volume, by ``os.statvfs`` (no subprocess).

    A workspace that does not exist yet is measured at its nearest existing parent.
    """
    path = os.path.abspath(workspace if workspace is not None else workspace_dir())
    while True:
        try:
            st = os.statvfs(path)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                return DiskReading(path, None, None, "no part of the workspace path exists")
            path = parent
            continue
        except OSError as err:
            reason = f"could not measure the volume: {err.strerror or err}"
            return DiskReading(path, None, None, reason)
        # f_bavail, not f_bfree: the blocks an unprivileged user may still write.
        return DiskReading(path, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def _read_pressure_file(path: str) -> parsers.Pressure | None:
    try:
        return parsers.parse_pressure(_read(path), os.path.basename(path))
    except (OSError, KernelFileError):
        return None


def read_pressure(
    kind: str, *, proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> tuple[parsers.Pressure | None, str]:
    """PSI for ``kind`` (``memory``, ``cpu``, ``io``): the cgroup's own file where it exists.

    Returns the pressure (None where PSI is not available) and where it came from.
    """
    try:
        hierarchy = _locate(proc_root, cgroup_root)
    except (OSError, KernelFileError):
        hierarchy = None
    if hierarchy is not None and hierarchy.version == 2:
        found = _read_pressure_file(f"{hierarchy.own_dir}/{kind}.pressure")
        if found is not None:
            return found, "cgroup"
    found = _read_pressure_file(f"{proc_root}/pressure/{kind}")
    return found, ("machine" if found is not None else "not available")


def load_per_core() -> float | None:
    """One-minute load average per usable core, or None where the platform has none."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return load / max(1, cores or 1)


def read_resources(
    *,
    proc_root: str = PROC_ROOT,
    cgroup_root: str = CGROUP_ROOT,
    settings: Settings | None = None,
    workspace: str | os.PathLike[str] | None = None,
    platform: str = sys.platform,
) -> Resources:
    """Take one full reading now: memory, disk, memory and CPU pressure, load.

    Args:
        proc_root: where ``/proc`` is (tests point it at a fixture tree).
        cgroup_root: where ``/sys/fs/cgroup`` is.
        settings: the variables to use; read from the environment when omitted.
        workspace: the volume to measure; ROOMKEEPER_WORKSPACE (default
            ROOMKEEPER_HOME/workspace) when omitted.
        platform: ``sys.platform``; anything but Linux gets psutil's portable reading.
    """
    settings = read_settings() if settings is None else settings
    if workspace is None and settings.workspace is not None:
        workspace = settings.workspace
    memory = read_memory(
        proc_root=proc_root, cgroup_root=cgroup_root, settings=settings, platform=platform
    )
    if platform.startswith("linux"):
        memory_pressure, source = read_pressure(
            "memory", proc_root=proc_root, cgroup_root=cgroup_root
        )
        cpu_pressure, _ = read_pressure("cpu", proc_root=proc_root, cgroup_root=cgroup_root)
    else:
        memory_pressure, cpu_pressure, source = None, None, "not available"
    return Resources(
        memory=memory,
        disk=read_disk(workspace),
        memory_pressure=memory_pressure,
        cpu_pressure=cpu_pressure,
        pressure_source=source,
        load_per_core=load_per_core(),
        platform=platform,
        taken_at=time.time(),
    )

"""Fresh resource readings: memory, pressure (PSI) and disk, nothing cached.

Every call reads the kernel's files afresh, so the line moves with the
container and no restart is needed.  Memory comes from cgroup v2,
then cgroup v1, then ``/proc/meminfo``; what "used" means (``docs/DESIGN.md``):
what the container holds that the kernel cannot give back (the file cache
and, on v2, reclaimable slab are left out).  Finding the process's cgroup
and reading each level of its path is :mod:`roomkeeper.kernel.cgroup_hierarchy`'s
job; this module judges those levels and reports the one with the least room.

The roots (``/proc`` and ``/sys/fs/cgroup``) are parameters so tests can
point the readers at captured trees (``tests/kernel_fixtures``).  This module is
the one boundary where ``OSError`` and
:class:`~roomkeeper.errors.KernelFileError` become a reading marked
*unknown* with a reason: no reader raises.
"""

from __future__ import annotations

import enum
import os
import sys
import time
from dataclasses import dataclass

import psutil

from roomkeeper.config import Settings, read_settings, warn_once
from roomkeeper.errors import KernelFileError
from roomkeeper.kernel import parsers
from roomkeeper.kernel.cgroup_hierarchy import Hierarchy, Level, locate, read_own_file, walk
from roomkeeper.kernel.cgroup_hierarchy import read_file as _read
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT, THIS_PLATFORM, Platform
from roomkeeper.paths import workspace_dir
from roomkeeper.units import format_gb

_MEMINFO_KEYS = frozenset(("MemTotal", "MemAvailable"))


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


def _meminfo(proc_root: str) -> tuple[int, int]:
    info = parsers.parse_meminfo(read_own_file(f"{proc_root}/meminfo"), _MEMINFO_KEYS)
    try:
        total, available = info["MemTotal"], info["MemAvailable"]  # MemAvailable: Linux 3.14
    except KeyError as err:
        raise KernelFileError("meminfo", f"has no {err.args[0]} line") from err
    return total, max(0, total - available)


def _judge_levels(
    hierarchy: Hierarchy, levels: list[Level], stated: int | None, proc_root: str
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
    platform: Platform = THIS_PLATFORM,
) -> MemoryReading:
    """Read memory used and the effective limit now.

    Every level of the process's own cgroup path that has a limit is judged
    against its own usage; the level with the least room is reported.  With
    no limit on the path, ROOMKEEPER_MEMORY_LIMIT_MB (if set) is judged
    against the process's own group, else the machine is the container
    (``/proc/meminfo``).  The stated limit can only lower the kernel's line.

    Off Linux (``platform``, chosen once by the caller) the reading is
    psutil's portable one.  Never raises: an unreadable or malformed file
    gives an unknown reading with a reason.
    """
    settings = read_settings() if settings is None else settings
    if not platform.linux:
        return _portable_memory()
    return _kernel_memory(_find(proc_root, cgroup_root), proc_root, settings)


@dataclass(frozen=True, slots=True)
class _Found:
    """What :func:`locate` found: the hierarchy (None without one), or why it could not look."""

    hierarchy: Hierarchy | None
    error: OSError | KernelFileError | None = None


def _find(proc_root: str, cgroup_root: str) -> _Found:
    """Locate the hierarchy once for a whole reading; memory and pressure share the answer."""
    try:
        return _Found(locate(proc_root, cgroup_root))
    except (OSError, KernelFileError) as err:
        return _Found(None, err)


def _kernel_memory(found: _Found, proc_root: str, settings: Settings) -> MemoryReading:
    """The memory reading from the kernel's files, the hierarchy already located."""
    if found.error is not None:
        return _unreadable(found.error)
    stated = settings.memory_limit_bytes
    try:
        if found.hierarchy is None:
            if stated is not None:
                return MemoryReading.unknown(
                    "no cgroup could be read, and /proc/meminfo measures the whole machine, "
                    f"which cannot be held against the stated limit of {format_gb(stated)}"
                )
            total, used = _meminfo(proc_root)
            return MemoryReading(MemorySource.MEMINFO, used, total, LimitOrigin.MACHINE)
        return _judge_levels(found.hierarchy, walk(found.hierarchy), stated, proc_root)
    except (OSError, KernelFileError) as err:
        return _unreadable(err)


def _unreadable(err: OSError | KernelFileError) -> MemoryReading:
    """The unknown reading for a file that could not be read or parsed."""
    if isinstance(err, OSError):
        # Name the file, never its path: the reason ends up in summaries.
        name = os.path.basename(str(err.filename)) if err.filename else "a kernel file"
        return MemoryReading.unknown(f"could not read {name}: {err.strerror or err}")
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
    return _pressure(kind, _find(proc_root, cgroup_root).hierarchy, proc_root)


def _pressure(
    kind: str, hierarchy: Hierarchy | None, proc_root: str
) -> tuple[parsers.Pressure | None, str]:
    """PSI for ``kind``, the hierarchy already located (None: the machine's file only)."""
    if hierarchy is not None and hierarchy.version == 2:
        found = _read_pressure_file(f"{hierarchy.own_dir}/{kind}.pressure")
        if found is not None:
            return found, "cgroup"
    found = _read_pressure_file(f"{proc_root}/pressure/{kind}")
    return found, ("machine" if found is not None else "not available")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; a CPU quota is not counted)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def load_per_core() -> float | None:
    """One-minute load average per usable core, or None where the platform has none."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    return load / usable_cores()


def cpu_pressure_percent() -> float | None:
    """CPU pressure now: PSI ``cpu`` some avg10, else load per core x 100, else None."""
    pressure, _ = read_pressure("cpu")
    if pressure is not None:
        return pressure.some.avg10
    load = load_per_core()
    return None if load is None else load * 100


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
    if Platform.named(platform).linux:
        found = _find(proc_root, cgroup_root)  # once: memory and both pressures share it
        memory = _kernel_memory(found, proc_root, settings)
        memory_pressure, source = _pressure("memory", found.hierarchy, proc_root)
        cpu_pressure, _ = _pressure("cpu", found.hierarchy, proc_root)
    else:
        memory = _portable_memory()
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


@dataclass(frozen=True, slots=True)
class PressureInputs:
    """What the pressure monitor reads: the guard's memory reading, the container's PSI.

    Attributes:
        memory: the same reading the guard judges (the tightest level).
        full_avg10: PSI memory ``full`` avg10 of that container: its v2 group's
            ``memory.pressure``; the machine's ``/proc/pressure/memory`` only where
            the machine is the container.  None otherwise (a v1 group has no PSI of
            its own, and a host-wide figure says nothing about the container).
        directory: the tightest level's directory, where notifications are armed.
        version: its cgroup version (None without a cgroup).
    """

    memory: MemoryReading
    full_avg10: float | None
    directory: str | None
    version: int | None


def read_pressure_inputs(
    *,
    proc_root: str = PROC_ROOT,
    cgroup_root: str = CGROUP_ROOT,
    settings: Settings | None = None,
    platform: Platform = THIS_PLATFORM,
) -> PressureInputs:
    """Read memory as the guard does, and the PSI of the same container, now.  Never raises."""
    settings = read_settings() if settings is None else settings
    if not platform.linux:
        return PressureInputs(_portable_memory(), None, None, None)
    found = _find(proc_root, cgroup_root)
    memory = _kernel_memory(found, proc_root, settings)
    hierarchy = found.hierarchy
    if memory.limit_origin is LimitOrigin.MACHINE:
        pressure = _read_pressure_file(f"{proc_root}/pressure/memory")
        full = pressure.full.avg10 if pressure is not None and pressure.full else None
        return PressureInputs(memory, full, None, None)
    if hierarchy is None or memory.group is None:
        return PressureInputs(memory, None, None, None)
    directory = _group_directory(hierarchy, memory.group)
    full = None
    if hierarchy.version == 2:
        pressure = _read_pressure_file(f"{directory}/memory.pressure")
        full = pressure.full.avg10 if pressure is not None and pressure.full else None
    return PressureInputs(memory, full, directory, hierarchy.version)


def _group_directory(hierarchy: Hierarchy, group: str) -> str:
    """The directory of a level of our path, given as the cgroup path the reading names."""
    rel = group.strip("/")
    return f"{hierarchy.mount_dir}/{rel}" if rel else hierarchy.mount_dir

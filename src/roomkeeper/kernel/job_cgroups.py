"""A job's own cgroups: its memory group (v2 or v1) and, on v1, its freezer group.

Made inside roomkeeper's own group so the container is still charged for
the job, and so every member can be found however it tried to
leave.  Where they go, and the room cgroup v2's rules need first, is
:mod:`roomkeeper.kernel.delegation`'s; what "used" means is
:mod:`roomkeeper.kernel.cgroup_hierarchy`'s.

Each group is named ``roomkeeper-<pid>-<job id>`` after the process that
made it, so a later gateway finds the groups an earlier one left behind
(:func:`stale_job_cgroups`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from roomkeeper.errors import KernelFileError
from roomkeeper.kernel import parsers
from roomkeeper.kernel.cgroup_hierarchy import group_used_bytes, remove_group
from roomkeeper.kernel.cgroup_hierarchy import read_file as _read
from roomkeeper.kernel.delegation import job_group_place, prepare_job_groups
from roomkeeper.kernel.freezer import FreezerGroup, freezer_parent
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT

JOB_CGROUP_PREFIX = "roomkeeper-"  # then the pid of the process that made it, "-", the job id


@dataclass(frozen=True, slots=True)
class JobCgroup:
    """A job's own memory cgroup: where it is, and which cgroup version."""

    directory: str
    version: int  # 1 or 2

    def footprint_bytes(self) -> int:
        """Memory the group holds that the kernel cannot give back: usage less file cache."""
        return group_used_bytes(self.directory, self.version)

    def peak_bytes(self) -> int | None:
        """The kernel's high-water mark, file cache included; None where none is kept.

        v2's ``memory.peak`` exists since Linux 5.19; v1's
        ``memory.max_usage_in_bytes`` counts the file cache the job wrote,
        which is why a v1 job's peak is sampled instead
        (:mod:`roomkeeper.processes.process`).
        """
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return parsers.parse_single_value(_read(f"{self.directory}/{name}"), name)
        except (OSError, KernelFileError):
            return None

    def cpu_seconds(self) -> float | None:
        """CPU seconds the group's processes used so far, the ended ones' included: v2's
        ``cpu.stat`` ``usage_usec`` (there whether or not the cpu controller is on); None on
        v1, whose memory group counts no CPU, or where it cannot be read."""
        if self.version != 2:
            return None
        try:
            raw = _read(f"{self.directory}/cpu.stat")
            usage = parsers.parse_flat_keyed(raw, "cpu.stat", frozenset({"usage_usec"}))
        except (OSError, KernelFileError):
            return None
        return usage["usage_usec"] / 1e6 if "usage_usec" in usage else None

    def remove(self, attempts: int = 100) -> bool:
        """rmdir the group, retrying while its last tasks drain; True once it is gone."""
        return remove_group(self.directory, attempts)


def job_cgroup_parent(
    proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> JobCgroup | None:
    """The folder job cgroups are made in, as they are now; None where none are made.

    On v2 that is ``<own>/roomkeeper-jobs`` once roomkeeper moved into its
    leaf (or under the root group); on v1, this process's own memory group.
    Reads only: it never moves anything.

    Raises:
        OSError, KernelFileError: the membership files could not be read.
    """
    place = job_group_place(proc_root, cgroup_root)
    if place.directory is None or place.version is None or not os.path.isdir(place.directory):
        return None
    return JobCgroup(place.directory, place.version)


def _safe_name(job_id: str) -> str:
    return f"{JOB_CGROUP_PREFIX}{os.getpid()}-{re.sub(r'[^A-Za-z0-9_.-]', '_', job_id)[:80]}"


def _make_unique(parent: str, base: str) -> str | None:
    """mkdir ``parent/base`` or, where taken, ``base-1``, ``base-2``...; None after 100."""
    for suffix in range(100):  # a job id may come back within one scheduler
        directory = f"{parent}/{base}-{suffix}" if suffix else f"{parent}/{base}"
        try:
            os.mkdir(directory)
        except FileExistsError:
            continue
        return directory
    return None


def create_job_cgroup(
    job_id: str, proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> JobCgroup | str:
    """Make the job's memory cgroup; a sentence saying why not otherwise.

    The first call may move roomkeeper into its leaf (cgroup v2,
    :func:`~roomkeeper.kernel.delegation.prepare_job_groups`).
    """
    place = prepare_job_groups(proc_root, cgroup_root)
    if place.directory is None or place.version is None:
        return place.reason or "no job groups"
    base = _safe_name(job_id)
    try:
        directory = _make_unique(place.directory, base)
    except OSError as err:
        return f"cannot create a cgroup: {err}"
    if directory is None:
        return f"{place.directory}/{base}: 100 groups of that name exist"
    return JobCgroup(directory, place.version)


def create_job_freezer(
    job_id: str, proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> FreezerGroup | str:
    """Make the job's group in the v1 freezer hierarchy; a sentence saying why not otherwise.

    For a job without a v2 group (whose ``cgroup.freeze`` does the same): on
    a v1 host, or where a v1 freezer hierarchy is mounted beside v2.
    """
    try:
        parent = freezer_parent(proc_root, cgroup_root)
        if parent is None:
            return "no v1 freezer hierarchy is mounted"
        base = _safe_name(job_id)
        directory = _make_unique(parent, base)
    except (OSError, KernelFileError) as err:
        return f"cannot create a freezer group: {err}"
    if directory is None:
        return f"{parent}/{base}: 100 groups of that name exist"
    return FreezerGroup(directory)


def stale_job_cgroups(
    previous_pid: int | None = None, proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> list[str]:
    """Job groups (memory and v1 freezer) that an earlier process left behind.

    Args:
        previous_pid: only that process's groups; None for those of every
            process that no longer runs.  This process's own are never listed.
    """
    folders = []
    for find in (job_cgroup_parent, _freezer_parent_group):
        try:
            found = find(proc_root, cgroup_root)
        except (OSError, KernelFileError):
            continue
        if found is not None:
            folders.append(found.directory)
    stale = []
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            pid = _maker(name)
            if pid is None or pid == os.getpid():
                continue
            if (pid == previous_pid if previous_pid is not None else not _running(pid)) and (
                os.path.isdir(f"{folder}/{name}")
            ):
                stale.append(f"{folder}/{name}")
    return stale


def _freezer_parent_group(proc_root: str, cgroup_root: str) -> FreezerGroup | None:
    parent = freezer_parent(proc_root, cgroup_root)
    return None if parent is None else FreezerGroup(parent)


def _maker(name: str) -> int | None:
    """The pid in a job group's name, None for a name that is not one of ours."""
    if not name.startswith(JOB_CGROUP_PREFIX):
        return None
    pid = name[len(JOB_CGROUP_PREFIX) :].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

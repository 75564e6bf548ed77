"""A job's own memory cgroup: made under roomkeeper's own group, measured, removed.

Nested under our own group so the container is still charged for the job
(DESIGN.md), and so every member can be found however it tried to leave.
Locating our group and what "used" means are :mod:`cgroup_hierarchy`'s.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from roomkeeper.errors import KernelFileError
from roomkeeper.kernel import parsers
from roomkeeper.kernel.cgroup_hierarchy import group_used_bytes, own_memory_level
from roomkeeper.kernel.cgroup_hierarchy import read_file as _read
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT


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

        v2's ``memory.peak`` exists since Linux 5.19.
        """
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return parsers.parse_single_value(_read(f"{self.directory}/{name}"), name)
        except (OSError, KernelFileError):
            return None

    def remove(self, attempts: int = 100) -> bool:
        """rmdir the group, retrying while its last tasks drain; True once it is gone."""
        for _ in range(attempts):
            try:
                os.rmdir(self.directory)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(0.01)  # EBUSY: an exiting task still counts as a member
        return False


def job_cgroup_parent(
    proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> JobCgroup | None:
    """Where job cgroups are made: this process's own memory group (v2 first, then v1).

    None where there is no cgroup memory controller.  Each job's group is
    made directly under it (:func:`create_job_cgroup`), so its listing is
    where a job group is found again.

    Raises:
        OSError, KernelFileError: the membership files could not be read.
    """
    found = own_memory_level(proc_root, cgroup_root)
    return None if found is None else JobCgroup(found[1], found[0])


def create_job_cgroup(
    job_id: str, proc_root: str = PROC_ROOT, cgroup_root: str = CGROUP_ROOT
) -> JobCgroup | str:
    """Make the job's memory cgroup under our own group; a sentence saying why not otherwise."""
    try:
        parent = job_cgroup_parent(proc_root, cgroup_root)
        if parent is None:
            return "no cgroup memory controller"
        if (
            parent.version == 2
            and b"memory" not in _read(f"{parent.directory}/cgroup.subtree_control").split()
        ):
            # EBUSY where our own group holds processes ("no internal
            # processes"): v2 without delegation.
            with open(f"{parent.directory}/cgroup.subtree_control", "w") as out:
                out.write("+memory")
        safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:80]
        base = f"{parent.directory}/roomkeeper-{os.getpid()}-{safe_id}"
        for suffix in range(100):  # a job id may come back within one scheduler
            directory = f"{base}-{suffix}" if suffix else base
            try:
                os.mkdir(directory)
            except FileExistsError:
                continue
            return JobCgroup(directory, parent.version)
        return f"{base}: 100 groups of that name exist"
    except (OSError, KernelFileError) as err:
        return f"cannot create a cgroup: {err}"

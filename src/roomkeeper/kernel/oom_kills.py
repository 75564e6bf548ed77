"""The kernel's OOM kill counters: one group's, and the whole machine's since boot.

Read by the tests and benchmarks that prove no job was lost to the kernel;
both counters need Linux >= 4.13.
"""

from __future__ import annotations

from pathlib import Path

from roomkeeper.kernel.host import PROC_ROOT
from roomkeeper.kernel.parsers import parse_flat_keyed


def group_oom_kills(group: str | Path, version: int) -> int:
    """The group's OOM kill counter (v2 ``memory.events``, v1 ``memory.oom_control``)."""
    name = "memory.events" if version == 2 else "memory.oom_control"
    return _oom_kill((Path(group) / name).read_bytes(), name)


def machine_oom_kills(proc_root: str | Path = PROC_ROOT) -> int:
    """The kernel's OOM kills anywhere since boot (``/proc/vmstat``).

    cgroup v1 counts a kill only in the victim's own group: one inside a job's
    group (roomkeeper makes one per job) never shows in its parent's
    ``memory.oom_control``.  The machine-wide delta catches it, and any other
    kill on the machine meanwhile: an upper bound, strict in the safe direction.
    """
    return _oom_kill((Path(proc_root) / "vmstat").read_bytes(), "/proc/vmstat")


def _oom_kill(raw: bytes, what: str) -> int:
    counts = parse_flat_keyed(raw, what, frozenset({"oom_kill"}))
    if "oom_kill" not in counts:
        raise RuntimeError(f"{what} has no oom_kill counter (Linux >= 4.13 needed)")
    return counts["oom_kill"]

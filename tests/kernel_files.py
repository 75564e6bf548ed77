"""Synthetic kernel trees (``proc/`` and ``sys/fs/cgroup/``) in the kernel's file formats.

The captured files in ``tests/kernel_fixtures`` (read off real hosts) prove
the readers on real text; these small builders let a test set exact numbers
for the rule's boundaries.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).parent / "kernel_fixtures"
V2_MOUNT = "32 23 0:28 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
V1_MOUNT = "35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
V1_UNLIMITED = 9223372036854771712


@dataclass(frozen=True)
class Roots:
    """The two roots a reader takes."""

    proc: str
    cgroup: str


@dataclass(frozen=True)
class Level:
    """One cgroup level: its limit (None = no limit), usage and reclaimable file cache."""

    limit: int | None
    usage: int
    file_cache: int = 0


def meminfo(total_kib: int = 24_000_000, available_kib: int = 20_000_000) -> str:
    """A /proc/meminfo with the lines the reader uses and a few it must skip."""
    return (
        f"MemTotal:       {total_kib} kB\nMemFree:        {available_kib} kB\n"
        f"MemAvailable:   {available_kib} kB\nBuffers:           4952 kB\n"
        "HugePages_Total:       0\n"
    )


def copy_fixture(name: str, dest: Path) -> Roots:
    """Copy a captured tree so a test may damage it."""
    shutil.copytree(FIXTURES / name, dest / name)
    return Roots(str(dest / name / "proc"), str(dest / name / "sys/fs/cgroup"))


def fixture_roots(name: str) -> Roots:
    """The roots of a captured tree, read in place."""
    return Roots(str(FIXTURES / name / "proc"), str(FIXTURES / name / "sys/fs/cgroup"))


def v2_tree(dest: Path, own: str, levels: dict[str, Level], *, meminfo_text: str = "") -> Roots:
    """A pure cgroup v2 host; ``levels`` maps cgroup paths ("/a/b") to their numbers."""
    proc, cg = dest / "proc", dest / "sys/fs/cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "pressure").mkdir()
    (proc / "self/cgroup").write_text(f"0::{own}\n")
    (proc / "self/mountinfo").write_text(V2_MOUNT)
    (proc / "meminfo").write_text(meminfo_text or meminfo())
    cg.mkdir(parents=True)
    for path, level in levels.items():
        d = cg / path.strip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.max").write_text("max\n" if level.limit is None else f"{level.limit}\n")
        (d / "memory.current").write_text(f"{level.usage}\n")
        (d / "memory.stat").write_text(
            f"anon {level.usage - level.file_cache}\nfile {level.file_cache}\n"
            f"inactive_anon 0\nactive_anon 0\ninactive_file {level.file_cache}\n"
            "active_file 0\nslab_reclaimable 0\n"
        )
    return Roots(str(proc), str(cg))


def v1_tree(
    dest: Path,
    own: str,
    levels: dict[str, Level],
    *,
    mount_root: str = "/",
    meminfo_text: str = "",
) -> Roots:
    """A hybrid host with the memory controller on cgroup v1 (like this machine)."""
    proc, cg = dest / "proc", dest / "sys/fs/cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self/cgroup").write_text(f"4:memory:{own}\n0::/\n")
    (proc / "self/mountinfo").write_text(
        V1_MOUNT.format(root=mount_root)
        + "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    (proc / "meminfo").write_text(meminfo_text or meminfo())
    (cg / "unified").mkdir(parents=True)
    tightest = {}
    for path in sorted(levels, key=len):
        level = levels[path]
        limit = V1_UNLIMITED if level.limit is None else level.limit
        parent = path.rsplit("/", 1)[0] or "/"
        tightest[path] = min(limit, tightest.get(parent, V1_UNLIMITED))
        d = cg / "memory" / path.strip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (d / "memory.usage_in_bytes").write_text(f"{level.usage}\n")
        (d / "memory.stat").write_text(
            f"cache {level.file_cache}\nrss {level.usage - level.file_cache}\n"
            f"hierarchical_memory_limit {tightest[path]}\n"
            f"total_cache {level.file_cache}\ntotal_inactive_file {level.file_cache}\n"
            "total_active_file 0\n"
        )
    return Roots(str(proc), str(cg))

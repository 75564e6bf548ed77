"""Real memory cgroups for kernel tests: created under our own group, always removed."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from roomkeeper.kernel import parsers

CGROUP_ROOT = Path("/sys/fs/cgroup")


def own_memory_group() -> tuple[int, Path]:
    """(cgroup version, directory of this process's own memory group), or skip saying why."""
    v2_path, v1_path = parsers.parse_proc_self_cgroup(Path("/proc/self/cgroup").read_bytes())
    mounts = parsers.parse_mountinfo(Path("/proc/self/mountinfo").read_bytes())
    for mount in mounts:
        if mount.fs_type == "cgroup2" and v2_path is not None:
            own = Path(mount.mount_point, v2_path.lstrip("/"))
            if (own / "memory.current").exists():
                return 2, own
    for mount in mounts:
        if mount.fs_type == "cgroup" and "memory" in mount.super_options and v1_path:
            return 1, Path(mount.mount_point, v1_path.lstrip("/"))
    pytest.skip("this kernel has no cgroup memory controller (neither v2 nor v1)")


def memory_cgroup_version() -> int:
    """1 or 2: the version of the hierarchy this process is charged in (skips when none)."""
    return own_memory_group()[0]


@contextlib.contextmanager
def child_memory_cgroup(limit_bytes: int) -> Iterator[tuple[int, Path]]:
    """A child memory cgroup with a real limit, removed afterwards even when the test fails.

    Processes still in the group at the end were started by the test: they
    are killed (by pid from the group's own list, never by name) before the
    group is removed.
    """
    version, parent = own_memory_group()
    if os.geteuid() != 0:
        pytest.skip("creating a memory cgroup needs root (CI runs as root)")
    group = parent / f"rktest-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot create a child memory cgroup here: {err.strerror}")
    try:
        limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
        (group / limit_file).write_text(str(limit_bytes))
        yield version, group
    finally:
        deadline = time.monotonic() + 10
        while True:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

"""The readers against the real kernel: a real memory cgroup, real page cache, real anon memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from roomkeeper.kernel.resources import read_pressure
from tests.cgroups import (
    cgroup_fs_read_only,
    child_memory_cgroup,
    ext4_scratch,
    own_memory_group,
)

pytestmark = [pytest.mark.kernel, pytest.mark.cgroups]

MB = 10**6
GIB = 2**30

# Runs inside the group: joins it first (so what it allocates is charged
# there), writes 300 MB through the page cache, holds 200 MiB of anonymous
# memory, then takes a reading from inside and prints it.
INSIDE = """
import json, os, sys
from roomkeeper.config import Settings
from roomkeeper.kernel.resources import read_memory
procs, scratch = sys.argv[1], sys.argv[2]
if procs != "-":  # "-": the container's own group, where this process is already
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
group = os.path.dirname(procs) if procs != "-" else sys.argv[3]
name = "memory.current" if os.path.exists(group + "/memory.current") else "memory.usage_in_bytes"
before = read_memory(settings=Settings()).used_bytes, int(open(group + "/" + name).read())
block = b"x" * (1 << 20)
with open(scratch, "wb") as f:
    for _ in range(300):
        f.write(block)
held = bytearray(200 * (1 << 20))
for i in range(0, len(held), 4096):
    held[i] = 1
r = read_memory(settings=Settings())
charged = int(open(group + "/" + name).read())
print(json.dumps({"used": r.used_bytes, "limit": r.limit_bytes, "source": r.source.value,
                  "reason": r.unknown_reason, "charged": charged,
                  "used_before": before[0], "charged_before": before[1]}))
"""


def test_reading_inside_a_limited_group_reports_its_limit_and_leaves_out_the_cache(
    tmp_path: Path,
) -> None:
    """Inside a real 1 GiB group: the limit exactly, used 200-300 MB though 500 MB are charged.

    The 300 MB of page cache go to an ext4 file system on a loop device,
    which caches like a disk: a tmpfs or overlay ``/tmp`` would hold them as
    shared memory, which is rightly counted as used.
    """
    if cgroup_fs_read_only():
        return _check_the_container_itself(tmp_path)
    with ext4_scratch(tmp_path) as disk, child_memory_cgroup(GIB) as (version, group):
        reading = _inside(str(group / "cgroup.procs"), str(disk / "cache"))
    assert reading["reason"] is None
    assert reading["source"] == f"cgroup v{version}"
    assert reading["limit"] == GIB
    assert 200 * MB <= reading["used"] <= 300 * MB, reading
    # The kernel did charge the page cache to the group; the reading left it out.
    assert reading["charged"] >= reading["used"] + 250 * MB, reading


def _inside(*args: str) -> dict[str, Any]:
    """Run :data:`INSIDE` with ``args``; the reading it printed."""
    argv = [sys.executable, "-c", INSIDE, *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    reading: dict[str, Any] = json.loads(result.stdout)
    return reading


def _check_the_container_itself(tmp_path: Path) -> None:
    """In a read-only cgroup layout no child group can be made: the container's own group is
    read, and what the same work adds to it is measured: about 200 MB more used, though
    about 500 MB more are charged."""
    version, own = own_memory_group()
    with ext4_scratch(tmp_path) as disk:
        reading = _inside("-", str(disk / "cache"), str(own))
    assert reading["reason"] is None
    assert reading["source"] == f"cgroup v{version}"
    assert reading["limit"] == int((own / "memory.max").read_text())
    used = reading["used"] - reading["used_before"]
    charged = reading["charged"] - reading["charged_before"]
    assert 180 * MB <= used <= 300 * MB, reading
    assert charged >= used + 250 * MB, reading


def test_machine_pressure_is_read_where_the_kernel_has_psi() -> None:
    """/proc/pressure/memory and cpu parse on this kernel."""
    if not Path("/proc/pressure/memory").exists():
        pytest.skip("this kernel has no PSI (/proc/pressure is absent: CONFIG_PSI off)")
    for kind in ("memory", "cpu"):
        pressure, source = read_pressure(kind)
        assert pressure is not None, kind
        assert source in ("machine", "cgroup")


def test_mount_table_is_parsed_again_when_the_kernel_signals_a_change(tmp_path: Path) -> None:
    """A cgroup mount added or removed is seen on the next reading (POLLPRI on mountinfo)."""
    import os

    from roomkeeper.kernel import cgroup_hierarchy

    if os.geteuid() != 0:
        pytest.skip("mounting a cgroup2 file system needs root (CI runs as root)")
    target = tmp_path / "extra-cgroup2"
    target.mkdir()
    before = cgroup_hierarchy._mount_table.mounts()
    mounted = subprocess.run(["mount", "-t", "cgroup2", "none", str(target)], check=False)
    if mounted.returncode != 0:
        pytest.skip("this kernel would not mount another cgroup2 view here")
    try:
        during = cgroup_hierarchy._mount_table.mounts()
        assert str(target) in [m.mount_point for m in during]
    finally:
        subprocess.run(["umount", str(target)], check=True)
    after = cgroup_hierarchy._mount_table.mounts()
    assert str(target) not in [m.mount_point for m in after]
    assert len(after) == len(before)


def test_whether_a_v2_group_charges_memory_is_kept_a_second_on_the_real_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real roots' answer is looked at again after CHARGE_RECHECK_S, not on every decision;
    an injected tree's, every time."""
    from roomkeeper.kernel import cgroup_hierarchy

    now = [1000.0]
    monkeypatch.setattr(cgroup_hierarchy.time, "monotonic", lambda: now[0])
    group = str(tmp_path)
    assert cgroup_hierarchy._charges_memory(group, True) is False
    (tmp_path / "memory.current").write_text("0\n")
    assert cgroup_hierarchy._charges_memory(group, False) is True
    assert cgroup_hierarchy._charges_memory(group, True) is False  # kept
    now[0] += cgroup_hierarchy.CHARGE_RECHECK_S
    assert cgroup_hierarchy._charges_memory(group, True) is True

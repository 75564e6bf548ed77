"""Readers: captured trees read back to the byte; every failure is unknown with a reason."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomkeeper.config import Settings
from roomkeeper.kernel import cgroup_hierarchy, resources
from roomkeeper.kernel.host import Platform
from roomkeeper.kernel.resources import (
    LimitOrigin,
    MemorySource,
    read_disk,
    read_memory,
    read_resources,
)
from tests.kernel_files import FIXTURES, Level, Roots, copy_fixture, fixture_roots, v1_tree, v2_tree

GIB = 2**30
NO_VARS = Settings()


def memory(roots: Roots, stated: int | None = None) -> resources.MemoryReading:
    return read_memory(
        proc_root=roots.proc,
        cgroup_root=roots.cgroup,
        settings=Settings(memory_limit_bytes=stated),
    )


def test_v2_capture_reads_back_to_the_byte() -> None:
    """The cgroup v2 capture: limit 1073741824, used 219389968 (cache and slab left out)."""
    reading = memory(fixture_roots("cgroup-v2-host"))
    assert (reading.used_bytes, reading.limit_bytes) == (219389968, 1073741824)
    assert reading.source is MemorySource.CGROUP_V2
    assert reading.limit_origin is LimitOrigin.CGROUP
    assert reading.group == "/rkfix_413"


def test_v1_capture_reads_back_to_the_byte() -> None:
    """The cgroup v1 capture: limit 1073741824, used 226320384, the unlimited root skipped."""
    reading = memory(fixture_roots("cgroup-v1-host"))
    assert (reading.used_bytes, reading.limit_bytes) == (226320384, 1073741824)
    assert reading.source is MemorySource.CGROUP_V1
    assert reading.group == "/rkfix_v1"


def test_fixture_readme_states_the_values_we_assert() -> None:
    """The copied fixtures are the shared ones: their README names the same expected values."""
    text = (FIXTURES / "README.md").read_text()
    assert "219389968" in text and "226320384" in text and "1073741824" in text


@pytest.mark.parametrize("builder", [v1_tree, v2_tree])
def test_tightest_level_on_the_path_is_reported(tmp_path: Path, builder) -> None:  # type: ignore[no-untyped-def]
    """A parent with less room than the child's own limit is the level reported."""
    roots = builder(
        tmp_path,
        "/outer/inner",
        {
            "/": Level(None, 9 * GIB),
            "/outer": Level(3 * GIB, 2 * GIB + 500, file_cache=500),  # room 1 GiB
            "/outer/inner": Level(2 * GIB, GIB // 2),  # room 1.5 GiB
        },
    )
    reading = memory(roots)
    assert (reading.limit_bytes, reading.used_bytes, reading.group) == (3 * GIB, 2 * GIB, "/outer")


@pytest.mark.parametrize("builder", [v1_tree, v2_tree])
def test_own_limit_wins_when_it_is_tighter(tmp_path: Path, builder) -> None:  # type: ignore[no-untyped-def]
    """The process's own level is reported when it has the least room."""
    roots = builder(
        tmp_path,
        "/outer/inner",
        {"/outer": Level(8 * GIB, GIB), "/outer/inner": Level(GIB, GIB // 4)},
    )
    reading = memory(roots)
    assert (reading.limit_bytes, reading.used_bytes, reading.group) == (
        GIB,
        GIB // 4,
        "/outer/inner",
    )


def test_v1_mount_rooted_at_a_container_group(tmp_path: Path) -> None:
    """A v1 mount whose root is the container's group maps /proc/self/cgroup paths inside it."""
    roots = v1_tree(
        tmp_path,
        "/docker/abc/job",
        {"/": Level(4 * GIB, GIB), "/job": Level(None, GIB // 2)},
        mount_root="/docker/abc",
    )
    reading = memory(roots)
    assert (reading.limit_bytes, reading.used_bytes) == (4 * GIB, GIB)


@pytest.mark.parametrize("builder", [v1_tree, v2_tree])
def test_no_limit_anywhere_means_the_machine_is_the_container(tmp_path: Path, builder) -> None:  # type: ignore[no-untyped-def]
    """No level has a limit: limit is MemTotal, used is MemTotal - MemAvailable, and it says so."""
    roots = builder(tmp_path, "/job", {"/job": Level(None, GIB)})
    reading = memory(roots)
    assert reading.source is MemorySource.MEMINFO
    assert reading.limit_origin is LimitOrigin.MACHINE
    assert reading.limit_bytes == 24_000_000 * 1024
    assert reading.used_bytes == 4_000_000 * 1024


@pytest.mark.parametrize("builder", [v1_tree, v2_tree])
def test_stated_limit_on_a_host_without_one_judges_the_own_group(tmp_path: Path, builder) -> None:  # type: ignore[no-untyped-def]
    """With no kernel limit, ROOMKEEPER_MEMORY_LIMIT_MB is held against the own group's usage."""
    roots = builder(tmp_path, "/job", {"/job": Level(None, GIB, file_cache=GIB // 4)})
    reading = memory(roots, stated=5 * GIB)
    assert (reading.limit_bytes, reading.used_bytes) == (5 * GIB, GIB - GIB // 4)
    assert reading.limit_origin is LimitOrigin.STATED


def test_stated_limit_lowers_the_kernel_line(tmp_path: Path) -> None:
    """A stated limit under the kernel's is the effective limit reported."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(4 * GIB, GIB)})
    reading = memory(roots, stated=2 * GIB)
    assert (reading.limit_bytes, reading.limit_origin) == (2 * GIB, LimitOrigin.STATED)


def test_stated_limit_cannot_raise_the_kernel_line_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stated limit above the kernel's is ignored, with one log line however often it is read."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(4 * GIB, GIB)})
    with caplog.at_level(logging.WARNING, logger="roomkeeper"):
        for _ in range(3):
            reading = memory(roots, stated=6 * GIB + 7)
    assert (reading.limit_bytes, reading.limit_origin) == (4 * GIB, LimitOrigin.CGROUP)
    raises = [r for r in caplog.records if "can only lower it" in r.getMessage()]
    assert len(raises) == 1


def test_meminfo_only_with_a_stated_limit_is_unknown(tmp_path: Path) -> None:
    """No cgroup at all plus a stated limit: unknown, with a sentence saying why."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(None, GIB)})
    os.remove(Path(roots.proc, "self/cgroup"))
    Path(roots.proc, "self/cgroup").write_text("")
    reading = memory(roots, stated=2 * GIB)
    assert not reading.known
    assert "measures the whole machine" in (reading.unknown_reason or "")
    plain = memory(roots)
    assert plain.source is MemorySource.MEMINFO and plain.known


def test_vanished_own_group_is_unknown_not_meminfo(tmp_path: Path) -> None:
    """A group removed between reads gives unknown with a reason, never a machine-wide guess."""
    for builder, sub in ((v2_tree, "v2"), (v1_tree, "v1")):
        roots = builder(tmp_path / sub, "/job", {"/": Level(None, 0), "/job": Level(GIB, 1)})
        base = Path(roots.cgroup) / ("memory" if sub == "v1" else "")
        shutil.rmtree(base / "job")
        reading = memory(roots)
        assert not reading.known, sub
        assert reading.unknown_reason


def test_permission_denied_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel file we may not read gives unknown, naming the file but not its path."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(GIB, 1)})
    real_read = cgroup_hierarchy._read

    def deny(path: str) -> bytes:
        if path.endswith("memory.stat"):
            raise PermissionError(13, "Permission denied", path)
        return real_read(path)

    monkeypatch.setattr(cgroup_hierarchy, "_read", deny)
    reading = memory(roots)
    assert reading.unknown_reason == "could not read memory.stat: Permission denied"


@pytest.mark.parametrize(
    ("name", "content"),
    [("memory.max", "-1\n"), ("memory.current", ""), ("memory.stat", "anon 1\n")],
)
def test_malformed_files_are_unknown_with_a_reason(tmp_path: Path, name: str, content: str) -> None:
    """Negative, empty and incomplete kernel files give unknown, naming the file."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(GIB, 1)})
    Path(roots.cgroup, "job", name).write_text(content)
    reading = memory(roots)
    assert not reading.known
    assert name in (reading.unknown_reason or "")


@pytest.mark.parametrize("fixture", ["cgroup-v1-host", "cgroup-v2-host"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_garbage_in_any_file_never_raises(
    tmp_path_factory: pytest.TempPathFactory, fixture: str, data: st.DataObject
) -> None:
    """Arbitrary bytes in any one kernel file give a reading or unknown, never an exception."""
    roots = copy_fixture(fixture, tmp_path_factory.mktemp("garbage"))
    files = sorted(
        p for base in (roots.proc, roots.cgroup) for p in Path(base).rglob("*") if p.is_file()
    )
    victim = data.draw(st.sampled_from(files))
    victim.write_bytes(data.draw(st.binary(max_size=200)))
    full = read_resources(
        proc_root=roots.proc, cgroup_root=roots.cgroup, settings=NO_VARS, workspace=roots.proc
    )
    reading = full.memory
    if reading.known:
        assert reading.used_bytes is not None and reading.used_bytes >= 0
        assert reading.limit_bytes is not None and reading.limit_bytes >= 0
    else:
        assert reading.unknown_reason and "/" not in reading.unknown_reason.split(":")[0]


def test_pressure_prefers_the_cgroup_file_and_absent_is_not_zero(tmp_path: Path) -> None:
    """v2 reads the group's memory.pressure; with no PSI anywhere the reading is None."""
    roots = fixture_roots("cgroup-v2-host")
    pressure, source = resources.read_pressure(
        "memory", proc_root=roots.proc, cgroup_root=roots.cgroup
    )
    assert source == "cgroup" and pressure is not None
    bare = v1_tree(tmp_path, "/job", {"/job": Level(None, 1)})
    pressure, source = resources.read_pressure(
        "memory", proc_root=bare.proc, cgroup_root=bare.cgroup
    )
    assert pressure is None and source == "not available"


def test_v1_pressure_comes_from_the_machine() -> None:
    """cgroup v1 has no per-group PSI: the machine's /proc/pressure/memory is read."""
    roots = fixture_roots("cgroup-v1-host")
    pressure, source = resources.read_pressure(
        "memory", proc_root=roots.proc, cgroup_root=roots.cgroup
    )
    assert source == "machine" and pressure is not None
    assert pressure.some.total_us == 1261752


def test_disk_of_a_missing_workspace_is_read_at_its_nearest_parent(tmp_path: Path) -> None:
    """A workspace that does not exist yet is measured at its nearest existing parent."""
    reading = read_disk(tmp_path / "not" / "yet")
    st = os.statvfs(tmp_path)
    assert reading.path == str(tmp_path)
    assert reading.total_bytes == st.f_blocks * st.f_frsize
    assert reading.free_bytes is not None and reading.free_bytes > 0
    assert not (tmp_path / "not").exists()


def test_disk_read_failure_is_unknown(tmp_path: Path) -> None:
    """A path through a regular file cannot be measured: unknown with a reason."""
    (tmp_path / "file").write_text("x")
    reading = read_disk(tmp_path / "file" / "below")
    assert not reading.known
    assert reading.unknown_reason and "Not a directory" in reading.unknown_reason


def test_not_linux_gets_the_portable_reading() -> None:
    """Off Linux the reading is psutil's, and says so."""
    reading = read_memory(settings=NO_VARS, platform=Platform.named("darwin"))
    assert reading.source is MemorySource.PORTABLE
    assert reading.limit_bytes and reading.used_bytes is not None


def test_every_call_reads_afresh(tmp_path: Path) -> None:
    """A changed file is seen on the next call: nothing is cached."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(GIB, 100)})
    assert memory(roots).used_bytes == 100
    Path(roots.cgroup, "job", "memory.current").write_text("200\n")
    Path(roots.cgroup, "job", "memory.max").write_text(f"{2 * GIB}\n")
    again = memory(roots)
    assert (again.used_bytes, again.limit_bytes) == (200, 2 * GIB)


def test_own_kernel_files_are_kept_open_read_fresh_and_reopened() -> None:
    """The guard's own files stay open, each read gives the kernel's value now, a descriptor
    that went bad is opened again, and no more than KEPT_FILES stay open."""
    kept = cgroup_hierarchy._KeptFiles()
    path = "/proc/self/stat"  # its 14th field, user CPU time, moves as this test works
    first = kept.read(path)
    sum(i * i for i in range(3_000_000))  # burn some CPU time
    assert kept.read(path) != first and kept.kept() == [path]
    os.close(kept._fds[path])  # a descriptor gone bad behind its back
    assert kept.read(path).split()[0] == str(os.getpid()).encode()
    for other in ("/proc/meminfo", "/proc/self/cgroup", "/proc/loadavg"):
        assert kept.read(other)
    assert len(kept.kept()) == 4 <= cgroup_hierarchy.KEPT_FILES


def test_files_outside_the_real_roots_are_never_kept(tmp_path: Path) -> None:
    """An injected tree is read afresh each time (a test may replace a file whole)."""
    kept = cgroup_hierarchy._KeptFiles()
    target = tmp_path / "memory.current"
    target.write_text("1\n")
    assert kept.read(str(target)) == b"1\n"
    replacement = tmp_path / "new"
    replacement.write_text("2\n")
    replacement.replace(target)
    assert kept.read(str(target)) == b"2\n" and kept.kept() == []

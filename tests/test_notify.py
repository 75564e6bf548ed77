"""The pressure monitor's inputs: kernel notifications and the container's reading and PSI."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roomkeeper.kernel import resources
from roomkeeper.kernel.notify import Notifier, psi_trigger_line, threshold_line
from tests.cgroups import (
    cgroup_fs_read_only,
    child_memory_cgroup,
    memory_cgroup_version,
    own_memory_group,
)
from tests.kernel_files import Level, fixture_roots, v1_tree, v2_tree

MIB = 2**20


def test_the_lines_written_to_the_kernel() -> None:
    """A v1 threshold is 'EVENTFD USAGEFD BYTES'; a PSI trigger 'full STALL WINDOW'."""
    assert threshold_line(5, 6, 1800) == "5 6 1800"
    assert psi_trigger_line("full", 100_000, 2_000_000) == "full 100000 2000000"
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        threshold_line(5, 6, -1)
    with pytest.raises(ValueError, match="'some' or 'full'"):
        psi_trigger_line("most", 1, 2)
    with pytest.raises(ValueError, match="<= the window"):
        psi_trigger_line("full", 3, 2)


def test_nothing_to_arm_falls_back_to_polling_and_says_why(tmp_path: Path) -> None:
    """A group without the files arms nothing, and its description says polling and why."""
    notifier = Notifier()
    notifier.arm_v1_thresholds(str(tmp_path / "gone"), [100])
    notifier.arm_v2(str(tmp_path / "gone"))
    assert notifier.armed == []
    assert notifier.describe().startswith("polling only (v1 threshold: No such file")
    notifier.close()


def test_v2_fixture_files_are_armed_and_watched(tmp_path: Path) -> None:
    """On a v2 group's files the PSI trigger is written and memory.events is watched."""
    (tmp_path / "memory.pressure").write_text("")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    notifier = Notifier()
    notifier.arm_v2(str(tmp_path))
    try:
        assert [a.what for a in notifier.armed] == ["PSI full trigger", "memory.events"]
        assert (tmp_path / "memory.pressure").read_bytes() == b"full 100000 2000000\0"
    finally:
        notifier.close()


def test_inputs_of_a_v2_container_carry_its_own_psi_and_directory() -> None:
    """v2: the guard's reading, the group's own PSI full avg10, where to arm."""
    roots = fixture_roots("cgroup-v2-host")
    inputs = resources.read_pressure_inputs(proc_root=roots.proc, cgroup_root=roots.cgroup)
    assert inputs.memory.used_bytes == 219389968
    assert inputs.full_avg10 == 0.0
    assert (inputs.directory, inputs.version) == (f"{roots.cgroup}/rkfix_413", 2)


def test_inputs_of_a_v1_container_never_use_the_hosts_psi() -> None:
    """v1 has no PSI of its own: the host's figure is not the container's, so none is given."""
    roots = fixture_roots("cgroup-v1-host")
    inputs = resources.read_pressure_inputs(proc_root=roots.proc, cgroup_root=roots.cgroup)
    assert inputs.memory.limit_bytes == 1073741824
    assert inputs.full_avg10 is None
    assert (inputs.directory, inputs.version) == (f"{roots.cgroup}/memory/rkfix_v1", 1)


def test_the_tightest_level_is_where_notifications_go(tmp_path: Path) -> None:
    """With a tighter parent, the parent's directory is armed, not our own group's."""
    roots = v1_tree(tmp_path, "/a/b", {"/a": Level(1000 * MIB, 500 * MIB), "/a/b": Level(None, 1)})
    inputs = resources.read_pressure_inputs(proc_root=roots.proc, cgroup_root=roots.cgroup)
    assert inputs.directory == f"{roots.cgroup}/memory/a"


def test_machine_wide_psi_only_where_the_machine_is_the_container(tmp_path: Path) -> None:
    """No limit on the path: the machine is the container, so its PSI is the container's."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(None, 10 * MIB)})
    (Path(roots.proc) / "pressure").mkdir(exist_ok=True)
    (Path(roots.proc) / "pressure/memory").write_text(
        "some avg10=1.00 avg60=0 avg300=0 total=1\nfull avg10=31.50 avg60=0 avg300=0 total=1\n"
    )
    inputs = resources.read_pressure_inputs(proc_root=roots.proc, cgroup_root=roots.cgroup)
    assert inputs.full_avg10 == 31.5 and inputs.directory is None


GROW = (
    "import time; b = bytearray({n}); b[::4096] = b'x' * len(b[::4096]); "
    "print('ready', flush=True); time.sleep(30)"
)


@pytest.mark.kernel
@pytest.mark.cgroups
def test_a_real_v1_threshold_fires_its_eventfd() -> None:
    """A real child memory group with a 64 MiB threshold: a child holding 128 MiB fires it."""
    if memory_cgroup_version() != 1:
        pytest.skip("usage thresholds are cgroup v1's (v2 has PSI triggers)")
    with child_memory_cgroup(512 * MIB) as (_, group):
        notifier = Notifier()
        notifier.arm_v1_thresholds(str(group), [64 * MIB])
        assert notifier.failures == []
        poller = select.poll()
        notifier.register(poller)
        assert poller.poll(0) == []  # nothing yet: the group is empty
        joiner = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
        with subprocess.Popen(
            [*joiner, sys.executable, "-c", GROW.format(n=128 * MIB)], stdout=subprocess.PIPE
        ) as child:
            try:
                deadline = time.monotonic() + 30
                events: list[tuple[int, int]] = []
                while not events and time.monotonic() < deadline:
                    events = poller.poll(100)
                assert [fd for fd, _ in events] == [notifier.armed[0].fd]
                assert notifier.clear(events[0][0]) == f"usage >= {64 * MIB}"
            finally:
                child.kill()
                notifier.close()


@pytest.mark.kernel
@pytest.mark.cgroups
def test_a_real_v2_group_takes_a_psi_trigger() -> None:
    """A real v2 group accepts the PSI trigger and the memory.events watch; in a read-only
    layout (a container's) its own group takes the memory.events watch alone, and the
    failure of the trigger says why."""
    if memory_cgroup_version() != 2:
        pytest.skip("PSI triggers on a group are cgroup v2's")
    if cgroup_fs_read_only():
        _, own = own_memory_group()
        notifier = Notifier()
        notifier.arm_v2(str(own))
        try:
            assert [a.what for a in notifier.armed] == ["memory.events"], notifier.armed
            assert any("read-only" in f.lower() for f in notifier.failures), notifier.failures
        finally:
            notifier.close()
        return
    with child_memory_cgroup(512 * MIB) as (_, group):
        notifier = Notifier()
        notifier.arm_v2(str(group))
        try:
            assert notifier.failures == [], notifier.failures
            assert len(notifier.armed) == 2
        finally:
            notifier.close()
        assert os.path.isdir(group)

"""Suspending a whole managed tree and resuming it, each of the three ways, on the real kernel."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from roomkeeper.errors import SuspendError
from roomkeeper.kernel.freezer import FreezeMethod, freezer_parent
from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.processes.peaks import tree_footprint
from roomkeeper.processes.process import ManagedProcess
from tests.cgroups import cgroup_fs_read_only
from tests.processes import Reaper, read_log

# All but the v1 freezer's test run again on cgroup v2 in CI (marked `cgroups`).
pytestmark = pytest.mark.kernel

MB = 10**6

# A leader and a child that left its process group (setsid) each grow by
# 1 MiB every 20 ms of busy CPU, 120 steps, then say so and exit.
GROW = textwrap.dedent(
    """
    import os, time

    def grow(name):
        held = []
        for _ in range(120):
            held.append(bytearray(1 << 20))
            held[-1][::4096] = b"x" * 256  # touch every page
            start = time.monotonic()
            while time.monotonic() - start < 0.02:
                pass
        print(name, "done", flush=True)

    if os.fork() == 0:
        os.setsid()
        grow("escaped")
        os._exit(0)
    print("ready", flush=True)
    grow("leader")
    os.wait()
    """
)


@pytest.fixture
def v1_freezer() -> Iterator[None]:
    """A v1 freezer hierarchy: the host's where mounted, else one mounted for the test.

    A cgroup v2 kernel can still mount the v1 freezer beside v2 (nothing
    binds it on v2), which is how the CI VM tests this way too.
    """
    if freezer_parent() is not None:
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("mounting a v1 freezer hierarchy needs root (CI runs as root)")
    target = Path(f"/run/rktest-freezer-{uuid.uuid4().hex[:8]}")
    target.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "cgroup", "-o", "freezer", "rktest", str(target)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            pytest.skip(f"this kernel would not mount a v1 freezer: {mounted.stderr.strip()}")
        try:
            assert freezer_parent() is not None
            yield
        finally:
            subprocess.run(["umount", str(target)], check=True)
    finally:
        target.rmdir()


def tree_cpu_seconds(job: ManagedProcess) -> float:
    """CPU time the leader and every member used so far."""
    total = 0.0
    for proc in [psutil.Process(job.pid), *job.refresh()]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def held(job: ManagedProcess) -> int:
    """What the tree holds now, read from the kernel (the job's own figure may be the
    sampler's latest, taken before the freeze, while the sampler is busy)."""
    return tree_footprint([psutil.Process(job.pid), *job.refresh()])


def check_suspension(job: ManagedProcess, log: Path, way: FreezeMethod) -> None:
    """Suspended: no CPU, memory still; suspended again: no change; resumed: both finish."""
    read_log(log, "ready")
    time.sleep(0.3)  # let both grow a little
    assert len(job.refresh()) == 1  # the escaped child is found
    assert job.suspend() is way
    assert job.suspend() is way  # idempotent
    assert job.suspended is way
    cpu, memory = tree_cpu_seconds(job), held(job)
    time.sleep(1.0)
    assert tree_cpu_seconds(job) - cpu < 0.05, "a suspended tree used CPU"
    # Running, the tree grows by 50 MiB a second.  Frozen, only the kernel's own
    # work moves its figure, by a huge page or so (khugepaged collapses pages).
    assert abs(held(job) - memory) < 5 * MB, "a suspended tree's memory changed"
    assert job.resume() is way
    assert job.resume() is None  # idempotent: nothing to resume
    assert job.wait(120) == 0
    assert "escaped done" in read_log(log, "escaped done")


@pytest.mark.cgroups
def test_cgroup_v2_freeze_suspends_the_whole_tree(tmp_path: Path, reaper: Reaper) -> None:
    """A job in its own v2 group is frozen through cgroup.freeze and thawed again; where a
    read-only cgroup file system gives it no group, by signals to every process of its tree."""
    log = tmp_path / "grow.log"
    job = reaper.launch("v2", LaunchSpec([sys.executable, "-c", GROW], str(log)))
    if cgroup_fs_read_only():
        assert job.cgroup_dir is None and "read-only" in (job.cgroup_note or ""), job.cgroup_note
        check_suspension(job, log, FreezeMethod.SIGNALS)
        return
    if job.cgroup_dir is None or not Path(job.cgroup_dir, "cgroup.freeze").exists():
        pytest.skip(f"this host gives jobs no cgroup v2 group ({job.cgroup_note or 'v1'})")
    check_suspension(job, log, FreezeMethod.CGROUP_V2)
    events = Path(job.cgroup_dir, "cgroup.events").read_text()
    assert "frozen 0" in events


def test_v1_freezer_suspends_the_whole_tree(
    tmp_path: Path, reaper: Reaper, v1_freezer: None
) -> None:
    """A job without a v2 group is frozen through its v1 freezer group and thawed again."""
    log = tmp_path / "grow.log"
    spec = LaunchSpec([sys.executable, "-c", GROW], str(log), use_cgroup=False)
    job = reaper.launch("v1", spec)
    assert job.freezer_dir is not None, "no v1 freezer group was made"
    check_suspension(job, log, FreezeMethod.FREEZER_V1)


@pytest.mark.cgroups
def test_signals_suspend_every_process_of_the_tree(tmp_path: Path, reaper: Reaper) -> None:
    """Without a freezer, SIGSTOP reaches every member, the escaped child too; SIGCONT resumes."""
    log = tmp_path / "grow.log"
    spec = LaunchSpec([sys.executable, "-c", GROW], str(log), use_cgroup=False, use_freezer=False)
    job = reaper.launch("signals", spec)
    assert job.cgroup_dir is None and job.freezer_dir is None
    check_suspension(job, log, FreezeMethod.SIGNALS)


@pytest.mark.cgroups
def test_a_suspended_tree_is_stopped_whole(tmp_path: Path, reaper: Reaper) -> None:
    """stop() of a suspended job resumes it into its SIGTERM: nothing is left frozen or alive."""
    log = tmp_path / "grow.log"
    job = reaper.launch("stopped", LaunchSpec([sys.executable, "-c", GROW], str(log)))
    read_log(log, "ready")
    members = [psutil.Process(job.pid), *job.refresh()]
    job.suspend()
    assert job.stop(grace=10.0) == -15
    job.close()
    assert job.suspended is None
    alive = [p.pid for p in members if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []


@pytest.mark.cgroups
def test_a_closed_job_cannot_be_suspended(tmp_path: Path, reaper: Reaper) -> None:
    """suspend() after close() raises SuspendError naming the job; resume() does nothing."""
    job = reaper.launch("gone", LaunchSpec(["true"], str(tmp_path / "t.log")))
    job.wait(30)
    job.close()
    with pytest.raises(SuspendError, match=r"job 'gone' could not be suspended: it has ended"):
        job.suspend()
    assert job.resume() is None

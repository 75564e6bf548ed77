"""Where job cgroups go under cgroup v2's rules: built trees per case, the real kernel for moves."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from roomkeeper.guard.admission import Guard
from roomkeeper.kernel import cgroup_hierarchy
from roomkeeper.kernel.delegation import JOBS_FOLDER, LEAF, JobGroupPlace, prepare_job_groups
from roomkeeper.kernel.job_cgroups import (
    JobCgroup,
    create_job_cgroup,
    job_cgroup_parent,
    stale_job_cgroups,
)
from tests.cgroups import cgroup_fs_read_only, job_group_folder, scratch_v2_group
from tests.kernel_files import Level, v2_tree


def v2_host(
    dest: Path, own: str, procs: list[int], *, stat: dict[int, str] | None = None
) -> tuple[str, str, Path]:
    """A v2 host whose group ``own`` holds ``procs``, with /proc/<pid>/stat for ``stat``'s pids."""
    roots = v2_tree(dest, own, {own: Level(None, 10**8)} if own != "/" else {})
    cg = Path(roots.cgroup)
    group = cg / own.strip("/")
    group.mkdir(parents=True, exist_ok=True)
    (group / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in procs))
    (group / "cgroup.controllers").write_text("cpu memory pids\n")
    (group / "cgroup.subtree_control").write_text("\n")
    if own != "/":
        (group / "cgroup.type").write_text("domain\n")
    for pid, text in (stat or {}).items():
        Path(roots.proc, str(pid)).mkdir()
        Path(roots.proc, str(pid), "stat").write_text(text)
    return roots.proc, roots.cgroup, group


def test_a_group_holding_a_strangers_process_gets_no_job_groups_and_nothing_moves(
    tmp_path: Path,
) -> None:
    """v2 forbids controllers below a group with processes: with a stranger there, none is made."""
    me = os.getpid()
    sshd = "419 (sshd) S 1 419 419 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1\n"
    proc, cg, group = v2_host(tmp_path, "/box", [me, 419], stat={419: sshd})
    made = create_job_cgroup("j", proc, cg)
    assert isinstance(made, str)
    assert "/box holds processes roomkeeper did not start (pid 419 sshd)" in made
    assert sorted(p.name for p in group.iterdir() if p.is_dir()) == []  # no leaf, no jobs
    assert (group / "cgroup.procs").read_text() == f"{me}\n419\n"  # nothing moved
    assert (group / "cgroup.subtree_control").read_text() == "\n"
    assert job_cgroup_parent(proc, cg) is None


def test_a_leaf_roomkeeper_moved_into_is_found_again(tmp_path: Path) -> None:
    """A process in <own>/roomkeeper makes its jobs in <own>/roomkeeper-jobs, moving nothing."""
    proc, cg, _ = v2_host(tmp_path, f"/box/{LEAF}", [os.getpid()])
    jobs = Path(cg, "box", JOBS_FOLDER)
    jobs.mkdir()
    assert job_cgroup_parent(proc, cg) == JobCgroup(str(jobs), 2)
    made = create_job_cgroup("a/b c", proc, cg)
    assert made == JobCgroup(str(jobs / f"roomkeeper-{os.getpid()}-a_b_c"), 2)
    place = prepare_job_groups(proc, cg)
    assert place == JobGroupPlace(2, str(jobs), f"/box/{JOBS_FOLDER}", f"/box/{LEAF}")
    assert place.describe() == (
        f"cgroup v2 under /box/{JOBS_FOLDER}, roomkeeper itself in /box/{LEAF}"
    )


def test_the_root_group_delegates_memory_without_moving_anything(tmp_path: Path) -> None:
    """The v2 root is exempt from the rule: memory is enabled and jobs go in /roomkeeper-jobs."""
    me = os.getpid()
    proc, cg, root = v2_host(tmp_path, "/", [me, 1, 2])
    (root / JOBS_FOLDER).mkdir()  # the kernel would give a new group this file itself
    (root / JOBS_FOLDER / "cgroup.subtree_control").write_text("\n")
    made = create_job_cgroup("j", proc, cg)
    assert made == JobCgroup(str(root / JOBS_FOLDER / f"roomkeeper-{me}-j"), 2)
    assert (root / "cgroup.subtree_control").read_text() == "+memory"
    assert (root / JOBS_FOLDER / "cgroup.subtree_control").read_text() == "+memory"
    assert not (root / LEAF).exists()
    assert (root / "cgroup.procs").read_text() == f"{me}\n1\n2\n"


def test_a_namespace_root_is_not_the_root(tmp_path: Path) -> None:
    """A container's own group shows as / in its namespace, but has cgroup.type: the rule holds."""
    stranger = "77 (sleep) S 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1\n"
    proc, cg, root = v2_host(tmp_path, "/", [os.getpid(), 77], stat={77: stranger})
    (root / "cgroup.type").write_text("domain\n")
    made = create_job_cgroup("j", proc, cg)
    assert isinstance(made, str) and "(pid 77 sleep)" in made
    assert not (root / JOBS_FOLDER).exists()


def test_without_a_memory_controller_the_reason_says_where_it_looked(tmp_path: Path) -> None:
    """No memory in cgroup.controllers and no v1 hierarchy: the sentence names the file read."""
    proc, cg, group = v2_host(tmp_path, "/box", [os.getpid()])
    (group / "cgroup.controllers").write_text("cpu pids\n")
    made = create_job_cgroup("j", proc, cg)
    assert isinstance(made, str)
    assert f"{group}/cgroup.controllers does not offer memory" in made
    assert f"{proc}/self/cgroup names no v1 memory hierarchy" in made


def test_the_guard_says_once_where_job_groups_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reason no job groups are made is in the "guard is on" line, said once."""
    roots = v2_tree(tmp_path, "/job", {"/job": Level(10 * 10**9, 10**9)})
    place = JobGroupPlace(None, None, reason="/job holds processes roomkeeper did not start")
    guard = Guard(
        env={"ROOMKEEPER_JOB_DISK_MB": "0", "ROOMKEEPER_DISK_HEADROOM_PERCENT": "0"},
        proc_root=roots.proc,
        cgroup_root=roots.cgroup,
        workspace=tmp_path,
        job_groups=place.describe,
    )
    with caplog.at_level(logging.INFO, logger="roomkeeper"):
        for i in range(3):
            guard.admit(f"a{i}", memory_bytes=1)
    lines = [r.getMessage() for r in caplog.records if "guard is on" in r.getMessage()]
    assert len(lines) == 1
    assert (
        'job groups: "none: /job holds processes roomkeeper did not start; '
        'jobs are measured by sampling their process trees"}'
    ) in lines[0]


def test_stale_job_groups_are_those_of_the_pid_asked_for(tmp_path: Path) -> None:
    """stale_job_cgroups lists an earlier process's job groups, never ours or a stranger's."""
    proc, cg, _ = v2_host(tmp_path, f"/box/{LEAF}", [os.getpid()])
    jobs = Path(cg, "box", JOBS_FOLDER)
    for name in ("roomkeeper-4242-a", "roomkeeper-4242-b-1", f"roomkeeper-{os.getpid()}-c", "x"):
        (jobs / name).mkdir(parents=True)
    assert sorted(stale_job_cgroups(4242, proc, cg)) == [
        str(jobs / "roomkeeper-4242-a"),
        str(jobs / "roomkeeper-4242-b-1"),
    ]


def test_removing_a_group_waits_between_attempts_never_after_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused rmdir is tried again after a short wait; one attempt is answered at once
    (closing an ended job asks once, and a tree left running must not wait for nothing)."""
    busy = tmp_path / "busy"
    (busy / "member").mkdir(parents=True)  # not empty: rmdir is refused, as for a live group
    waits: list[float] = []
    monkeypatch.setattr(cgroup_hierarchy, "time", SimpleNamespace(sleep=waits.append))
    assert not JobCgroup(str(busy), 1).remove(attempts=1)
    assert waits == []
    assert not JobCgroup(str(busy), 1).remove(attempts=3)
    assert waits == [0.01, 0.01]
    (busy / "member").rmdir()
    assert JobCgroup(str(busy), 1).remove(attempts=1) and not busy.exists()


# Runs in a group of its own: joins it, makes room for job groups, makes one,
# and says where everything ended up.
JOIN_AND_PREPARE = textwrap.dedent(
    """
    import json, os, sys
    group = sys.argv[1]
    with open(f"{group}/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    from roomkeeper.kernel.delegation import prepare_job_groups
    from roomkeeper.kernel.job_cgroups import create_job_cgroup
    place = prepare_job_groups()
    job = create_job_cgroup("j")
    own = open("/proc/self/cgroup").read().strip().split("::")[-1]
    directory = None if isinstance(job, str) else job.directory
    print(json.dumps({"place": place.describe(), "own": own, "job": directory,
                      "memory_max": directory is not None
                      and os.path.exists(f"{directory}/memory.max")}))
    """
)


def _join_and_prepare(group: Path) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", JOIN_AND_PREPARE, str(group)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    return report


def read_only_layout_makes_no_group_and_moves_nothing() -> bool:
    """In a read-only cgroup layout (a container's), check what roomkeeper does instead of job
    groups: it says why none are made, makes none, and moves no process; whether it was."""
    if not cgroup_fs_read_only():
        return False
    before = Path("/proc/self/cgroup").read_text()
    place = prepare_job_groups()
    assert place.directory is None and "read-only" in (place.reason or ""), place
    made = create_job_cgroup("ro-probe")
    assert isinstance(made, str) and "read-only" in made, made
    assert Path("/proc/self/cgroup").read_text() == before
    return True


@pytest.mark.kernel
@pytest.mark.cgroups
def test_v2_roomkeeper_moves_into_a_leaf_and_gives_jobs_the_memory_controller() -> None:
    """Alone in its group, roomkeeper moves into <own>/roomkeeper; jobs get memory.max."""
    if read_only_layout_makes_no_group_and_moves_nothing():
        return
    with scratch_v2_group() as group:
        report = _join_and_prepare(group)
        assert str(report["own"]).endswith(f"/{group.name}/{LEAF}")
        assert "memory" in (group / "cgroup.subtree_control").read_text().split()
        job = Path(str(report["job"]))
        assert job.parent == group / JOBS_FOLDER
        assert report["memory_max"] is True  # the controller reached the job's group
        assert "roomkeeper itself in" in str(report["place"])


@pytest.mark.kernel
@pytest.mark.cgroups
def test_v2_a_stranger_in_the_group_means_no_job_groups_and_no_move() -> None:
    """A process roomkeeper did not start shares its group: nothing moves, none is made."""
    if read_only_layout_makes_no_group_and_moves_nothing():
        return
    with scratch_v2_group() as group:
        stranger = subprocess.Popen(["sleep", "60"])
        try:
            (group / "cgroup.procs").write_text(str(stranger.pid))
            report = _join_and_prepare(group)
            assert report["job"] is None
            assert f"(pid {stranger.pid} sleep)" in str(report["place"])
            assert str(report["own"]).endswith(f"/{group.name}")  # not moved
            assert not (group / LEAF).exists()
            assert (group / "cgroup.procs").read_text().split()[:1] == [str(stranger.pid)]
        finally:
            stranger.kill()
            stranger.wait()


READ_ONLY = textwrap.dedent(
    """
    set -e
    mount --make-rprivate /
    mount -o remount,bind,ro "$1"
    exec "$2" -c 'from roomkeeper.kernel.delegation import prepare_job_groups
    from roomkeeper.kernel.job_cgroups import create_job_cgroup
    print(prepare_job_groups().describe()); print(create_job_cgroup("j"))
    print(open("/proc/self/cgroup").read().strip().replace(chr(10), "|"))'
    """
)


@pytest.mark.kernel
@pytest.mark.cgroups
def test_read_only_cgroup_files_mean_no_job_groups_and_no_move() -> None:
    """With /sys/fs/cgroup mounted read-only (as in many containers) none is made, nothing moves."""
    if read_only_layout_makes_no_group_and_moves_nothing():
        return  # the layout itself: no mount of our own needed
    _, folder = job_group_folder()
    mount = _mount_point(folder)
    before = Path("/proc/self/cgroup").read_text().strip().replace("\n", "|")
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", READ_ONLY, "sh", mount, sys.executable],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0 and "unshare" in result.stderr:
        pytest.skip(f"unshare --mount failed here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    place, job, membership = result.stdout.strip().splitlines()
    assert place.startswith("none: ") and "read-only" in place
    assert "read-only" in job
    assert membership == before  # the child started where we are, and stayed there


def _mount_point(path: Path) -> str:
    """The mount point of the cgroup mount that holds ``path``."""
    best = ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4]
        if str(path).startswith(mount_point.rstrip("/") + "/") and len(mount_point) > len(best):
            best = mount_point
    return best


def _a_dead_pid() -> int:
    """A pid no process has now: the maker of the stale groups, gone with its crash."""
    for pid in range(4_000_000, 4_100_000, 997):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    pytest.skip("no free pid found to name a dead gateway's groups with")


@pytest.mark.kernel
@pytest.mark.cgroups
def test_recovery_removes_a_dead_runs_suspended_job_groups_and_kills_their_tree() -> None:
    """A crashed run's job group holding a frozen tree is thawed, emptied and removed at start."""
    from roomkeeper.gateway.recovery import kill_stale_groups
    from roomkeeper.kernel.freezer import FreezerGroup, freezer_parent, set_v2_frozen

    dead = _a_dead_pid()
    if read_only_layout_makes_no_group_and_moves_nothing():
        assert kill_stale_groups(dead) == (0, 0)  # no group to look for, and no error
        return
    version, folder = job_group_folder()
    name = f"roomkeeper-{dead}-suspended"
    groups = [folder / name]
    v1_freezer = freezer_parent() if version == 1 else None
    if v1_freezer is not None:
        groups.append(Path(v1_freezer) / name)
    child = subprocess.Popen(["sleep", "60"])
    try:
        for group in groups:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(child.pid))
        if v1_freezer is not None:
            FreezerGroup(str(groups[-1])).set_frozen(True)
        else:
            set_v2_frozen(str(groups[0]), True)
        assert (
            Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] in "DSt"
        )  # frozen, not dead
        pids, removed = kill_stale_groups(dead)
        assert child.wait(timeout=10) == -9  # the SIGKILL landed: the group was thawed
        assert (pids, removed) == (1, len(groups))
        assert not any(g.exists() for g in groups)
    finally:
        if child.poll() is None:
            for group in groups:
                with contextlib.suppress(OSError):
                    (
                        group / ("freezer.state" if "freezer" in str(group) else "cgroup.freeze")
                    ).write_text("THAWED" if "freezer" in str(group) else "0")
            child.kill()
            child.wait()
        for group in groups:
            with contextlib.suppress(OSError):
                group.rmdir()

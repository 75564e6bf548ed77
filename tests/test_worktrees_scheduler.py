"""The scheduler's launch path with worktrees: the tree after admission, the disk reap
before a refusal, the command inside its tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from roomkeeper.guard.admission import Guard
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import (
    SchedulerClocks,
    SchedulerListeners,
    SchedulerParts,
    SchedulerSettings,
)
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.journal.database import Journal
from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.worktrees.pruner import PruneReport
from roomkeeper.worktrees.request import WorktreeRequest
from roomkeeper.worktrees.service import Worktrees
from tests.fakes import FakeHandle
from tests.worktree_repos import (
    MIB,
    fill,
    git,
    git_identity,
    job_view,
    journal,
    make_repo,
    record_ended,
    record_running,
    repo,
    small_fs,
)

pytestmark = pytest.mark.kernel

__all__ = ["git_identity", "journal", "repo", "small_fs"]  # fixtures, used by name

LIMITS = Limits(32, 8, 4, 4, cpu_pressure_percent=100.0, worker_nice=0)


def guard_env(volume: Path, job_disk_mib: int = 0) -> dict[str, str]:
    return {
        "ROOMKEEPER_WORKSPACE": str(volume),
        "ROOMKEEPER_JOB_MEMORY_MB": "1",
        "ROOMKEEPER_JOB_DISK_MB": str(job_disk_mib),
        "ROOMKEEPER_DISK_HEADROOM_PERCENT": "10",
        "ROOMKEEPER_REAP_AT_PERCENT": "100",
    }


class Recorder:
    """A launcher and a before_launch hook that remember what they were given, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []
        self.handles: dict[str, FakeHandle] = {}

    def before_launch(self, view: JobView) -> None:
        self.events.append(("marker", view.worktree.path if view.worktree else None))

    def __call__(self, job_id: str, spec: LaunchSpec) -> FakeHandle:
        self.events.append(("spawn", spec.cwd))
        self.handles[job_id] = FakeHandle(job_id)
        return self.handles[job_id]


def scheduler(
    tmp_path: Path, guard: Guard, ws: Worktrees, recorder: Recorder | None = None
) -> Scheduler:
    return Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=lambda: LIMITS),
        parts=SchedulerParts(
            guard=guard, launcher=recorder, prepare=ws.prepare, reclaim_disk=ws.reclaim
        ),
        listeners=SchedulerListeners(before_launch=recorder.before_launch if recorder else None),
        clocks=SchedulerClocks(cpu_percent=lambda: None),
    )


def test_the_tree_is_made_after_admission_and_before_the_marker_and_the_spawn(
    tmp_path: Path, small_fs: Path, repo: Path, journal: Journal
) -> None:
    """The marker's view carries the tree, and the command's cwd is the tree."""
    env = guard_env(small_fs)
    ws = Worktrees(workspace=lambda: small_fs, registry=journal, env=env)
    recorder = Recorder()
    sched = scheduler(tmp_path, Guard(env=env, workspace=small_fs), ws, recorder)
    try:
        view = sched.submit(JobSpec(argv=["true"], worktree=WorktreeRequest(str(repo))))
        sched.tick()
        job = sched.get(view.id)
        assert job.state is JobState.RUNNING, job.error
        assert job.worktree is not None and job.worktree.branch == f"roomkeeper/{view.id}"
        assert recorder.events == [("marker", job.worktree.path), ("spawn", job.worktree.path)]
    finally:
        for handle in recorder.handles.values():
            handle.code = 0
        sched.close(grace=0.1)


def test_a_tree_that_cannot_be_made_fails_the_job_before_it_starts(
    tmp_path: Path, small_fs: Path, repo: Path, journal: Journal
) -> None:
    """A dirty base at launch: failed with the reason, nothing spawned, no reservation kept."""
    env = guard_env(small_fs)
    ws = Worktrees(workspace=lambda: small_fs, registry=journal, env=env)
    recorder = Recorder()
    guard = Guard(env=env, workspace=small_fs)
    sched = scheduler(tmp_path, guard, ws, recorder)
    try:
        (repo / "README").write_text("changed after submission\n")
        view = sched.submit(JobSpec(argv=["true"], worktree=WorktreeRequest(str(repo))))
        sched.tick()
        job = sched.get(view.id)
        assert job.state is JobState.FAILED
        assert job.error is not None and "is dirty" in job.error
        assert recorder.events == []
        assert guard.statistics().young == 0
    finally:
        sched.close(grace=0.1)


def test_a_disk_refusal_gets_one_reap_to_the_guard_s_line_and_a_second_judgement(
    tmp_path: Path, small_fs: Path, journal: Journal
) -> None:
    """Short of the line: the two oldest finished trees go, the job is admitted."""
    big = make_repo(tmp_path, big_file_mib=20)
    env = guard_env(small_fs, job_disk_mib=100)  # needs 100 MiB + 10 % of 300 MiB = 130 MiB
    reports: list[PruneReport] = []
    ws = Worktrees(workspace=lambda: small_fs, registry=journal, on_prune=reports.append, env=env)
    trees = []
    for i in range(4):
        view = job_view(f"old{i}", big)
        tree = ws.prepare(view)
        assert tree is not None
        trees.append(tree)
        record_ended(journal, record_running(journal, view, tree))
    fill(small_fs, leave_free=100 * MIB)
    recorder = Recorder()
    sched = scheduler(tmp_path, Guard(env=env, workspace=small_fs), ws, recorder)
    try:
        view = sched.submit(JobSpec(argv=["true"]))
        sched.tick()
        assert sched.get(view.id).state is JobState.RUNNING
        (report,) = reports
        assert [v.tree.job_id for v in report.removed] == ["old0", "old1"]
        assert [Path(t.path).is_dir() for t in trees] == [False, False, True, True]
    finally:
        for handle in recorder.handles.values():
            handle.code = 0
        sched.close(grace=0.1)


def test_a_disk_refusal_stands_when_the_reap_frees_nothing(
    tmp_path: Path, small_fs: Path, repo: Path, journal: Journal
) -> None:
    """Every tree protected: the job keeps waiting for disk, and its tree is untouched."""
    env = guard_env(small_fs, job_disk_mib=100)
    ws = Worktrees(workspace=lambda: small_fs, registry=journal, env=env)
    view = job_view("busy", repo)
    tree = ws.prepare(view)
    assert tree is not None
    record_running(journal, view, tree)  # still running
    fill(small_fs, leave_free=50 * MIB)
    recorder = Recorder()
    sched = scheduler(tmp_path, Guard(env=env, workspace=small_fs), ws, recorder)
    try:
        waiting = sched.submit(JobSpec(argv=["true"]))
        sched.tick()
        job = sched.get(waiting.id)
        assert (job.state, job.reason and job.reason.value) == (JobState.WAITING, "disk")
        assert Path(tree.path).is_dir()
    finally:
        sched.close(grace=0.1)


@pytest.mark.cgroups
def test_a_real_command_runs_inside_its_tree_on_its_branch(
    tmp_path: Path, small_fs: Path, repo: Path, journal: Journal
) -> None:
    """A real process: its working directory is the tree, its branch the job's."""
    env = guard_env(small_fs)
    ws = Worktrees(workspace=lambda: small_fs, registry=journal, env=env)
    sched = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=lambda: LIMITS),
        parts=SchedulerParts(
            guard=Guard(env=env, workspace=small_fs), prepare=ws.prepare, reclaim_disk=ws.reclaim
        ),
        clocks=SchedulerClocks(cpu_percent=lambda: None),
    )
    sched.start()
    try:
        view = sched.submit(
            JobSpec(
                argv=["pwd; git rev-parse --abbrev-ref HEAD; ls"],
                shell=True,
                worktree=WorktreeRequest(str(repo)),
            )
        )
        done = sched.wait(view.id, timeout=60)
        assert done.state is JobState.EXITED, done.error
        where, branch, listing = Path(done.log_path).read_text().split("\n", 2)
        assert done.worktree is not None
        assert os.path.realpath(where) == os.path.realpath(done.worktree.path)
        assert branch == f"roomkeeper/{view.id}"
        assert "README" in listing
        assert git(where, "status", "--porcelain") == ""
    finally:
        sched.close(grace=0.5)


def test_a_lease_refused_for_disk_gets_one_reap_then_is_granted(
    tmp_path: Path, small_fs: Path, journal: Journal
) -> None:
    """Leases too: disk gets one reap to the guard's line before the refusal stands."""
    import asyncio
    from collections import deque

    from roomkeeper.gateway.leases import DurableLeases
    from roomkeeper.guard.lease_terms import LeaseTerms
    from roomkeeper.guard.leases import Leases
    from roomkeeper.loopback.hook_calls import HookRunner

    big = make_repo(tmp_path, big_file_mib=20)
    env = guard_env(small_fs, job_disk_mib=100)
    ws = Worktrees(workspace=lambda: small_fs, registry=journal, env=env)
    trees = []
    for i in range(3):
        view = job_view(f"old{i}", big)
        tree = ws.prepare(view)
        assert tree is not None
        trees.append(tree)
        record_ended(journal, record_running(journal, view, tree))
    fill(small_fs, leave_free=120 * MIB)  # 10 MiB short of 130 MiB
    guard = Guard(env=env, workspace=small_fs)
    hooks = HookRunner()
    leases = DurableLeases(
        leases=Leases(guard),
        guard=guard,
        journal=journal,
        refusals=deque(),
        closing=lambda: False,
        watch=lambda _: None,
        hooks=hooks,
        reclaim_disk=ws.reclaim_space,
    )
    try:
        terms = LeaseTerms(owner="o", memory_bytes=1, ttl_s=60)
        lease, decision, created = asyncio.run(leases.grant(None, terms, wait_s=0))
        assert lease is not None and created, decision
        assert [Path(t.path).is_dir() for t in trees] == [False, True, True]
    finally:
        hooks.close()


def test_a_scheduler_without_workspaces_never_runs_a_worktree_job_elsewhere(
    tmp_path: Path, small_fs: Path, repo: Path
) -> None:
    """No prepare given: the job fails saying so instead of running in some other directory."""
    recorder = Recorder()
    sched = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=lambda: LIMITS),
        parts=SchedulerParts(
            guard=Guard(env=guard_env(small_fs), workspace=small_fs), launcher=recorder
        ),
        clocks=SchedulerClocks(cpu_percent=lambda: None),
    )
    try:
        view = sched.submit(JobSpec(argv=["true"], worktree=WorktreeRequest(str(repo))))
        sched.tick()
        job = sched.get(view.id)
        assert job.state is JobState.FAILED and "makes no worktrees" in (job.error or "")
        assert recorder.events == []
    finally:
        sched.close(grace=0.1)

"""The scheduler with real trees: a real SIGKILL of its process, real deadlines, real memory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from roomkeeper.config import PressureSettings
from roomkeeper.guard.admission import Guard
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerParts, SchedulerSettings
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.relief.ladder import PressureReason
from tests.fakes import NO_DISK

# Every test here but the plain output one is marked `cgroups` too: CI runs
# them again on cgroup v2, where each tree has a v2 job group.
pytestmark = pytest.mark.kernel

MIB = 2**20
MB = 10**6

# A scheduler in its own process: two jobs, each with a child and a grandchild
# that called setsid (left the job's session and group).  It prints the pids
# and then waits to be killed.
SCHEDULER = """
import json, os, sys, time
from roomkeeper.guard.admission import Guard
from roomkeeper.jobs.spec import JobSpec
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerParts, SchedulerSettings
pids_dir = sys.argv[1]
s = Scheduler(
    SchedulerSettings(logs_dir=pids_dir + "/logs"),
    parts=SchedulerParts(guard=Guard(env={"ROOMKEEPER_JOB_DISK_MB": "0"})),
)
s.start()
line = ("sleep 60 & echo $! > {d}/$$.child; setsid sleep 60 & echo $! > {d}/$$.setsid; "
        "echo $$ > {d}/$$.leader; wait")
for owner in ("a", "b"):
    s.submit(JobSpec(argv=[line.format(d=pids_dir)], owner=owner, memory_bytes=1, shell=True))
print("ready", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


KILLED_WITHIN_S = 10.0


@pytest.mark.cgroups
def test_sigkill_of_the_scheduler_process_leaves_no_managed_tree(tmp_path: Path) -> None:
    """Every managed tree is gone after a real SIGKILL of the scheduler's process.

    The lifeline kills within 2 s on a quiet machine; 10 s are allowed, as a busy
    one (a CPU hog, two more test files and a Ray cluster beside it) once took
    longer than 2 s.
    """
    pids = tmp_path / "pids"
    pids.mkdir()
    started: list[int] = []
    # 100: the suite's own CPU load must not hold the second launch (the gate has its own test).
    env = {**os.environ, "ROOMKEEPER_CPU_PRESSURE_PERCENT": "100"}
    with subprocess.Popen(
        [sys.executable, "-c", SCHEDULER, str(pids)], stdout=subprocess.PIPE, text=True, env=env
    ) as proc:
        try:

            def written() -> list[Path]:  # a pid file exists a moment before its pid is in it
                return [p for p in pids.glob("*.*") if p.suffix != ".log" and p.read_text()]

            # An emulated kernel (CI's cgroup v2 VM) takes half a minute to start it all.
            deadline = time.monotonic() + 120
            while len(written()) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            started = [int(p.read_text()) for p in pids.glob("*.*") if p.suffix != ".log"]
            assert len(started) == 6, sorted(p.name for p in pids.iterdir())
            assert all(_alive(p) for p in started)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed_at = time.monotonic()
            while (
                any(_alive(p) for p in started) and time.monotonic() - killed_at < KILLED_WITHIN_S
            ):
                time.sleep(0.02)
            survivors = [p for p in started if _alive(p)]
            assert survivors == [], f"alive {time.monotonic() - killed_at:.2f} s after SIGKILL"
        finally:
            for pid in started:  # ours: never leave them behind, even when the test fails
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()


def limits(max_running: int = 4) -> Limits:
    return Limits(32, 8, max_running, 2, 100.0, 10)


@pytest.mark.cgroups
def test_real_deadline_stops_the_tree_and_reports_timed_out(tmp_path: Path) -> None:
    """A real job past its deadline is stopped, grandchild included, and ends as timed_out.

    The deadline leaves the shell time to start its grandchild on a slow, busy machine (an
    emulated VM beside other work took more than the 1 s it once had)."""
    marker = tmp_path / "grandchild"
    scheduler = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=limits, stop_grace=0.5),
        parts=SchedulerParts(guard=Guard(env=NO_DISK)),
    )
    scheduler.start()
    try:
        view = scheduler.submit(
            JobSpec(argv=[f"sleep 60 & echo $! > {marker}; wait"], shell=True, timeout_s=5.0)
        )
        final = scheduler.wait(view.id, timeout=45)
    finally:
        scheduler.close(grace=0.5)
    assert final.state is JobState.TIMED_OUT
    assert [t.state for t in final.history][-1] is JobState.TIMED_OUT
    assert not _alive(int(marker.read_text()))


def test_output_and_exit_code_of_a_real_job(tmp_path: Path) -> None:
    """argv runs without a shell; its output is kept in the log after it ends."""
    scheduler = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=limits),
        parts=SchedulerParts(guard=Guard(env=NO_DISK)),
    )
    scheduler.start()
    try:
        view = scheduler.submit(
            JobSpec(argv=[sys.executable, "-c", "import sys; print('out $HOME;'); sys.exit(4)"])
        )
        final = scheduler.wait(view.id, timeout=20)
    finally:
        scheduler.close()
    assert (final.state, final.exit_code) == (JobState.EXITED, 4)
    assert Path(final.log_path).read_text() == "out $HOME;\n"


HOLD = (
    "import time; b = bytearray({n}); b[::4096] = b'x' * len(b[::4096]); "
    "print('ready', flush=True); time.sleep(60)"
)


@pytest.mark.cgroups
def test_young_job_reserves_only_what_its_measured_footprint_does_not_show(tmp_path: Path) -> None:
    """A running job holding 200 MiB with a 300 MiB estimate reserves about 100 MiB."""
    guard = Guard(env=NO_DISK)
    scheduler = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=limits),
        parts=SchedulerParts(guard=guard),
    )
    try:
        holder = scheduler.submit(
            JobSpec(argv=[sys.executable, "-c", HOLD.format(n=200 * MIB)], memory_bytes=300 * MIB)
        )
        scheduler.tick()
        assert scheduler.get(holder.id).state is JobState.RUNNING
        assert guard.statistics().reserved_bytes == 300 * MIB
        # Once it has touched its memory (an emulated kernel takes seconds, not 1.5 s).
        log = Path(scheduler.get(holder.id).log_path)
        deadline = time.monotonic() + 60
        while "ready" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the holder never touched its memory"
            time.sleep(0.05)
        # A second job too big to fit makes a launch round, which measures young jobs first.
        scheduler.submit(JobSpec(argv=["true"], owner="b", memory_bytes=10**15))
        scheduler.tick()
        reserved = guard.statistics().reserved_bytes
    finally:
        scheduler.close(grace=0.5)
    assert 60 * MIB <= reserved <= 100 * MIB, reserved / MIB


@pytest.mark.cgroups
def test_failed_spawn_is_failed_and_releases_its_reservation(tmp_path: Path) -> None:
    """A missing executable ends the job as failed with the reason, and nothing stays reserved."""
    guard = Guard(env=NO_DISK)
    scheduler = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=limits),
        parts=SchedulerParts(guard=guard),
    )
    try:
        view = scheduler.submit(JobSpec(argv=["/no/such/program"]))
        scheduler.tick()
        final = scheduler.get(view.id)
    finally:
        scheduler.close()
    assert final.state is JobState.FAILED
    assert final.error and "/no/such/program" in final.error
    assert guard.statistics().young == 0


# A leader that dies of the SIGTERM at once, and a child that takes its time to go.
SLOW_CHILD = (
    "{py} -c 'import signal, sys, time; "
    "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0))); "
    'open(sys.argv[1], "w").close(); time.sleep(60)\' {marker} & wait'
)


@pytest.mark.cgroups
def test_a_stop_is_in_progress_until_the_whole_tree_is_gone(tmp_path: Path) -> None:
    """The relief ladder waits for a stopped tree, not its leader: the job is reaped when its
    leader dies, and the stop counts as still going until the last member is gone."""
    scheduler = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=limits, pressure=False),
        parts=SchedulerParts(guard=Guard(env=NO_DISK)),
    )
    scheduler.start()
    marker = tmp_path / "child-ready"
    try:
        view = scheduler.submit(
            JobSpec(argv=[SLOW_CHILD.format(py=sys.executable, marker=marker)], shell=True)
        )
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.02)
        assert not scheduler.relief.stop_in_progress()
        assert scheduler.relief.stop_for_pressure(view.id, "test", never_fits=False)
        final = scheduler.wait(view.id, timeout=20)  # reaped: its leader is gone
        assert final.state is JobState.STOPPED
        assert scheduler.relief.stop_in_progress()  # the child still holds on for 2 s
        while scheduler.relief.stop_in_progress():
            assert time.monotonic() < deadline + 30, "the stop never ended"
            time.sleep(0.05)
    finally:
        scheduler.close()


GROW = Path(__file__).resolve().parents[1] / "benchmarks" / "grow.py"


def _reruns(view: JobView) -> int:
    """How many times the job was queued again after a stop for memory pressure."""
    return sum(
        1
        for t in view.history
        if t.state is JobState.WAITING and t.reason is PressureReason.MEMORY_PRESSURE
    )


@pytest.mark.cgroups
def test_restartable_work_stopped_twice_while_growing_then_finishes(tmp_path: Path) -> None:
    """A job stated at 50 MB grows to 300 MB: stopped twice while growing, each re-run asks for
    more than the evidence showed (its peak, its growth, twice what failed), and its last
    allowed run finishes."""
    scheduler = Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path / "logs",
            limits=limits,
            pressure=False,  # the test takes the monitor's readings and its stops
            pressure_settings=lambda: PressureSettings(retries=2),
        ),
        parts=SchedulerParts(guard=Guard(env=NO_DISK)),
    )
    scheduler.start()
    grower = f"echo started; exec {sys.executable} {GROW} {300 * MB} 3 0.5"
    estimates, peaks = [], []
    try:
        view = scheduler.submit(
            JobSpec(argv=[grower], shell=True, memory_bytes=50 * MB, restartable=True)
        )
        for run in (1, 2):
            deadline = time.monotonic() + 120
            while True:  # read as the pressure monitor does: the guard learns its growth
                seen = {j.job_id: j.footprint for j in scheduler.relief.live_jobs()}
                if seen.get(view.id, 0) > 120 * MB:
                    break
                assert time.monotonic() < deadline, f"run {run} never grew"
                time.sleep(0.1)
            assert scheduler.relief.stop_for_pressure(view.id, "test", never_fits=False)
            while _reruns(again := scheduler.get(view.id)) < run:
                assert time.monotonic() < deadline, f"run {run} was never queued again"
                time.sleep(0.05)
            estimates.append(again.estimate_bytes)
            peaks.append(again.peak_bytes or 0)
        final = scheduler.wait(view.id, timeout=120)
    finally:
        scheduler.close(grace=0.5)
    assert (final.state, final.exit_code, _reruns(final)) == (JobState.EXITED, 0, 2), final
    assert Path(final.log_path).read_text() == "started\n" * 3
    assert all(120 * MB < p < 300 * MB for p in peaks), peaks  # each stopped while growing
    assert estimates[0] > peaks[0] + 50 * MB and estimates[0] >= 100 * MB, (estimates, peaks)
    assert estimates[1] >= 2 * estimates[0], estimates
    assert (final.peak_bytes or 0) >= 280 * MB  # the last run grew to its whole size

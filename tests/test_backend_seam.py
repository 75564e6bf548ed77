"""The backend seam on fakes: placement instead of the guard, and how remote trees settle.

A remote handle (the Ray backend's) can end without an exit status of its
own: refused by its node's guard (the job waits again, keeping its place),
lost with its node (``uncertain``, never re-run) or failed to start there.
Also the backend's variables, and that the local path never imports Ray.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from roomkeeper.config import read_backend_settings
from roomkeeper.errors import UsageError
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.rule import Decision, Reason
from roomkeeper.jobs.handle import RemoteEnd, Settlement
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.rounds import ASIDE_SECONDS
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import (
    SchedulerClocks,
    SchedulerListeners,
    SchedulerParts,
    SchedulerSettings,
)
from roomkeeper.jobs.spec import JobSpec, JobState, SchedulerReason
from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.processes.peaks import MemoryPeak, PeakMethod
from roomkeeper.testing import CannotSuspend, FakeClock


class FakeRemote(CannotSuspend):
    """A tree on another machine: no local pid, and an ending the test chooses."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.code: int | None = None
        self.settled: Settlement | None = None
        self.stopped = False
        self.closed = False

    local = False

    @property
    def pid(self) -> int | None:
        return None

    def poll(self) -> int | None:
        return self.code

    def settlement(self) -> Settlement | None:
        return self.settled

    def cpu_seconds(self) -> float | None:
        return None

    def footprint_bytes(self) -> int:
        return 0

    def peak(self) -> MemoryPeak:
        return MemoryPeak(7, PeakMethod.SAMPLED)

    def stop(self, grace: float = 5.0) -> int | None:
        self.stopped = True
        return None

    def close(self) -> None:
        self.closed = True

    def settle(self, end: RemoteEnd, reason: Reason | None, summary: str) -> None:
        self.settled, self.code = Settlement(end, reason, summary), -1


class Rig:
    """A scheduler whose launcher sends jobs "elsewhere" and whose placement the test sets."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.handles: dict[str, list[FakeRemote]] = {}
        self.placed: list[tuple[str, int]] = []
        self.refuse_placement = False
        self.aside: set[str] = set()  # jobs no node could hold
        self.cpu = 0.0
        self.guard_asked = 0
        self.told: list[tuple[str, str]] = []
        rig = self

        class CountingGuard(Guard):
            def admit(
                self, job_id: str, *, memory_bytes: int | None = None, disk_bytes: int | None = None
            ) -> Decision:
                rig.guard_asked += 1
                return Decision(job_id, True, Reason.OK, "room here")

        self.scheduler = Scheduler(
            SchedulerSettings(logs_dir=tmp_path, limits=lambda: Limits(32, 8, 4, 2, 100.0, 10)),
            parts=SchedulerParts(
                guard=CountingGuard(env={"ROOMKEEPER_JOB_MEMORY_MB": "64"}),
                launcher=self.launch,
                placement=self.place,
            ),
            listeners=SchedulerListeners(
                on_refusal=lambda job_id, d: self.told.append((job_id, d.summary))
            ),
            clocks=SchedulerClocks(cpu_percent=lambda: self.cpu, clock=self.clock, wall=self.clock),
        )

    def launch(self, job_id: str, spec: LaunchSpec) -> FakeRemote:
        handle = FakeRemote(spec)
        self.handles.setdefault(job_id, []).append(handle)
        return handle

    def place(self, job_id: str, memory_bytes: int) -> Decision:
        self.placed.append((job_id, memory_bytes))
        if job_id in self.aside:
            summary = "no node of the Ray cluster offers it; waiting for a larger node"
            return Decision(job_id, False, Reason.MEMORY, summary, aside=True)
        if self.refuse_placement:
            return Decision(job_id, False, Reason.MEMORY, "no node of the Ray cluster offers it")
        return Decision(job_id, True, Reason.OK, "a node has room")

    def last(self, job_id: str) -> FakeRemote:
        return self.handles[job_id][-1]


def test_the_placement_decides_instead_of_the_guard_with_the_estimate(tmp_path: Path) -> None:
    """Jobs that run elsewhere are placed, not judged by this container's guard."""
    rig = Rig(tmp_path)
    view = rig.scheduler.submit(JobSpec(["true"], timeout_s=30))
    rig.scheduler.tick()
    assert rig.placed == [(view.id, 64 * 1024 * 1024)]  # ROOMKEEPER_JOB_MEMORY_MB's default
    assert rig.guard_asked == 0
    spec = rig.last(view.id).spec
    assert spec.memory_bytes == 64 * 1024 * 1024
    assert spec.deadline_s == pytest.approx(30.0)
    assert rig.scheduler.get(view.id).state is JobState.RUNNING
    assert rig.scheduler.get(view.id).pid is None


def test_a_learned_size_reaches_the_placement_and_the_launch_alike(tmp_path: Path) -> None:
    """The estimate resolved at submission (here learned) is what placement judges and what
    the remote launch asks for: Ray's ``memory`` resource and the node guard's ask."""
    rig = Rig(tmp_path)
    learned = 5 * 1024 * 1024
    view = rig.scheduler.submit(JobSpec(["true"], learned_bytes=learned))
    rig.scheduler.tick()
    assert rig.placed == [(view.id, learned)]
    assert rig.last(view.id).spec.memory_bytes == learned  # not the 64 MiB default
    now = rig.scheduler.get(view.id)
    assert (now.estimate_bytes, now.estimate_source.value) == (learned, "learned")


def test_a_refused_placement_keeps_the_job_waiting_with_the_reason(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.refuse_placement = True
    view = rig.scheduler.submit(JobSpec(["true"]))
    rig.scheduler.tick()
    now = rig.scheduler.get(view.id)
    assert (now.state, now.reason) == (JobState.WAITING, Reason.MEMORY)
    assert "no node" in (rig.scheduler.statistics().last_refusal or "")
    assert view.id not in rig.handles
    # The gateway keeps what on_refusal is told for the Health page's recent refusals.
    assert rig.told == [(view.id, "no node of the Ray cluster offers it")]


def test_a_node_guard_refusal_puts_the_job_back_at_the_head_of_its_line(tmp_path: Path) -> None:
    """Refused on its node: it waits again, ahead of the owner's later jobs, then runs."""
    rig = Rig(tmp_path)
    first = rig.scheduler.submit(JobSpec(["true"]))
    rig.scheduler.tick()
    second = rig.scheduler.submit(JobSpec(["true"]))
    rig.refuse_placement = True  # so the second is not sent in the same round
    rig.last(first.id).settle(RemoteEnd.REFUSED, Reason.MEMORY, "node n1: no room")
    rig.scheduler.tick()
    view = rig.scheduler.get(first.id)
    assert (view.state, view.reason) == (JobState.WAITING, Reason.MEMORY)
    assert rig.last(first.id).closed
    assert rig.scheduler.statistics().refusals[Reason.MEMORY.value] >= 1
    assert (first.id, "node n1: no room") in rig.told
    rig.refuse_placement = False
    rig.scheduler.tick()
    assert rig.scheduler.get(first.id).state is JobState.RUNNING
    assert len(rig.handles[first.id]) == 2
    assert rig.placed[-2][0] == first.id  # ahead of the later job
    states = [t.state for t in rig.scheduler.get(first.id).history]
    assert states == [JobState.WAITING, JobState.RUNNING, JobState.WAITING, JobState.RUNNING]
    rig.last(first.id).code = 0
    rig.scheduler.tick()
    assert rig.scheduler.get(first.id).state is JobState.EXITED
    assert rig.scheduler.get(second.id).state is JobState.RUNNING


def test_a_lost_node_makes_the_job_uncertain_and_it_never_runs_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    view = rig.scheduler.submit(JobSpec(["true"]))
    rig.scheduler.tick()
    rig.last(view.id).settle(RemoteEnd.LOST, None, "the Ray node was lost mid-job")
    rig.scheduler.tick()
    rig.scheduler.tick()
    now = rig.scheduler.get(view.id)
    assert now.state is JobState.UNCERTAIN
    assert now.error == "the Ray node was lost mid-job"
    assert now.exit_code is None
    assert len(rig.handles[view.id]) == 1


def test_a_start_failure_on_the_node_fails_the_job(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    view = rig.scheduler.submit(JobSpec(["true"]))
    rig.scheduler.tick()
    rig.last(view.id).settle(RemoteEnd.FAILED, None, "node n1: 'nope' does not exist")
    rig.scheduler.tick()
    now = rig.scheduler.get(view.id)
    assert (now.state, now.error) == (JobState.FAILED, "node n1: 'nope' does not exist")


def test_a_refusal_after_a_cancel_ends_the_job_cancelled(tmp_path: Path) -> None:
    """Cancelled while its node judged it, then refused: it never ran, so it is cancelled."""
    rig = Rig(tmp_path)
    view = rig.scheduler.submit(JobSpec(["true"]))
    rig.scheduler.tick()
    rig.scheduler.cancel(view.id)
    rig.last(view.id).settle(RemoteEnd.REFUSED, Reason.MEMORY, "node n1: no room")
    rig.scheduler.tick()
    assert rig.scheduler.get(view.id).state is JobState.CANCELLED
    assert len(rig.handles[view.id]) == 1


def test_an_exit_of_a_remote_tree_is_an_exit(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    view = rig.scheduler.submit(JobSpec(["true"]))
    rig.scheduler.tick()
    assert not rig.last(view.id).local
    rig.last(view.id).code = 3
    rig.scheduler.tick()
    now = rig.scheduler.get(view.id)
    assert (now.state, now.exit_code, now.peak_bytes) == (JobState.EXITED, 3, 7)


# ------------------------------------------------------------- the variables


def test_the_backend_is_local_unless_ray_is_chosen() -> None:
    assert read_backend_settings({}).backend == "local"
    assert read_backend_settings({"ROOMKEEPER_BACKEND": " Local "}).backend == "local"
    chosen = read_backend_settings(
        {"ROOMKEEPER_BACKEND": "ray", "ROOMKEEPER_RAY_ADDRESS": "10.0.0.5:6379"}
    )
    assert (chosen.backend, chosen.ray_address, chosen.ray_job_cpus) == ("ray", "10.0.0.5:6379", 1)


@pytest.mark.parametrize(
    ("env", "name", "words"),
    [
        ({"ROOMKEEPER_BACKEND": "rya"}, "ROOMKEEPER_BACKEND", "local (the default) or ray"),
        ({"ROOMKEEPER_BACKEND": "ray"}, "ROOMKEEPER_RAY_ADDRESS", "it is unset"),
        (
            {"ROOMKEEPER_BACKEND": "ray", "ROOMKEEPER_RAY_ADDRESS": "head"},
            "ROOMKEEPER_RAY_ADDRESS",
            "HOST:PORT",
        ),
        (
            {"ROOMKEEPER_BACKEND": "ray", "ROOMKEEPER_RAY_ADDRESS": "head:99999"},
            "ROOMKEEPER_RAY_ADDRESS",
            "it is 'head:99999'",
        ),
    ],
)
def test_a_wrong_backend_variable_is_an_error_that_says_what_to_write(
    env: dict[str, str], name: str, words: str
) -> None:
    """No fall-back: a typo must not send every job to the wrong machines."""
    with pytest.raises(UsageError) as err:
        read_backend_settings(env)
    assert err.value.name == name
    assert words in str(err.value)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_local_path_never_imports_ray() -> None:
    done = _python(
        "import sys\n"
        "from roomkeeper.gateway.service import open_cluster\n"
        "import roomkeeper.api.app, roomkeeper.cli.app\n"
        "assert open_cluster({}) is None\n"
        "print('ray' in sys.modules)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_choosing_ray_without_it_says_how_to_install_it() -> None:
    done = _python(
        "import sys\n"
        "sys.modules['ray'] = None  # as if it were not installed\n"
        "from roomkeeper.gateway.service import open_cluster\n"
        "from roomkeeper.errors import UsageError\n"
        "try:\n"
        "    open_cluster({'ROOMKEEPER_BACKEND': 'ray', 'ROOMKEEPER_RAY_ADDRESS': 'h:1'})\n"
        "except UsageError as err:\n"
        "    print(err)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'roomkeeper[ray]'" in done.stdout


def test_a_runner_ended_to_stop_its_job_leaves_the_job_stopped(tmp_path: Path) -> None:
    """Cancelled before Ray placed its runner: the runner is ended, and the job is stopped."""
    rig = Rig(tmp_path)
    view = rig.scheduler.submit(JobSpec(["true"]))
    rig.scheduler.tick()
    rig.scheduler.cancel(view.id)
    rig.last(view.id).settle(RemoteEnd.LOST, None, "the runner was lost")
    rig.scheduler.tick()
    assert rig.scheduler.get(view.id).state is JobState.STOPPED


def test_a_head_that_does_not_answer_is_said_at_once() -> None:
    """Nothing listens at the address: a clear error, not ray.init's minutes of waiting."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    done = _python(
        "from roomkeeper.gateway.service import open_cluster\n"
        "from roomkeeper.errors import UsageError\n"
        "try:\n"
        "    open_cluster({'ROOMKEEPER_BACKEND': 'ray',\n"
        f"                  'ROOMKEEPER_RAY_ADDRESS': '127.0.0.1:{port}'}})\n"
        "except UsageError as err:\n"
        "    print(err)\n"
    )
    assert done.returncode == 0, done.stderr
    assert f"no Ray cluster answers at ROOMKEEPER_RAY_ADDRESS='127.0.0.1:{port}'" in done.stdout
    assert "ray start --head --port PORT" in done.stdout


def test_a_job_no_node_could_hold_waits_aside_and_the_jobs_behind_it_run(tmp_path: Path) -> None:
    """No head-of-line blocking: the jobs behind it, of its owner and of others, are placed
    in the same round; it keeps its reason, and is judged again after ASIDE_SECONDS."""
    rig = Rig(tmp_path)
    huge = rig.scheduler.submit(JobSpec(["true"], owner="a"))
    rig.aside.add(huge.id)
    mine = rig.scheduler.submit(JobSpec(["true"], owner="a"))
    theirs = rig.scheduler.submit(JobSpec(["true"], owner="b"))
    rig.scheduler.tick()
    assert rig.scheduler.get(mine.id).state is JobState.RUNNING
    assert rig.scheduler.get(theirs.id).state is JobState.RUNNING
    now = rig.scheduler.get(huge.id)
    assert (now.state, now.reason) == (JobState.WAITING, Reason.MEMORY)
    assert [p[0] for p in rig.placed].count(huge.id) == 1
    rig.scheduler.tick()
    assert [p[0] for p in rig.placed].count(huge.id) == 1  # aside: not judged every round
    assert rig.scheduler.get(huge.id).reason is Reason.MEMORY  # its own reason kept
    rig.aside.clear()  # a node large enough joined
    rig.clock.advance(ASIDE_SECONDS)
    rig.scheduler.tick()
    assert rig.scheduler.get(huge.id).state is JobState.RUNNING


def test_the_gateways_cpu_pressure_does_not_hold_jobs_placed_elsewhere(tmp_path: Path) -> None:
    """The CPU gate reads this machine's pressure: jobs on other nodes never wait for it."""
    rig = Rig(tmp_path)
    rig.cpu = 400.0  # far above the limit's 100 %
    first = rig.scheduler.submit(JobSpec(["true"], owner="a"))
    second = rig.scheduler.submit(JobSpec(["true"], owner="b"))
    rig.scheduler.tick()
    assert rig.scheduler.get(first.id).state is JobState.RUNNING
    assert rig.scheduler.get(second.id).state is JobState.RUNNING
    assert SchedulerReason.CPU.value not in rig.scheduler.statistics().refusals

"""The scheduler's rules on fakes: bounds, fairness, refusals, CPU, deadlines, cancellation."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

import roomkeeper.jobs.scheduler as scheduler_module
from roomkeeper.config import read_queue_settings, read_settings
from roomkeeper.errors import LaunchError, QueueFullError, UnknownJobError
from roomkeeper.guard.admission import Guard, Rerun
from roomkeeper.guard.lines import Reading
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.guard.rule import Decision, Reason
from roomkeeper.jobs.cores import WINDOW_S
from roomkeeper.jobs.queue import FairQueue, Limits
from roomkeeper.jobs.rounds import RETRY_SECONDS
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import (
    SchedulerClocks,
    SchedulerListeners,
    SchedulerParts,
    SchedulerSettings,
)
from roomkeeper.jobs.spec import JobSpec, JobState, JobView, SchedulerReason
from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.testing import FakeClock
from roomkeeper.units import GB
from tests.fakes import FakeHandle, fixture_guard


class FakeLauncher:
    """Records launches; can be told to fail a job's spawn."""

    def __init__(self) -> None:
        self.handles: dict[str, FakeHandle] = {}
        self.specs: dict[str, LaunchSpec] = {}  # each job's last launch
        self.order: list[str] = []
        self.fail: set[str] = set()
        self.make: type[FakeHandle] = FakeHandle

    def __call__(self, job_id: str, spec: LaunchSpec) -> FakeHandle:
        if job_id in self.fail:
            raise LaunchError(job_id, "executable 'nope' does not exist or cannot be run")
        handle = self.make(job_id)
        self.handles[job_id] = handle
        self.specs[job_id] = spec
        self.order.append(job_id)
        return handle

    def end(self, job_id: str, code: int = 0) -> None:
        self.handles[job_id].code = code


class ScriptedGuard(Guard):
    """A guard whose answer the test sets: admit everything, or refuse with a reason."""

    def __init__(self) -> None:
        super().__init__(env={})
        self.refuse: dict[str, Reason] = {}
        self.asked: list[str] = []
        self.released: list[str] = []
        self.ended_alone: list[str] = []  # released after running to their own end
        self.measured: dict[str, int] = {}
        self.asked_with: dict[str, tuple[int | None, MemoryPolicy]] = {}
        self.worst_case: dict[str, bool] = {}
        self.typical: dict[str, int | None] = {}
        self.before_answer: threading.Event | None = None
        self.judging = threading.Event()

    def admit(
        self,
        job_id: str,
        *,
        memory_bytes: int | None = None,
        disk_bytes: int | None = None,
        policy: MemoryPolicy = MemoryPolicy.STRICT,
        rerun: Rerun | None = None,
        worst_case: bool = False,
        typical_bytes: int | None = None,
    ) -> Decision:
        self.asked.append(job_id)
        self.asked_with[job_id] = (memory_bytes, policy)
        self.worst_case[job_id] = worst_case
        self.typical[job_id] = typical_bytes
        if self.before_answer is not None:
            self.judging.set()
            self.before_answer.wait(10)
        reason = self.refuse.get(job_id)
        if reason is not None:
            return Decision(job_id, False, reason, f"no room for {reason.value}")
        return Decision(job_id, True, Reason.OK, "room")

    def release(self, job_id: str, *, ended_alone: bool = False) -> None:
        self.released.append(job_id)
        if ended_alone:
            self.ended_alone.append(job_id)

    def growth_rate(self, job_id: str) -> float:
        return 0.0

    def report_measured(self, job_id: str, measured_bytes: int) -> None:
        self.measured[job_id] = measured_bytes


def limits(**over: int | float | None) -> Limits:
    base = {
        "max_waiting": 32,
        "max_waiting_per_owner": 8,
        "max_running": 4,
        "max_running_per_owner": 2,
        "cpu_pressure_percent": 80.0,
        "worker_nice": 10,
    }
    base.update(over)
    return Limits(**base)  # type: ignore[arg-type]


class Rig:
    """A scheduler on fakes, with knobs."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        before_launch: Callable[[JobView], None] | None = None,
        **over: int | float | None,
    ) -> None:
        self.clock = FakeClock()
        self.guard = ScriptedGuard()
        self.launcher = FakeLauncher()
        self.cpu: float | None = None
        self.cores = 2
        self.limits = limits(**over)
        self.events: list[tuple[str, JobState]] = []
        self.scheduler = Scheduler(
            SchedulerSettings(logs_dir=tmp_path / "logs", limits=lambda: self.limits),
            parts=SchedulerParts(guard=self.guard, launcher=self.launcher),
            listeners=SchedulerListeners(
                on_change=lambda v: self.events.append((v.id, v.state)),
                before_launch=before_launch,
            ),
            clocks=SchedulerClocks(
                cpu_percent=lambda: self.cpu, clock=self.clock, cores=lambda: self.cores
            ),
        )

    def submit(self, job_id: str, owner: str = "a", **kw: object) -> None:
        self.scheduler.submit(JobSpec(argv=["true"], owner=owner, **kw), job_id=job_id)  # type: ignore[arg-type]

    def state(self, job_id: str) -> JobState:
        return self.scheduler.get(job_id).state


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.scheduler.close(grace=0)


def test_waiting_bounds_refuse_at_once_with_a_reason(tmp_path: Path) -> None:
    """Past 8 per owner: owner_queue_full; past 32 in all: queue_full; never queued silently."""
    r = Rig(tmp_path)
    for i in range(8):
        r.submit(f"a{i}", owner="a")
    with pytest.raises(
        QueueFullError, match="ROOMKEEPER_MAX_WAITING_PER_OWNER allows \\(8\\)"
    ) as err:
        r.submit("a8", owner="a")
    assert err.value.reason == "owner_queue_full" and err.value.owner == "a"
    for owner in "bcd":
        for i in range(8):
            r.submit(f"{owner}{i}", owner=owner)
    with pytest.raises(QueueFullError, match="ROOMKEEPER_MAX_WAITING allows \\(32\\)") as err:
        r.submit("e0", owner="e")
    assert err.value.reason == "queue_full"
    assert len(r.scheduler.jobs()) == 32
    with pytest.raises(UnknownJobError):
        r.scheduler.get("a8")
    r.scheduler.close(grace=0)


def test_running_ceilings_global_and_per_owner(rig: Rig) -> None:
    """At most 4 run in all and 2 per owner; the rest wait with the reason that holds them."""
    for owner in "abc":
        for i in range(3):
            rig.submit(f"{owner}{i}", owner=owner)
    rig.scheduler.tick()
    stats = rig.scheduler.statistics()
    assert stats.running == 4
    assert all(running <= 2 for _, running in stats.by_owner.values())
    assert rig.scheduler.get("c2").reason is SchedulerReason.SLOTS


def test_the_guard_is_asked_with_each_jobs_policy_and_its_stated_or_learned_size(
    rig: Rig,
) -> None:
    """A stated size wins over a learned one; each job's memory policy reaches the guard, and a
    job with neither is asked with its command shape's typical peak."""
    rig.submit("stated", memory_bytes=5, learned_bytes=9, memory_policy=MemoryPolicy.PACK)
    rig.submit("learned", owner="b", learned_bytes=9)
    rig.submit("default", owner="c", shape_bytes=7, memory_policy=MemoryPolicy.PACK)
    rig.scheduler.tick()
    assert rig.guard.asked_with == {
        "stated": (5, MemoryPolicy.PACK),
        "learned": (9, MemoryPolicy.STRICT),
        "default": (None, MemoryPolicy.PACK),
    }
    # Its shape's typical peak reaches the guard beside the default, as a guess of its trial.
    assert rig.guard.typical == {"stated": None, "learned": None, "default": 7}
    views = {v.id: v for v in rig.scheduler.jobs()}
    assert [views[j].estimate_source.value for j in ("stated", "learned", "default")] == [
        "stated",
        "learned",
        "default",
    ]
    assert views["learned"].estimate_bytes == 9
    assert views["default"].estimate_bytes == read_settings({}).job_memory_bytes


def test_owner_rotation_shares_slots(rig: Rig) -> None:
    """With one slot, launches alternate between owners instead of serving one owner's backlog."""
    rig.limits = limits(max_running=1)
    for i in range(4):
        rig.submit(f"a{i}", owner="a")
    rig.submit("b0", owner="b")
    rig.submit("c0", owner="c")
    for _ in range(6):
        rig.scheduler.tick()
        running = [j.id for j in rig.scheduler.jobs() if j.state is JobState.RUNNING]
        for job_id in running:
            rig.launcher.end(job_id)
    assert rig.launcher.order == ["a0", "b0", "c0", "a1", "a2", "a3"]


def test_per_owner_cap_skips_to_the_next_owner(rig: Rig) -> None:
    """An owner at its running cap does not block another owner's launch."""
    for i in range(3):
        rig.submit(f"a{i}", owner="a")
    rig.submit("b0", owner="b")
    rig.scheduler.tick()
    assert set(rig.launcher.order) == {"a0", "a1", "b0"}
    assert rig.scheduler.get("a2").reason is SchedulerReason.OWNER_SLOTS


def test_a_refusal_ends_the_round_and_the_refused_job_keeps_its_place(rig: Rig) -> None:
    """A refused big job is not overtaken by smaller ones; it launches first when room returns."""
    rig.submit("big", owner="a", memory_bytes=10**10)
    rig.submit("small", owner="b", memory_bytes=1)
    rig.guard.refuse["big"] = Reason.MEMORY
    for _ in range(5):
        rig.scheduler.tick()
    assert rig.launcher.order == []
    assert rig.scheduler.get("big").reason is Reason.MEMORY
    assert rig.scheduler.get("small").reason is Reason.MEMORY  # held behind the refusal
    del rig.guard.refuse["big"]
    rig.scheduler.tick()
    assert rig.launcher.order == ["big", "small"]


def test_refusals_are_counted_not_recorded_as_state_changes(rig: Rig) -> None:
    """Refused rounds update counters and the waiting reason; history gets no row per round."""
    rig.submit("big")
    rig.guard.refuse["big"] = Reason.DISK
    for _ in range(10):
        rig.scheduler.tick()
    view = rig.scheduler.get("big")
    assert [t.state for t in view.history] == [JobState.WAITING]
    assert view.reason is Reason.DISK
    assert rig.scheduler.statistics().refusals == {"disk": 10}
    assert rig.events == [("big", JobState.WAITING)]


class _CountedCpu(FakeHandle):
    """A tree whose CPU seconds the test sets."""

    def __init__(self, job_id: str, footprint: int = 0) -> None:
        super().__init__(job_id, footprint)
        self.cpu = 0.0

    def cpu_seconds(self) -> float | None:
        return self.cpu


def _cores_rig(tmp_path: Path, *job_ids: str) -> Rig:
    """A rig whose rounds hold jobs while the running ones keep every core busy (a batch
    given no count), its jobs' CPU set by the test, with ``job_ids`` submitted."""
    rig = Rig(tmp_path, cpu_pressure_percent=None, max_running_per_owner=None)
    rig.limits = replace(rig.limits, until_cores_free=True)
    rig.launcher.make = _CountedCpu
    for job_id in job_ids:
        rig.submit(job_id)
    return rig


def test_without_a_count_a_job_waits_while_running_ones_keep_every_core_busy(
    tmp_path: Path,
) -> None:
    """Two jobs each keeping a core busy fill two cores: the third waits (reason cpu) until
    one of them leaves its core, and a job not yet measured counts as a whole core."""
    rig = _cores_rig(tmp_path, "a", "b", "c")
    try:
        rig.scheduler.tick()
        assert rig.launcher.order == ["a", "b"]  # two fresh jobs: two cores, taken as busy
        assert rig.scheduler.get("c").reason is SchedulerReason.CPU
        a, b = (cast(_CountedCpu, rig.launcher.handles[j]) for j in ("a", "b"))
        rig.clock.advance(0.6)
        a.cpu, b.cpu = 0.6, 0.6  # a core each, measured
        rig.scheduler.tick()
        assert rig.launcher.order == ["a", "b"]
        rig.clock.advance(0.6)
        a.cpu, b.cpu = 1.2, 0.66  # b now waits on something else: a tenth of a core
        rig.scheduler.tick()
        assert rig.launcher.order == ["a", "b", "c"]
    finally:
        rig.scheduler.close(grace=0)


def test_a_round_the_cores_held_is_tried_again_when_a_running_jobs_window_closes(
    tmp_path: Path,
) -> None:
    """A line held by busy cores is judged again when the first open window of a running job
    closes (a few milliseconds past it), not at the half second a refused round waits: that
    would find the window still open by a hair and wait half a second more, and a batch's
    first lines wait on it.  Once the round ends on the guard's refusal instead, it waits the
    half second again."""
    rig = _cores_rig(tmp_path, "a", "b", "c", "d")
    rig.guard.refuse["d"] = Reason.MEMORY
    try:
        assert WINDOW_S < rig.scheduler.tick() < WINDOW_S + 0.01
        assert rig.scheduler.get("c").reason is SchedulerReason.CPU
        rig.clock.advance(0.2)  # held again meanwhile: the windows close 0.3 s from here
        assert 0.3 < rig.scheduler.tick() < 0.31
        a, b = (cast(_CountedCpu, rig.launcher.handles[j]) for j in ("a", "b"))
        rig.clock.advance(0.3 + 0.005)
        a.cpu = b.cpu = WINDOW_S * 0.1  # both wait on something else
        assert rig.scheduler.tick() == RETRY_SECONDS  # c started (a core); d refused for memory
        assert rig.launcher.order == ["a", "b", "c"]
        assert rig.scheduler.get("d").reason is Reason.MEMORY
    finally:
        rig.scheduler.close(grace=0)


def test_a_round_ended_by_another_bound_after_the_cores_held_waits_the_half_second(
    tmp_path: Path,
) -> None:
    """What held the last round is not what holds this one: a round the running bound ends
    before the cores are judged waits the half second of any held round."""
    rig = _cores_rig(tmp_path, "a", "b", "c")
    try:
        assert WINDOW_S < rig.scheduler.tick() < WINDOW_S + 0.01  # held by the cores
        rig.limits = replace(rig.limits, max_running=2)
        assert rig.scheduler.tick() == RETRY_SECONDS
        assert rig.scheduler.get("c").reason is SchedulerReason.SLOTS
    finally:
        rig.scheduler.close(grace=0)


def test_a_round_cpu_pressure_held_waits_the_half_second(rig: Rig) -> None:
    """CPU pressure is a ten-second average, read at most every quarter second: a round it
    held is tried again after the half second of any refused round, not sooner."""
    rig.cpu = 95.0
    rig.submit("a0", owner="a")
    rig.submit("b0", owner="b")
    assert rig.scheduler.tick() == RETRY_SECONDS
    assert rig.scheduler.get("b0").reason is SchedulerReason.CPU


def test_cores_hold_nothing_when_a_count_was_given_or_nothing_runs(tmp_path: Path) -> None:
    """With a count (the default limits), busy cores hold nothing; with the rule on and one
    core, the first job starts all the same (nothing of ours runs)."""
    counted = Rig(tmp_path / "counted", cpu_pressure_percent=None, max_running_per_owner=None)
    counted.launcher.make = _CountedCpu
    alone = Rig(tmp_path / "alone", cpu_pressure_percent=None, max_running_per_owner=None)
    alone.limits = replace(alone.limits, until_cores_free=True)
    alone.cores = 1
    alone.launcher.make = _CountedCpu
    try:
        for job_id in ("a", "b", "c"):
            counted.submit(job_id)
            alone.submit(job_id)
        counted.scheduler.tick()
        alone.scheduler.tick()
        assert counted.launcher.order == ["a", "b", "c"]
        assert alone.launcher.order == ["a"]
    finally:
        counted.scheduler.close(grace=0)
        alone.scheduler.close(grace=0)


def test_cpu_pressure_holds_launches_but_never_below_one_running(rig: Rig) -> None:
    """Above ROOMKEEPER_CPU_PRESSURE_PERCENT no new launch, unless nothing runs; reason cpu."""
    rig.cpu = 95.0
    rig.submit("a0", owner="a")
    rig.submit("b0", owner="b")
    rig.scheduler.tick()
    assert rig.launcher.order == ["a0"]  # nothing ran: one may start
    assert rig.scheduler.get("b0").reason is SchedulerReason.CPU
    rig.cpu = 79.0
    rig.scheduler.tick()
    assert rig.launcher.order == ["a0"]  # read at most every 0.25 s: still the old reading
    rig.clock.advance(0.25)
    rig.scheduler.tick()
    assert rig.launcher.order == ["a0", "b0"]


def test_no_cpu_gate_launches_at_any_cpu_pressure(tmp_path: Path) -> None:
    """Limits without a CPU pressure percentage (a batch unless asked) never wait for CPU."""
    r = Rig(tmp_path, cpu_pressure_percent=None)
    try:
        r.cpu = 100.0
        for i in range(3):
            r.submit(f"a{i}", owner="a")
        r.scheduler.tick()
        assert r.launcher.order == ["a0", "a1"]  # only the per-owner cap of 2 stops the third
        assert r.scheduler.get("a2").reason is SchedulerReason.OWNER_SLOTS
    finally:
        r.scheduler.close(grace=0)


def test_waiting_past_the_deadline_expires_without_starting(rig: Rig) -> None:
    """Waiting time counts toward timeout_s: a job still waiting at its deadline is expired."""
    rig.submit("w", timeout_s=30)
    rig.guard.refuse["w"] = Reason.MEMORY
    rig.scheduler.tick()
    rig.clock.advance(29.9)
    rig.scheduler.tick()
    assert rig.state("w") is JobState.WAITING
    rig.clock.advance(0.1)
    rig.scheduler.tick()
    assert rig.state("w") is JobState.EXPIRED
    assert rig.launcher.order == []


def test_running_past_the_deadline_is_stopped_and_timed_out(rig: Rig) -> None:
    """A running job past its deadline has its tree stopped and ends as timed_out."""
    rig.submit("r", timeout_s=10)
    rig.clock.advance(4)  # waited 4 s first: 6 s of running are left
    rig.scheduler.tick()
    rig.clock.advance(5.9)
    rig.scheduler.tick()
    assert rig.state("r") is JobState.RUNNING
    rig.clock.advance(0.1)
    rig.scheduler.tick()
    rig.scheduler.close(grace=0)
    view = rig.scheduler.get("r")
    assert view.state is JobState.TIMED_OUT
    assert rig.launcher.handles["r"].stopped_with is not None


def test_cancel_while_being_judged_removes_the_permission_to_launch(rig: Rig) -> None:
    """A cancel that lands between the guard's yes and the spawn wins: the job never starts."""
    rig.submit("j")
    rig.guard.before_answer = threading.Event()
    round_thread = threading.Thread(target=rig.scheduler.tick)
    round_thread.start()
    assert rig.guard.judging.wait(5)
    view = rig.scheduler.cancel("j")
    rig.guard.before_answer.set()
    round_thread.join(5)
    assert view.state is JobState.CANCELLED
    assert rig.launcher.order == []
    assert rig.state("j") is JobState.CANCELLED
    assert rig.guard.released.count("j") >= 1


def test_cancel_of_a_running_job_stops_its_tree(rig: Rig) -> None:
    """Cancelling a running job stops the tree and ends it as stopped."""
    rig.submit("j")
    rig.scheduler.tick()
    rig.scheduler.cancel("j")
    rig.scheduler.close(grace=0)
    assert rig.state("j") is JobState.STOPPED
    assert rig.launcher.handles["j"].closed


def test_reservations_are_released_whatever_the_outcome(rig: Rig) -> None:
    """Exit, failed spawn, cancel and stop all release the job's young reservation."""
    rig.launcher.fail.add("bad")
    for job_id in ("ok", "bad", "stop"):
        rig.submit(job_id, owner=job_id)
    rig.scheduler.tick()
    rig.launcher.end("ok", 3)
    rig.scheduler.cancel("stop")
    rig.scheduler.close(grace=0)
    assert {"ok", "bad", "stop"} <= set(rig.guard.released)
    # Only the job that ran to its own end (exit 3 is its own end) teaches what work holds.
    assert rig.guard.ended_alone == ["ok"]
    bad = rig.scheduler.get("bad")
    assert bad.state is JobState.FAILED and "does not exist" in (bad.error or "")
    ok = rig.scheduler.get("ok")
    assert (ok.state, ok.exit_code) == (JobState.EXITED, 3)


def test_young_jobs_report_their_measured_footprint(rig: Rig) -> None:
    """Before each judgement, running jobs' measured footprints go to the guard."""
    rig.submit("first", owner="a")
    rig.scheduler.tick()
    rig.launcher.handles["first"].footprint = 123_456_789
    rig.submit("second", owner="b")
    rig.scheduler.tick()
    assert rig.guard.measured["first"] == 123_456_789


def test_every_state_change_has_a_timestamp(rig: Rig) -> None:
    """waiting -> running -> exited, each with a time, and the exit code kept."""
    rig.submit("j")
    rig.scheduler.tick()
    rig.launcher.end("j", 0)
    rig.scheduler.tick()
    view = rig.scheduler.get("j")
    assert [t.state for t in view.history] == [JobState.WAITING, JobState.RUNNING, JobState.EXITED]
    assert all(t.at > 0 for t in view.history)
    assert view.history[0].at <= view.history[1].at <= view.history[2].at
    assert rig.events == [("j", JobState.WAITING), ("j", JobState.RUNNING), ("j", JobState.EXITED)]


def test_bad_specs_are_refused_with_a_reason(rig: Rig) -> None:
    """An empty argv or a zero timeout is a usage error that says what was wrong."""
    from roomkeeper.errors import UsageError

    with pytest.raises(UsageError, match="non-empty list"):
        rig.scheduler.submit(JobSpec(argv=[]))
    with pytest.raises(UsageError, match="timeout_s must be > 0"):
        rig.scheduler.submit(JobSpec(argv=["x"], timeout_s=0))


def test_an_owner_refused_at_its_bound_leaves_no_line_outside_the_turn() -> None:
    """A refusal by the per-owner bound creates no empty line; forgetting idle owners then
    has nothing it cannot find in the rotation."""
    queue: FairQueue[str] = FairQueue()
    limits = Limits(10, 0, 4, 2, 80.0, 10)
    with pytest.raises(QueueFullError) as refused:
        queue.require_room("late", limits)
    assert refused.value.reason == "owner_queue_full"
    assert queue.owners() == set()
    queue.forget_idle(busy=set())
    queue.push("early", "job-1")
    assert list(queue.heads()) == [("early", "job-1")]


def test_waiting_bounds_below_one_are_refused_with_the_rule() -> None:
    """0 waiting would refuse every submission: the default stays and the rule is said."""
    s = read_queue_settings(
        {"ROOMKEEPER_MAX_WAITING": "0", "ROOMKEEPER_MAX_WAITING_PER_OWNER": "0"}
    )
    assert (s.max_waiting, s.max_waiting_per_owner) == (32, 8)


def test_waiting_bounds_take_large_values() -> None:
    """A large waiting bound is a choice, not a mistake."""
    s = read_queue_settings({"ROOMKEEPER_MAX_WAITING": "20000"})
    assert s.max_waiting == 20000


def test_a_pending_release_hook_holds_only_its_own_jobs_memory(tmp_path: Path) -> None:
    """While an ended job's hook is pending, its estimate stays reserved; launches go on;
    when the hook resolves the memory is offered again."""
    import concurrent.futures

    guard = Guard(env={"ROOMKEEPER_GUARD": "off"})
    launcher = FakeLauncher()
    hook: concurrent.futures.Future[str] = concurrent.futures.Future()
    scheduler = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=limits),
        parts=SchedulerParts(guard=guard, launcher=launcher),
        listeners=SchedulerListeners(on_end=lambda view: hook if view.id == "hooked" else None),
        clocks=SchedulerClocks(cpu_percent=lambda: None),
    )
    try:
        scheduler.submit(JobSpec(argv=["true"], owner="a", memory_bytes=300), job_id="hooked")
        scheduler.tick()
        guard.release("hooked")  # as if its warm-up had ended: only the hook's hold is left
        launcher.end("hooked")
        scheduler.tick()
        assert scheduler.get("hooked").state is JobState.EXITED
        assert guard.statistics().reserved_bytes == 300  # held for its hook
        scheduler.submit(JobSpec(argv=["true"], owner="b", memory_bytes=0), job_id="next")
        scheduler.tick()
        assert "next" in launcher.order  # nothing else waits for the hook
        hook.set_result("ok 204")
        assert guard.statistics().reserved_bytes == 0
    finally:
        scheduler.close(grace=0)


def test_building_or_closing_a_scheduler_moves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler built and closed unused changes nothing outside it; start() (or a first
    launch) makes this process a subreaper and sets up job groups, once."""
    from roomkeeper.jobs import rounds

    calls: list[str] = []
    monkeypatch.setattr(rounds, "become_subreaper", lambda: calls.append("subreaper"))
    monkeypatch.setattr(rounds, "prepare_job_groups", lambda: calls.append("job groups"))
    unused = Scheduler(SchedulerSettings(logs_dir=tmp_path / "a", pressure=False))
    unused.close()
    assert calls == []
    started = Scheduler(SchedulerSettings(logs_dir=tmp_path / "b", pressure=False))
    try:
        started.prepare()
        started.start()
        assert calls == ["subreaper", "job groups"]
    finally:
        started.close()


class DeafHandle(FakeHandle):
    """A tree that never ends, whatever it is sent (a stuck process, a node gone silent)."""

    def stop(self, grace: float = 5.0) -> int | None:
        self.stopped_with = grace
        return None


def test_closing_ends_within_its_deadline_when_a_tree_never_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C and shutdown close the scheduler: a tree that never reports its end must not
    hold them for ever; closing gives up after the stop grace and its margin, and says so."""
    monkeypatch.setattr(scheduler_module, "CLOSE_MARGIN_S", 0.5)
    rig = Rig(tmp_path)
    rig.launcher.make = DeafHandle
    rig.submit("stuck")
    rig.scheduler.tick()
    assert rig.state("stuck") is JobState.RUNNING
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="roomkeeper"):
        closing = threading.Thread(target=rig.scheduler.close, kwargs={"grace": 0.2}, daemon=True)
        closing.start()
        closing.join(timeout=30)  # before closing had a deadline, it never returned
        assert not closing.is_alive()
    took = time.monotonic() - started
    assert took < 10, f"closing took {took:.1f} s, its deadline is 0.7 s"  # slack for a busy CI
    assert rig.launcher.handles["stuck"].stopped_with == 0.2
    assert "did not end within 0.7 s of their stop (stuck)" in caplog.text


def test_a_rerun_asks_with_its_forecast_and_its_last_run_with_the_worst_case(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a stop for pressure, the guard is asked with the grown estimate as a forecast; the
    last allowed run (ROOMKEEPER_PRESSURE_RETRIES=2) with every young job's worst case."""
    monkeypatch.setenv("ROOMKEEPER_PRESSURE_RETRIES", "2")
    rig.submit("j", memory_bytes=100, restartable=True)
    asked: list[tuple[bool, bool]] = []
    original = rig.guard.admit

    def admit(job_id: str, **kw: Any) -> Decision:
        asked.append((kw.get("rerun") is not None, kw.get("worst_case", False)))
        return original(job_id, **kw)

    monkeypatch.setattr(rig.guard, "admit", admit)
    for _ in range(3):
        rig.scheduler.tick()
        assert rig.state("j") is JobState.RUNNING
        rig.scheduler.relief.stop_for_pressure("j", "test", never_fits=False)
        rig.launcher.end("j", -15)
        rig.scheduler.tick()
    assert asked == [(False, False), (True, False), (True, True)]
    assert rig.scheduler.get("j").state is JobState.STOPPED  # no fourth run


def test_each_launch_says_whether_a_stop_would_queue_the_job_again(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher whose nodes run the ladder is told whether a stop for pressure would queue
    the job again: restartable work with re-runs left (ROOMKEEPER_PRESSURE_RETRIES=2), not
    its last run, never work that is not restartable."""
    monkeypatch.setenv("ROOMKEEPER_PRESSURE_RETRIES", "2")
    rig.submit("j", memory_bytes=100, restartable=True)
    rig.submit("once", owner="b", memory_bytes=100)
    runs_again = []
    for _ in range(3):
        rig.scheduler.tick()
        runs_again.append(rig.launcher.specs["j"].runs_again)
        rig.scheduler.relief.stop_for_pressure("j", "test", never_fits=False)
        rig.launcher.end("j", -15)
        rig.scheduler.tick()
    assert runs_again == [True, True, False]
    assert rig.launcher.specs["once"].runs_again is False


class HeldSave:
    """A ``before_launch`` save that lasts until the test lets it end (a slow disk)."""

    def __init__(self, rig: Rig | None = None) -> None:
        self.rig = rig
        self.entered = threading.Event()
        self.go = threading.Event()
        self.changes_before_end = -1  # how many changes were handed on when the save ended

    def __call__(self, view: JobView) -> None:
        self.entered.set()
        assert self.go.wait(10), "the test never let the save end"
        if self.rig is not None:
            self.changes_before_end = len(self.rig.events)


def _waiting_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within 10 s"
        time.sleep(0.005)


def test_the_monitor_reads_on_time_while_a_launch_marker_is_saved(tmp_path: Path) -> None:
    """A launch whose pending marker is slow to save never holds the scheduler's lock
    meanwhile: the pressure monitor's readings, which take it, go on."""
    guard, _ = fixture_guard(tmp_path, used=1 * GB)
    read_at: list[float] = []
    read = guard.pressure_reading

    def timed_read() -> Reading | None:
        read_at.append(time.monotonic())
        return read()

    guard.pressure_reading = timed_read  # type: ignore[method-assign]
    saved: list[float] = []
    launcher = FakeLauncher()

    def slow_save(view: JobView) -> None:
        saved.append(time.monotonic())
        # The save lasts until five readings were taken meanwhile (10 s at most): on a busy
        # machine readings come late, but they come only if the save holds no lock of theirs.
        deadline = time.monotonic() + 10
        while sum(t > saved[0] for t in read_at) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert launcher.order == []  # save first: nothing starts before its marker is saved
        saved.append(time.monotonic())

    scheduler = Scheduler(
        SchedulerSettings(logs_dir=tmp_path / "logs", limits=limits, monitor_interval=0.05),
        parts=SchedulerParts(guard=guard, launcher=launcher),
        listeners=SchedulerListeners(before_launch=slow_save),
    )
    scheduler.start()
    try:
        scheduler.submit(JobSpec(argv=["true"], memory_bytes=GB // 10), job_id="j")
        _waiting_for(lambda: scheduler.get("j").state is JobState.RUNNING, "the launch")
    finally:
        scheduler.close(grace=0)
    began, ended = saved
    during = [t for t in read_at if began < t < ended]
    assert len(during) >= 5, f"{len(during)} readings in the {ended - began:.1f} s of the save"
    assert launcher.order == ["j"]


def test_a_cancel_while_the_marker_is_saved_wins_and_is_handed_on_after_the_save(
    tmp_path: Path,
) -> None:
    """A cancel that lands while the pending marker is saved (outside the lock) wins: the job
    never starts, and its end is handed on after the save, so the journal's outcome comes
    after the marker and clears it."""
    save = HeldSave()
    rig = Rig(tmp_path, before_launch=save)
    save.rig = rig
    rig.submit("j")
    launching = threading.Thread(target=rig.scheduler.tick)
    launching.start()
    assert save.entered.wait(5)
    answers: list[JobView] = []
    cancelling = threading.Thread(target=lambda: answers.append(rig.scheduler.cancel("j")))
    cancelling.start()
    _waiting_for(lambda: "j" in rig.guard.released, "the cancel")  # its reservation goes at once
    save.go.set()
    launching.join(5)
    cancelling.join(5)
    rig.scheduler.close(grace=0)
    assert [a.state for a in answers] == [JobState.CANCELLED]  # answered once it is settled
    assert rig.launcher.order == []
    assert rig.state("j") is JobState.CANCELLED
    assert rig.events.index(("j", JobState.CANCELLED)) >= save.changes_before_end >= 0


def test_closing_while_the_marker_is_saved_cancels_the_job_for_the_shutdown(
    tmp_path: Path,
) -> None:
    """A shutdown that lands while a launch's marker is saved ends that job cancelled for
    ``shutdown`` once the save is done; it never starts."""
    save = HeldSave()
    rig = Rig(tmp_path, before_launch=save)
    rig.submit("j")
    launching = threading.Thread(target=rig.scheduler.tick)
    launching.start()
    assert save.entered.wait(5)
    closing = threading.Thread(target=rig.scheduler.close, kwargs={"grace": 0})
    closing.start()

    def closed() -> bool:
        try:
            rig.scheduler.submit(JobSpec(argv=["true"], owner="b"))
        except QueueFullError as err:
            return err.reason == "closing"
        return False

    _waiting_for(closed, "the shutdown")
    save.go.set()
    launching.join(5)
    closing.join(10)
    assert not closing.is_alive()
    view = rig.scheduler.get("j")
    assert (view.state, view.reason) == (JobState.CANCELLED, SchedulerReason.SHUTDOWN)
    assert rig.launcher.order == []


def test_a_deadline_passed_while_the_marker_is_saved_expires_the_job(tmp_path: Path) -> None:
    """A job whose deadline passes while its marker is saved expires instead of starting."""
    save = HeldSave()
    rig = Rig(tmp_path, before_launch=save)
    rig.submit("j", timeout_s=5.0)
    launching = threading.Thread(target=rig.scheduler.tick)
    launching.start()
    assert save.entered.wait(5)
    rig.clock.advance(6.0)
    save.go.set()
    launching.join(5)
    rig.scheduler.close(grace=0)
    assert rig.state("j") is JobState.EXPIRED
    assert rig.launcher.order == []

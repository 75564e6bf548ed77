"""The relief ladder on a fake clock: each step, its thresholds, the cooldown, progress, retries."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from roomkeeper.config import PressureSettings
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.lines import Reading
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerClocks, SchedulerParts, SchedulerSettings
from roomkeeper.jobs.spec import EstimateSource, JobSpec, JobState
from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.processes.peaks import MemoryPeak, PeakMethod
from roomkeeper.relief.cooldown import Cooldown, CooldownCause
from roomkeeper.relief.ladder import LadderState, Live, Plan, PressureReason, Step, decide
from roomkeeper.relief.monitor import MonitorPace, PressureMonitor
from roomkeeper.testing import CannotSuspend, FakeClock
from tests.fakes import NO_DISK, FakeTarget
from tests.kernel_files import Level, v2_tree

GB = 10**9
MB = 10**6
SETTINGS = PressureSettings(full_percent=20.0, full_seconds=5.0, cooldown_s=60.0, retries=3)
# A 2 GB container at 10 % headroom: line 1.8, suspend past 1.9, stop past 1.95 GB.
LINE, SUSPEND, STOP = 1800 * MB, 1900 * MB, 1950 * MB


def reading(used: int, at: float = 0.0, full: float | None = None) -> Reading:
    return Reading(
        used=used, limit=2 * GB, headroom_percent=10.0, reserve=0, full_avg10=full, at=at
    )


def job(name: str, started: float, **over: object) -> Live:
    fields: dict[str, object] = {"footprint": 300 * MB, "estimate": 100 * MB, **over}
    return Live(job_id=name, started=started, **fields)  # type: ignore[arg-type]


THREE = [job("oldest", 1), job("middle", 2), job("newest", 3)]


def run(
    readings: Sequence[Reading], live: Sequence[Live] = THREE, *, cooling: bool = False
) -> list[Plan]:
    """Feed readings through the ladder from a fresh state; every plan."""
    state, plans = LadderState(), []
    for r in readings:
        plan, state = decide(state, r, live, SETTINGS, cooling=cooling)
        plans.append(plan)
    return plans


def steps(plan: Plan) -> list[tuple[Step, str | None]]:
    return [(a.step, a.job_id) for a in plan.actions]


def test_thresholds_follow_the_guards_line_and_headroom() -> None:
    """Hold at the guard's line, suspend at half the headroom past it, stop a quarter short."""
    r = reading(0)
    assert (r.hold_line, r.suspend_line, r.stop_line) == (LINE, SUSPEND, STOP)
    with_reserve = Reading(2 * GB, 2 * GB, 10.0, 100 * MB, None, 0.0)
    assert with_reserve.hold_line == LINE - 100 * MB  # the gateway's reserve: held sooner


def test_below_the_line_nothing_is_held_or_touched() -> None:
    """Used at the line exactly is room: no hold, no step."""
    plans = run([reading(1000 * MB), reading(LINE)])
    assert [(p.hold, p.actions) for p in plans] == [(False, ()), (False, ())]


def test_crossing_the_line_holds_launches_once() -> None:
    """Past the line launches are held; the hold is one step, not one per reading."""
    plans = run([reading(LINE - 50 * MB), reading(LINE + 1), reading(LINE + 2 * MB)])
    assert [p.hold for p in plans] == [False, True, True]
    assert steps(plans[1]) == [(Step.HOLD, None)]
    assert plans[1].crossed is Step.HOLD
    assert steps(plans[2]) == []


def test_suspends_the_newest_only_while_still_rising() -> None:
    """Past half the headroom: the newest is suspended if used rises, left alone if it does not."""
    rising = run([reading(SUSPEND - 10 * MB), reading(SUSPEND + 10 * MB)])
    assert steps(rising[1]) == [(Step.SUSPEND, "newest")]  # held since the first reading
    steady = run([reading(SUSPEND + 10 * MB), reading(SUSPEND + 10 * MB)])
    assert all(a.step is not Step.SUSPEND for p in steady for a in p.actions)


def test_suspension_skips_what_cannot_be_frozen_and_never_the_oldest() -> None:
    """Newest suspendable first; an unfreezable tree is passed over, the oldest never taken."""
    live = [job("oldest", 1), job("middle", 2), job("newest", 3, suspendable=False)]
    plans = run([reading(SUSPEND - 10 * MB), reading(SUSPEND + 10 * MB)], live)
    assert (Step.SUSPEND, "middle") in steps(plans[1])
    alone = [job("oldest", 1), job("newest", 3, suspended=True)]
    plans = run([reading(SUSPEND - 10 * MB), reading(SUSPEND + 10 * MB)], alone)
    assert all(a.step is not Step.SUSPEND for p in plans for a in p.actions)


def test_stop_takes_the_newest_restartable_first() -> None:
    """Within a quarter of the headroom of the limit: the newest restartable tree is stopped."""
    live = [job("oldest", 1), job("middle", 2, restartable=True), job("newest", 3)]
    plans = run([reading(STOP + 1)], live)
    assert steps(plans[0]) == [(Step.HOLD, None), (Step.STOP, "middle")]
    plans = run([reading(STOP + 1)])  # none restartable: the newest
    assert (Step.STOP, "newest") in steps(plans[0])
    assert plans[0].crossed is Step.STOP


def run_moving(readings: Sequence[tuple[Reading, Sequence[Live]]]) -> list[Plan]:
    """Feed readings through the ladder, each with the live jobs as they were then."""
    state, plans = LadderState(), []
    for r, live in readings:
        plan, state = decide(state, r, live, SETTINGS, cooling=False)
        plans.append(plan)
    return plans


def grown(**footprints_mb: int) -> list[Live]:
    """Four jobs by age (a oldest) with the given footprints in MB (300 unless said)."""
    return [
        job(name, started, footprint=footprints_mb.get(name, 300) * MB)
        for started, name in enumerate("abcd", start=1)
    ]


def test_every_newer_tree_that_grew_is_suspended_at_once_newest_first() -> None:
    """The newest tree and every other newer one that grew are frozen by one reading, never
    the oldest; a tree that did not grow is left running."""
    plans = run_moving(
        [
            (reading(SUSPEND - 30 * MB), grown()),
            (reading(SUSPEND + 10 * MB), grown(a=310, b=310, c=300, d=300)),
        ]
    )
    assert steps(plans[1]) == [(Step.SUSPEND, "d"), (Step.SUSPEND, "b")]  # held since the first


def test_past_the_line_a_rise_that_would_cross_the_suspend_line_acts_a_reading_early() -> None:
    """Past the line, used plus its last rise beyond the suspend line suspends now; the same
    rise below the line does nothing yet, and a small rise past it waits."""
    early = run_moving(
        [(reading(LINE + 10 * MB), grown()), (reading(LINE + 60 * MB), grown(d=350))]
    )
    assert (Step.SUSPEND, "d") in steps(early[1])
    assert early[1].crossed is Step.SUSPEND
    assert "last rise" in early[1].actions[-1].why
    below = run_moving(
        [(reading(LINE - 60 * MB), grown()), (reading(LINE - 10 * MB), grown(d=350))]
    )
    assert steps(below[1]) == []
    slow = run_moving([(reading(LINE + 10 * MB), grown()), (reading(LINE + 20 * MB), grown(d=310))])
    assert all(a.step is not Step.SUSPEND for a in slow[1].actions)


def test_a_rise_toward_the_stop_line_freezes_the_growth_before_stopping_anything() -> None:
    """When the last rise would carry used past the stop line: the newer trees that grew are
    frozen and nothing is stopped; when only the oldest grows (the rest already frozen), a
    tree is stopped one reading early."""
    freeze = run_moving(
        [(reading(SUSPEND + 5 * MB), grown()), (reading(SUSPEND + 35 * MB), grown(c=330))]
    )
    assert steps(freeze[1]) == [(Step.SUSPEND, "c")]
    frozen = [*grown()[:1], *(replace(j, suspended=True) for j in grown()[1:])]
    oldest_grows = [replace(frozen[0], footprint=330 * MB), *frozen[1:]]
    stop = run_moving(
        [(reading(SUSPEND + 5 * MB), frozen), (reading(SUSPEND + 35 * MB), oldest_grows)]
    )
    assert (Step.STOP, "d") in steps(stop[1])
    assert "last rise" in stop[1].actions[-1].why


def test_past_the_stop_line_the_stop_comes_with_freezing_what_still_grows() -> None:
    """A stop gives memory back only once the tree is gone: meanwhile every other newer tree
    that grows is frozen in the same plan."""
    plans = run_moving(
        [(reading(STOP - 20 * MB), grown()), (reading(STOP + 5 * MB), grown(b=320, c=320))]
    )
    assert steps(plans[1]) == [(Step.STOP, "d"), (Step.SUSPEND, "c"), (Step.SUSPEND, "b")]


def test_one_victim_at_a_time() -> None:
    """While a stopped tree is still going, no other is chosen."""
    live = [job("oldest", 1), job("middle", 2), job("newest", 3, stopping=True)]
    plans = run([reading(STOP + 1), reading(STOP + 2 * MB)], live)
    assert all(a.step is not Step.STOP for p in plans for a in p.actions)
    assert all(p.hold for p in plans)


def test_no_second_victim_while_a_stopped_tree_whose_job_left_the_list_is_still_going() -> None:
    """A leader can die of its SIGTERM, and its job leave the list, before the members that
    hold the memory are gone: until they are, no other tree is stopped."""
    live = [job("oldest", 1), job("middle", 2), job("newest", 3)]
    state, stopping_plans = LadderState(), []
    for r in (reading(STOP + 1), reading(STOP + 2 * MB)):
        plan, state = decide(state, r, live, SETTINGS, cooling=True, stopping=True)
        stopping_plans.append(plan)
    assert all(a.step is not Step.STOP for p in stopping_plans for a in p.actions)
    assert all(p.hold for p in stopping_plans)
    plan, _ = decide(state, reading(STOP + 2 * MB), live, SETTINGS, cooling=True)
    assert (Step.STOP, "newest") in steps(plan)


def test_the_monitor_asks_whether_a_stop_is_still_going_before_it_reads() -> None:
    clock = FakeClock()
    target = FakeTarget(list(THREE))
    target.stopping = True
    m = monitor(clock, [reading(STOP + 1), reading(STOP + 1)], target, Cooldown(clock))
    m.tick()
    assert not [d for d in target.done if d[0] == "stop"]
    target.stopping = False
    m.tick()
    assert ("stop", "newest") in target.done


def test_sustained_full_pressure_stops_after_its_seconds() -> None:
    """PSI full avg10 above 20 % stops a tree only once it has lasted 5 s; a dip starts over."""
    below_lines = 1000 * MB
    plans = run(
        [
            reading(below_lines, at=0.0, full=25.0),
            reading(below_lines, at=4.9, full=25.0),
            reading(below_lines, at=5.0, full=25.0),
        ]
    )
    assert [any(a.step is Step.STOP for a in p.actions) for p in plans] == [False, False, True]
    assert "PSI full" in plans[2].actions[-1].why
    dipped = run(
        [
            reading(below_lines, at=0.0, full=25.0),
            reading(below_lines, at=3.0, full=19.0),
            reading(below_lines, at=6.0, full=25.0),
            reading(below_lines, at=10.9, full=25.0),
        ]
    )
    assert not any(a.step is Step.STOP for p in dipped for a in p.actions)
    at_threshold = run([reading(below_lines, at=0.0, full=20.0), reading(0, at=9.0, full=20.0)])
    assert not any(a.step is Step.STOP for p in at_threshold for a in p.actions)


def test_the_oldest_alone_is_stopped_as_one_that_can_never_fit() -> None:
    """Progress: the oldest is never stopped for newer ones; alone past the limit, it never fits."""
    plans = run([reading(STOP + 1)], [job("oldest", 1)])
    (stop,) = [a for a in plans[0].actions if a.step is Step.STOP]
    assert (stop.job_id, stop.never_fits) == ("oldest", True)
    plans = run([reading(STOP + 1)], [job("oldest", 1), job("newest", 2)])
    (stop,) = [a for a in plans[0].actions if a.step is Step.STOP]
    assert (stop.job_id, stop.never_fits) == ("newest", False)


def test_resumes_oldest_first_once_it_fits_and_holds_until_then() -> None:
    """Suspended trees go on oldest first, when used plus their rest fits under the line."""
    live = [
        job("oldest", 1),
        job("middle", 2, suspended=True, estimate=500 * MB, footprint=300 * MB),
        job("newest", 3, suspended=True, estimate=100 * MB),
    ]
    # 1.7 GB + the middle's 0.2 GB still to come is past the line: nobody goes, not even
    # the newest (whose rest is 0): a younger one never goes before an older one.
    plans = run([reading(1700 * MB), reading(1700 * MB)], live)
    assert all(p.hold and not p.actions[1:] for p in plans)
    assert not any(a.step is Step.RESUME for p in plans for a in p.actions)
    plans = run([reading(1600 * MB), reading(1600 * MB)], live)
    assert (Step.RESUME, "middle") in steps(plans[0])
    assert plans[0].hold  # still held while anything is suspended
    rising = run([reading(1000 * MB), reading(1600 * MB)], live)
    assert (Step.RESUME, "middle") not in steps(rising[1])


def _frozen_three(**newest: object) -> list[Live]:
    """The oldest runs; two trees frozen together wait: the middle's rest does not fit beside
    1.85 GB used, and the newest's 0.2 GB back would let it go on (1.65 + 0.1 <= 1.8)."""
    over: dict[str, object] = {
        "suspended": True,
        "footprint": 200 * MB,
        "runs_again": True,
        "ran_s": 30.0,
        "suspended_s": 30.0,
        **newest,
    }
    return [
        job("oldest", 1),
        job("middle", 2, suspended=True, estimate=400 * MB, runs_again=True),
        job("newest", 3, **over),
    ]


def test_a_frozen_tree_waited_for_as_long_as_it_ran_is_stopped_to_let_an_older_one_go_on() -> None:
    """Rent or buy: trees frozen together wait for a running job's end; once they have waited
    together as long as the newest ran, it is stopped (it runs again later) when its memory
    back lets the oldest frozen tree go on; one victim at a time."""
    plans = run([reading(1850 * MB), reading(1850 * MB)], _frozen_three())
    assert (Step.STOP, "newest") in steps(plans[0])
    why = next(a.why for a in plans[0].actions if a.step is Step.STOP)
    assert (
        "2 suspended tree(s) idle 30 s together since it was suspended 30 s ago, after "
        "running 30 s; its 0.20 lets job middle go on"
    ) in why
    stopping = [replace(j, stopping=j.job_id == "newest") for j in _frozen_three()]
    plan, _ = decide(LadderState(), reading(1850 * MB), stopping, SETTINGS, cooling=False)
    assert not any(a.step is Step.STOP for a in plan.actions)
    plan, _ = decide(
        LadderState(), reading(1850 * MB), _frozen_three(), SETTINGS, cooling=False, stopping=True
    )
    assert not any(a.step is Step.STOP for a in plan.actions)


@pytest.mark.parametrize(
    ("middle_s", "newest_s", "stopped"),
    [
        (15.0, 15.0, True),  # 15 + 15 s idle together: as long as it ran (30 s)
        (14.0, 14.0, False),  # 28 s: waiting has cost less than a stop would
        (100.0, 10.0, False),  # the middle's wait from before the newest froze: not counted
    ],
)
def test_every_suspended_trees_idle_time_since_it_was_frozen_counts_against_its_run(
    middle_s: float, newest_s: float, stopped: bool
) -> None:
    """Trees frozen together all wait on the memory the frozen ones hold: the newest is
    stopped once their idle time together since it was frozen equals what it ran, long
    before it alone has waited as long."""
    live = _frozen_three(suspended_s=newest_s)
    live[1] = replace(live[1], suspended_s=middle_s)
    plan = run([reading(1850 * MB)] * 2, live)[-1]
    assert ((Step.STOP, "newest") in steps(plan)) is stopped, plan.actions


def test_a_paused_trials_idle_time_is_not_counted_against_a_frozen_trees_run() -> None:
    """A job paused on trial waits on packing, not on the memory the frozen trees hold: its
    idle time does not count (14 s each for the frozen two, 28 s, is less than the 30 s run)."""
    live = _frozen_three(suspended_s=14.0)
    live[1] = replace(live[1], suspended_s=14.0)
    trial = job("trial", 4, suspended=True, trial=True, runs_again=True, suspended_s=14.0)
    plan = run([reading(1850 * MB)] * 2, [*live, trial])[-1]
    assert not any(a.step is Step.STOP for a in plan.actions), plan.actions


def test_the_newest_frozen_tree_that_would_run_again_is_the_one_stopped() -> None:
    """A tree frozen newest that a stop would not queue again is passed over: the newest
    that would run again is stopped in its place."""
    live = [*_frozen_three(), job("once", 4, suspended=True, ran_s=30.0, suspended_s=30.0)]
    plan = run([reading(1850 * MB)], live)[0]
    assert [(s, j) for s, j in steps(plan) if s is Step.STOP] == [(Step.STOP, "newest")]


WAITED = {"ran_s": 10.0, "suspended_s": 30.0}  # it has waited longer than it ran


def test_a_frozen_tree_with_enough_memory_is_stopped_when_the_newest_holds_too_little() -> None:
    """Trees frozen together grow unevenly: when the newest one's memory back would not let
    the oldest go on, the newest one whose memory would, and that was waited for as long as
    it ran, is stopped; one waited for less than it ran is passed over for an older one."""
    small = {"suspended": True, "runs_again": True, **WAITED}
    live = [*_frozen_three(), job("small", 4, footprint=40 * MB, **small)]
    plan = run([reading(1850 * MB)] * 2, live)[-1]
    assert [(s, j) for s, j in steps(plan) if s is Step.STOP] == [(Step.STOP, "newest")]
    why = next(a.why for a in plan.actions if a.step is Step.STOP)
    assert "its 0.20 lets job middle go on" in why
    # Waited for 60 s in all (itself and the newest, 30 s each) after running 80 s.
    big_but_young = {**small, "footprint": 200 * MB, "ran_s": 80.0}
    live = [*_frozen_three(), job("young", 4, **big_but_young)]
    plan = run([reading(1850 * MB)] * 2, live)[-1]
    assert [(s, j) for s, j in steps(plan) if s is Step.STOP] == [(Step.STOP, "newest")]


def test_unblock_never_stops_the_oldest_frozen_tree_nor_a_paused_trial() -> None:
    """The oldest frozen tree is the one to let go on, never a victim, however much it holds;
    a job paused on trial is packing's, not the ladder's: neither is stopped."""
    live = [
        job("oldest", 1),
        job("middle", 2, suspended=True, runs_again=True, ran_s=30.0, suspended_s=30.0),
        job("newest", 3, suspended=True, runs_again=True, footprint=40 * MB, **WAITED),
        job("trial", 4, suspended=True, trial=True, runs_again=True, footprint=200 * MB, **WAITED),
    ]
    plan = run([reading(1850 * MB)] * 2, live)[-1]
    assert not any(a.step is Step.STOP for a in plan.actions), plan.actions


@pytest.mark.parametrize(
    ("why", "newest", "used"),
    [
        ("it has waited less than it ran", {"suspended_s": 29.0}, 1850 * MB),
        ("a stop would not queue it again", {"runs_again": False}, 1850 * MB),
        ("its memory back would not let the older one go on", {"footprint": 40 * MB}, 1850 * MB),
        ("a run of no length: frozen as it began", {"ran_s": 0.0, "suspended_s": 0.0}, 1850 * MB),
        ("the older one goes on by itself", {}, 1700 * MB),
        ("used still rises", {}, None),
    ],
)
def test_a_frozen_tree_is_not_stopped_while_waiting_costs_less(
    why: str, newest: dict[str, object], used: int | None
) -> None:
    """No stop while it has waited less than it ran, would not run again, would not free
    enough, is not needed, or while used still rises (the rungs above act then)."""
    # Rising: from 1.83 to 1.85 GB (the suspend rung's business, not this one's).
    readings = [reading(1830 * MB), reading(1850 * MB)] if used is None else [reading(used)] * 2
    plan = run(readings, _frozen_three(**newest))[-1]
    assert not any(a.step is Step.STOP for a in plan.actions), why


def test_cooling_holds_launches_without_any_pressure() -> None:
    """The cooldown alone holds launches, and the hold says so, with its seconds left; it
    never claims a crossing (used above the line) that did not happen."""
    plan, _ = decide(
        LadderState(), reading(100 * MB), THREE, SETTINGS, cooling=True, cooling_left_s=42.4
    )
    assert plan.hold and steps(plan) == [(Step.HOLD, None)]
    why = plan.actions[0].why
    assert why.startswith("cooldown after a stop or a relief, 42 s left"), why
    assert " > " not in why
    crossed, _ = decide(LadderState(), reading(1850 * MB), (), SETTINGS, cooling=True)
    assert crossed.actions[0].why.startswith("used 1.85 > line 1.80"), crossed.actions[0].why


def monitor(
    clock: FakeClock,
    readings: list[Reading],
    target: FakeTarget,
    cooldown: Cooldown,
    settings: PressureSettings = SETTINGS,
) -> PressureMonitor:
    feed = iter(readings)
    return PressureMonitor(
        target=target,
        read=lambda: next(feed),
        cooldown=cooldown,
        settings=lambda: settings,
        pace=MonitorPace(clock=clock),
    )


def test_a_stops_cooldown_ends_once_the_memory_is_back_and_the_forecast_fits() -> None:
    """Unset, the cooldown holds only while the stopped tree is going or used plus the running
    jobs' forecast is past the line; at most ROOMKEEPER_PRESSURE_COOLDOWN's 60 s."""
    clock = FakeClock(0.0)
    cooldown = Cooldown(clock)
    target = FakeTarget(list(THREE))
    crowded = replace(reading(1000 * MB), claimed=900 * MB)  # 1.0 + 0.9 > line 1.8
    calm = replace(reading(1000 * MB), claimed=700 * MB)
    feed = [reading(STOP + 1), reading(1000 * MB), crowded, calm, reading(STOP + 1), crowded]
    m = monitor(clock, feed, target, cooldown)
    m.tick()
    assert target.done == [("stop", "newest")] and cooldown.holding(CooldownCause.PRESSURE)
    target.stopping = True  # the stopped tree is not gone: its memory is not back
    clock.advance(1.0)
    m.tick()
    assert target.held[-1] is True and cooldown.active()
    target.stopping = False
    clock.advance(1.0)
    m.tick()  # gone, but the running jobs' forecast does not fit yet
    assert target.held[-1] is True and cooldown.active()
    clock.advance(1.0)
    m.tick()
    assert target.held[-1] is False and not cooldown.active()
    m.tick()  # a second stop: the ceiling ends a hold that never clears
    clock.advance(59.9)
    m.tick()
    assert cooldown.active()
    clock.advance(0.2)
    assert not cooldown.active()


def test_ending_a_stops_cooldown_leaves_a_relief_requests_hold() -> None:
    """Each cause keeps its own end: the monitor's early end never cuts the supervisor's."""
    clock = FakeClock(0.0)
    cooldown = Cooldown(clock)
    cooldown.start(30.0, CooldownCause.RELIEF)
    cooldown.start(60.0, CooldownCause.PRESSURE)
    assert cooldown.cause() is CooldownCause.PRESSURE
    clock.advance(5.0)
    assert cooldown.clear(CooldownCause.PRESSURE) == 5.0
    assert cooldown.cause() is CooldownCause.RELIEF and 24.9 < cooldown.remaining() <= 25.0
    assert cooldown.clear(CooldownCause.PRESSURE) is None
    cooldown.clear()
    assert not cooldown.active()


def test_a_last_run_is_stopped_only_when_no_newer_job_is_left() -> None:
    """A restartable job on its last run is passed over for the newest other job."""
    live = [
        job("oldest", 1),
        job("plain", 2),
        job("last", 3, restartable=True, last_run=True),
    ]
    plans = run([reading(STOP + 1)], live)
    assert (Step.STOP, "plain") in steps(plans[0])
    plans = run([reading(STOP + 1)], [job("oldest", 1), job("last", 3, last_run=True)])
    assert (Step.STOP, "last") in steps(plans[0])


def test_a_stop_starts_the_shared_cooldown_and_it_ends_on_time() -> None:
    """A person's ROOMKEEPER_PRESSURE_COOLDOWN holds admission that long after a stop, on the
    one clock, however calm it gets; then it lifts."""
    clock = FakeClock(0.0)
    cooldown = Cooldown(clock)
    target = FakeTarget(list(THREE))
    fixed = replace(SETTINGS, cooldown_fixed=True)
    m = monitor(
        clock, [reading(STOP + 1), reading(100 * MB), reading(100 * MB)], target, cooldown, fixed
    )
    m.tick()
    assert target.done == [("stop", "newest")]
    assert cooldown.cause() is CooldownCause.PRESSURE
    assert 59.9 < cooldown.remaining() <= 60.0
    clock.advance(59.0)
    assert m.tick() is not None and target.held[-1] is True  # calm, yet still cooling
    clock.advance(1.0)
    m.tick()
    assert target.held[-1] is False
    assert m.statistics().stops == 1


def test_a_crossing_answered_by_another_step_never_times_a_later_one() -> None:
    """A stop rung crossed by a rise and answered by a suspension is over once used is
    back under it: a stop 15 s later is timed from its own crossing, not from that one."""
    clock = FakeClock(0.0)
    target = FakeTarget(list(THREE))
    feed = [
        reading(1850 * MB, at=0.0),  # past the line: held
        reading(1920 * MB, at=0.1),  # past suspend, rising past stop: the newest frozen
        reading(1900 * MB, at=1.0),  # back under the suspend and stop lines, still held
        reading(STOP + 10 * MB, at=15.1),  # the stop rung, crossed again, for real
    ]
    m = monitor(clock, feed, target, Cooldown(clock))
    m.tick()
    clock.advance(0.1)
    grown = replace(THREE[2], footprint=370 * MB)  # the newest grew by the rise
    target.live = [THREE[0], THREE[1], grown]
    m.tick()
    assert target.done == [("suspend", "newest")]
    target.live = [THREE[0], THREE[1], replace(grown, suspended=True)]
    clock.advance(0.9)
    m.tick()
    clock.advance(14.1)
    m.tick()
    assert m.statistics().stops == 1
    stats = m.statistics()
    assert stats.reaction_max_s is not None and stats.reaction_max_s < 1.0, stats


def test_reaction_time_runs_from_the_crossing_to_the_step() -> None:
    """The reaction is measured from the notification's time when one woke the monitor."""
    clock = FakeClock(10.0)
    target = FakeTarget(list(THREE))
    readings = [reading(SUSPEND - 10 * MB, at=10.0), reading(SUSPEND + 10 * MB, at=10.25)]
    m = monitor(clock, readings, target, Cooldown(clock))
    m.tick()
    clock.advance(0.25)
    m.tick(woken_at=10.2)
    stats = m.statistics()
    assert ("suspend", "newest") in target.done
    assert (stats.holds, stats.suspensions) == (1, 1)
    assert stats.reaction_max_s is not None and abs(stats.reaction_max_s - 0.05) < 1e-9


def test_cooldown_never_shortens_and_a_repair_clears_it() -> None:
    """A later start never cuts a running cooldown short; clear ends it."""
    clock = FakeClock(0.0)
    cooldown = Cooldown(clock)
    cooldown.start(60, CooldownCause.PRESSURE)
    cooldown.start(10, CooldownCause.RELIEF)
    assert cooldown.remaining() == 60 and cooldown.cause() is CooldownCause.PRESSURE
    cooldown.clear()
    assert not cooldown.active() and cooldown.cause() is None


class Handle(CannotSuspend):
    """A tree that grows to ``peak`` and ends when stopped."""

    def __init__(self, peak: int) -> None:
        self.pid = os.getpid()
        self.code: int | None = None
        self.peak_value = peak

    def poll(self) -> int | None:
        return self.code

    def cpu_seconds(self) -> float | None:
        return None

    def footprint_bytes(self) -> int:
        return self.peak_value

    def peak(self) -> MemoryPeak:
        return MemoryPeak(self.peak_value, PeakMethod.SAMPLED)

    def stop(self, grace: float = 5.0) -> int | None:
        self.code = -15
        return self.code

    def close(self) -> None:
        pass


def test_restartable_work_runs_again_with_its_peak_at_most_retries_times(tmp_path: Path) -> None:
    """Stopped for pressure, restartable work is queued again with a grown estimate, three
    times at most."""
    launched: list[int] = []
    # A container of its own: estimates are capped at the line, which must not be the
    # machine's (a 3 GiB box caps 5.6 GB).  The guard's clock, which times the job's growth,
    # and the scheduler's, which times its run, are one fake clock: on the real clock a busy
    # machine stretched the gap between two growth reports past the run itself, and the first
    # re-run was asked at less than twice the peak.
    clock = FakeClock(0.0)
    roots = v2_tree(tmp_path / "tree", "/job", {"/job": Level(32 * GB, 1 * GB)})
    guard = Guard(
        env=NO_DISK, proc_root=roots.proc, cgroup_root=roots.cgroup, workspace=tmp_path, clock=clock
    )

    def launcher(job_id: str, spec: LaunchSpec) -> Handle:
        launched.append(1)
        return Handle(700 * MB)

    scheduler = Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path,
            limits=lambda: Limits(32, 8, 4, 2, 100.0, 10),
            pressure=False,
            pressure_settings=lambda: SETTINGS,
        ),
        parts=SchedulerParts(guard=guard, launcher=launcher),
        clocks=SchedulerClocks(clock=clock, cpu_percent=lambda: None),
    )
    view = scheduler.submit(JobSpec(argv=["x"], memory_bytes=100 * MB, restartable=True))
    plain = scheduler.submit(JobSpec(argv=["y"], owner="b", memory_bytes=100 * MB))
    for _ in range(5):
        scheduler.tick()
        clock.advance(0.5)
        scheduler.relief.live_jobs()  # the monitor's reading: 700 MB half a second in
        scheduler.relief.stop_for_pressure(view.id, "test", never_fits=False)
        scheduler.relief.stop_for_pressure(plain.id, "test", never_fits=False)
        scheduler.tick()
        clock.advance(1.0)
    final, other = scheduler.get(view.id), scheduler.get(plain.id)
    scheduler.close()
    assert (final.state, final.reason) == (JobState.STOPPED, PressureReason.MEMORY_PRESSURE)
    requeued = [t for t in final.history if t.state is JobState.WAITING][1:]
    assert [t.reason for t in requeued] == [PressureReason.MEMORY_PRESSURE] * 3
    # Stopped while growing (700 MB at once): twice its peak, then twice the last each time.
    assert final.spec.memory_bytes == 5600 * MB
    assert (final.estimate_bytes, final.estimate_source) == (5600 * MB, EstimateSource.RERUN)
    assert (other.state, other.reason) == (JobState.STOPPED, PressureReason.MEMORY_PRESSURE)
    assert [t.state for t in other.history].count(JobState.RUNNING) == 1  # never re-run
    assert len(launched) == 4 + 1
    assert scheduler.pressure_statistics().reruns == 3


def test_a_job_that_never_fits_is_not_run_again(tmp_path: Path) -> None:
    """A restartable job that alone outgrows the container ends stopped, saying it never fits."""
    scheduler = Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path, limits=lambda: Limits(32, 8, 4, 2, 100.0, 10), pressure=False
        ),
        parts=SchedulerParts(launcher=lambda job_id, spec: Handle(3 * GB)),
    )
    view = scheduler.submit(JobSpec(argv=["x"], restartable=True))
    scheduler.tick()
    scheduler.relief.stop_for_pressure(view.id, "used 1.96 > stop line 1.95", never_fits=True)
    scheduler.tick()
    final = scheduler.get(view.id)
    scheduler.close()
    assert (final.state, final.reason) == (JobState.STOPPED, PressureReason.MEMORY_PRESSURE)
    assert final.error is not None and "can never fit here" in final.error


def test_pressure_hold_makes_waiting_jobs_say_pressure(tmp_path: Path) -> None:
    """While the ladder holds, nothing launches and waiting jobs give the reason ``pressure``."""
    scheduler = Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path, limits=lambda: Limits(32, 8, 4, 2, 100.0, 10), pressure=False
        ),
        parts=SchedulerParts(launcher=lambda job_id, spec: Handle(0)),
    )
    scheduler.relief.hold_for_pressure(True)
    view = scheduler.submit(JobSpec(argv=["x"]))
    scheduler.tick()
    held = scheduler.get(view.id)
    scheduler.relief.hold_for_pressure(False)
    scheduler.tick()
    running = scheduler.get(view.id)
    scheduler.close()
    assert (held.state, held.reason) == (JobState.WAITING, PressureReason.PRESSURE)
    assert running.state is JobState.RUNNING


class _Racing(Handle):
    """A tree whose footprint reading lets something else happen meanwhile."""

    def __init__(self, peak: int) -> None:
        super().__init__(peak)
        self.during_footprint: Callable[[], None] | None = None

    def cpu_seconds(self) -> float | None:
        return None

    def footprint_bytes(self) -> int:
        if self.during_footprint is not None:
            meanwhile, self.during_footprint = self.during_footprint, None
            meanwhile()
        return super().footprint_bytes()


def test_a_reading_while_a_stopped_job_is_queued_again_stays_sighted(tmp_path: Path) -> None:
    """A stop, a re-run and a reading together: the reading still sees every job it began with
    (the tree it copied), and neither raises nor blinds the monitor."""
    handles: dict[str, _Racing] = {}

    def launcher(job_id: str, spec: LaunchSpec) -> _Racing:
        handles[job_id] = _Racing(300 * MB)
        return handles[job_id]

    scheduler = Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path,
            limits=lambda: Limits(32, 8, 4, 2, 100.0, 10),
            pressure=False,
            pressure_settings=lambda: SETTINGS,
        ),
        parts=SchedulerParts(launcher=launcher),
    )
    try:
        first = scheduler.submit(JobSpec(argv=["x"], memory_bytes=100 * MB))
        second = scheduler.submit(
            JobSpec(argv=["y"], owner="b", memory_bytes=100 * MB, restartable=True)
        )
        scheduler.tick()
        assert scheduler.relief.stop_for_pressure(second.id, "test", never_fits=False)
        deadline = time.monotonic() + 30  # the stop runs on a side thread of its own
        while handles[second.id].code is None and time.monotonic() < deadline:
            time.sleep(0.01)
        scheduler.relief.hold_for_pressure(True)  # so the stopped job waits once queued again
        # While the reading measures the first job, a round reaps the second and queues it again.
        handles[first.id].during_footprint = scheduler.tick
        live = scheduler.relief.live_jobs()
        assert sorted(j.job_id for j in live) == sorted([first.id, second.id])
        again = scheduler.get(second.id)
        assert again.state is JobState.WAITING  # queued again, held with the launches
        assert [s.state for s in again.history][-2:] == [JobState.RUNNING, JobState.WAITING]
        assert [j.job_id for j in scheduler.relief.live_jobs()] == [first.id]
    finally:
        scheduler.close()


def _idle_monitor(read: Callable[[], Reading | None], *, interval: float) -> PressureMonitor:
    """A started monitor of no jobs that reads with ``read`` every ``interval`` seconds."""
    monitor = PressureMonitor(
        target=FakeTarget([]),
        read=read,
        cooldown=Cooldown(FakeClock()),
        settings=lambda: SETTINGS,
        pace=MonitorPace(interval=interval),
    )
    monitor.start()
    return monitor


def test_a_reading_that_fails_is_tried_again_at_the_next_interval() -> None:
    """A reading that raises is logged and the next one comes one interval later, not seconds."""
    times: list[float] = []

    def read() -> Reading | None:
        times.append(time.monotonic())
        if len(times) == 1:
            raise RuntimeError("a reading failed on purpose")
        return None

    monitor = _idle_monitor(read, interval=0.05)
    try:
        deadline = time.monotonic() + 30
        while len(times) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        monitor.close()
    assert len(times) >= 2
    # One interval (50 ms), with room for a busy machine; never the seconds a backoff would take.
    assert times[1] - times[0] < 1.0


def test_closing_the_monitor_wakes_it_instead_of_waiting_out_its_interval() -> None:
    """A monitor that reads every 30 s is closed at once: every batch and gateway closes one
    as it ends, and waited out a whole interval there."""
    read_once = threading.Event()

    def read() -> Reading | None:
        read_once.set()
        return None

    monitor = _idle_monitor(read, interval=30.0)
    assert read_once.wait(30)
    time.sleep(0.05)  # into its wait
    started = time.monotonic()
    monitor.close()
    assert time.monotonic() - started < 5.0
    monitor.close()  # again: nothing left to close, nothing raised


def test_a_slow_reading_says_where_its_time_went_now_and_then(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reading that keeps the monitor blind for long is logged with its parts (here the
    live jobs took 1.2 s), at most once in ten seconds."""
    clock = FakeClock()

    class SlowTarget(FakeTarget):
        def live_jobs(self) -> list[Live]:
            clock.advance(1.2)
            return super().live_jobs()

    monitor = PressureMonitor(
        target=SlowTarget([]),
        read=lambda: reading(LINE - 100 * MB, at=clock()),
        cooldown=Cooldown(clock),
        settings=lambda: SETTINGS,
        pace=MonitorPace(clock=clock),
    )
    with caplog.at_level("WARNING", logger="roomkeeper"):
        for _ in range(3):
            monitor.tick()
    said = [r.getMessage() for r in caplog.records if "pressure reading took" in r.getMessage()]
    assert said == [
        "a pressure reading took 1200 ms (the reading 0 ms, the live jobs 1200 ms, the steps 0 ms)"
    ]


class _Freezable(Handle):
    """A tree that can be suspended, recording the order of halts and suspensions."""

    suspendable = True

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        super().__init__(100 * MB)
        self.name, self.calls = name, calls

    def halt(self) -> None:
        self.calls.append(("halt", self.name))

    def suspend(self, *, timeout: float = 0.0) -> object:
        self.calls.append(("suspend", self.name))
        return "fake"

    def resume(self) -> object:
        self.calls.append(("resume", self.name))
        return "fake"


def _freezing_scheduler(
    tmp_path: Path, calls: list[tuple[str, str]], clocks: SchedulerClocks | None = None
) -> Scheduler:
    """A scheduler whose trees are :class:`_Freezable`, its own monitor off."""
    return Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path,
            limits=lambda: Limits(32, 8, 4, 2, 100.0, 10),
            pressure=False,
            pressure_settings=lambda: SETTINGS,
        ),
        parts=SchedulerParts(launcher=lambda job_id, spec: _Freezable(job_id, calls)),
        clocks=clocks or SchedulerClocks(),
    )


def test_the_suspensions_of_one_reading_halt_every_tree_before_any_walk(tmp_path: Path) -> None:
    """Three trees suspended by one reading: each is halted (its known processes stopped)
    before the first one is suspended in full, which walks /proc (slow on a busy machine)."""
    calls: list[tuple[str, str]] = []
    scheduler = _freezing_scheduler(tmp_path, calls)
    try:
        ids = [scheduler.submit(JobSpec(argv=["x"], owner=o, memory_bytes=MB)).id for o in "abc"]
        scheduler.tick()
        assert scheduler.relief.suspend_all_for_pressure(ids) == ids
        assert calls == [("halt", i) for i in ids] + [("suspend", i) for i in ids]
        assert {scheduler.get(i).state for i in ids} == {JobState.SUSPENDED}
    finally:
        scheduler.close()


def test_a_reading_lists_the_live_jobs_before_it_reads_the_container() -> None:
    """A stopped job that leaves the live list has given its memory back before the reading
    that follows: read the other way round, a reading taken just before its exit and a list
    taken just after it would choose a second victim for memory already freed."""
    calls: list[str] = []

    class Recording(FakeTarget):
        def live_jobs(self) -> list[Live]:
            calls.append("live jobs")
            return super().live_jobs()

    def read() -> Reading:
        calls.append("reading")
        return reading(LINE - 100 * MB)

    monitor = PressureMonitor(
        target=Recording([]),
        read=read,
        cooldown=Cooldown(FakeClock()),
        settings=lambda: SETTINGS,
        pace=MonitorPace(clock=FakeClock()),
    )
    monitor.tick()
    monitor.tick()
    assert calls == ["live jobs", "reading"] * 2


def test_a_guessed_crossing_never_stops_the_oldest_alone_nor_below_the_suspend_line() -> None:
    """The last rise may point past the stop line; that guess alone never stops the oldest job
    as one that can never fit, and stops nothing while used is under the suspend line."""
    alone = [job("oldest", 1)]
    plans = run_moving([(reading(LINE + 10 * MB), alone), (reading(SUSPEND + 10 * MB), alone)])
    assert all(a.step is not Step.STOP for p in plans for a in p.actions)
    below = run_moving(
        [(reading(LINE + 5 * MB), grown()), (reading(SUSPEND - 5 * MB), grown(a=400))]
    )
    assert all(a.step is not Step.STOP for p in below for a in p.actions)


def test_a_last_run_is_protected_only_while_it_keeps_to_what_it_reserved(
    tmp_path: Path,
) -> None:
    """The ladder passes over a last run only while its footprint is within the estimate it
    was admitted with: past it, it is the one outgrowing."""
    handles: list[Handle] = []

    def launcher(job_id: str, spec: LaunchSpec) -> Handle:
        handles.append(Handle(300 * MB))
        return handles[-1]

    scheduler = Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path,
            limits=lambda: Limits(32, 8, 4, 2, 100.0, 10),
            pressure=False,
            pressure_settings=lambda: replace(SETTINGS, retries=1),
        ),
        parts=SchedulerParts(launcher=launcher),
    )
    try:
        view = scheduler.submit(JobSpec(argv=["x"], memory_bytes=100 * MB, restartable=True))
        scheduler.tick()
        assert not scheduler.relief.live_jobs()[0].last_run
        scheduler.relief.stop_for_pressure(view.id, "test", never_fits=False)
        scheduler.tick()
        scheduler.tick()
        assert len(handles) == 2  # its last run
        admitted = scheduler.get(view.id).estimate_bytes
        handles[-1].peak_value = admitted  # within what it reserved
        assert scheduler.relief.live_jobs()[0].last_run
        handles[-1].peak_value = admitted + 1  # outgrowing it
        assert not scheduler.relief.live_jobs()[0].last_run
    finally:
        scheduler.close()


def test_the_live_jobs_say_how_long_each_ran_and_waited_and_whether_it_would_run_again(
    tmp_path: Path,
) -> None:
    """What the rent-or-buy rule weighs, from the scheduler's own records on a fake clock: a
    tree frozen at 20 s and looked at 15 s later ran 20 s and waited 15 s, though the wall
    clock jumped an hour meanwhile (times come from the monotonic clock); one that is not
    restartable would not run again."""
    calls: list[tuple[str, str]] = []
    clock, wall = FakeClock(1000.0), FakeClock(1_700_000_000.0)
    clocks = SchedulerClocks(clock=clock, wall=wall, cpu_percent=lambda: None)
    scheduler = _freezing_scheduler(tmp_path, calls, clocks)
    try:
        again = scheduler.submit(JobSpec(argv=["x"], owner="a", memory_bytes=MB, restartable=True))
        once = scheduler.submit(JobSpec(argv=["x"], owner="b", memory_bytes=MB))
        scheduler.tick()
        for fake in (clock, wall):
            fake.advance(20.0)
        assert scheduler.relief.suspend_all_for_pressure([again.id]) == [again.id]
        clock.advance(15.0)
        wall.advance(3600.0 + 15.0)  # the wall clock set forward meanwhile
        seen = {j.job_id: j for j in scheduler.relief.live_jobs()}
        assert (seen[again.id].ran_s, seen[again.id].suspended_s) == (20.0, 15.0)
        assert (seen[once.id].ran_s, seen[once.id].suspended_s) == (35.0, 0.0)
        assert seen[again.id].runs_again and not seen[once.id].runs_again
    finally:
        scheduler.close()


def test_a_tree_frozen_when_stopped_runs_again_with_its_estimate_and_one_running_doubles_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Frozen when stopped (the unblock step's victim, or the stop line's while the rest were
    frozen), a tree within its estimate was stopped for the others' growth: its re-run keeps
    the estimate, and the log says why.  A tree stopped while it ran asks for twice it."""
    calls: list[tuple[str, str]] = []
    # Each tree holds 100 MB from its start, so a re-run grows it to its peak and as much
    # again (200 MB); 250 MB is above that, and twice it below a 1 GiB box's line (0.97 GB).
    scheduler = _freezing_scheduler(tmp_path, calls)
    try:
        frozen, running = (
            scheduler.submit(JobSpec(argv=["x"], owner=o, memory_bytes=250 * MB, restartable=True))
            for o in "ab"
        )
        scheduler.tick()
        assert scheduler.relief.suspend_for_pressure(frozen.id)
        for job in (frozen, running):
            assert scheduler.relief.stop_for_pressure(job.id, "test", never_fits=False)
        scheduler.tick()
        estimates = [scheduler.get(j.id).estimate_bytes for j in (frozen, running)]
    finally:
        scheduler.close()
    assert estimates == [250 * MB, 500 * MB]
    said = {r.getMessage().split()[1]: r.getMessage() for r in caplog.records if "again" in r.msg}
    assert "stopped for the others' growth" in said[frozen.id], said
    assert "stopped for the others' growth" not in said[running.id], said

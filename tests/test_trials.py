"""Packing's trials: a pack job that does not fit starts on trial, holds nothing, paused first."""

from __future__ import annotations

from pathlib import Path

from roomkeeper.config import PressureSettings
from roomkeeper.guard.admission import Guard, Rerun
from roomkeeper.guard.lines import Reading
from roomkeeper.guard.packing import (
    FLOOR_BYTES,
    GROWING_BYTES,
    HORIZON_SECONDS,
    IDLE_OBSERVE_SECONDS,
    MAX_TRIALS,
    PEAKS_NEEDED,
    TRIAL_RESUME_MARGIN,
    MemoryPolicy,
    Report,
    claim_bytes,
    held_bytes,
    leaves_trial,
    trial_fits,
    typical_peak,
)
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerParts, SchedulerSettings
from roomkeeper.jobs.spec import JobSpec
from roomkeeper.relief.cooldown import Cooldown
from roomkeeper.relief.ladder import LadderState, Live, Step, decide
from roomkeeper.relief.monitor import MonitorPace, PressureMonitor
from roomkeeper.testing import FakeClock
from tests.fakes import NO_DISK, FakeHandle, FakeTarget, fixture_guard

MB = 10**6
GB = 10**9
PACK = MemoryPolicy.PACK
SETTINGS = PressureSettings()
# A 2 GB container at 10 % headroom: line 1.8, suspend past 1.9, stop past 1.95 GB.
SUSPEND = 1900 * MB


def reports(*points: tuple[float, int]) -> list[Report]:
    return [Report(at, measured) for at, measured in points]


def test_a_growing_job_claims_the_rest_of_its_estimate() -> None:
    """Growing more than GROWING_BYTES in the last second: its forecast may miss long growth,
    so against the jobs on trial it claims all it may still grow."""
    grew = reports((0.0, 0), (1.0, 100 * MB), (2.0, 300 * MB))
    assert held_bytes(PACK, 2 * GB, grew) < 2 * GB - 300 * MB
    assert claim_bytes(PACK, 2 * GB, grew) == 2 * GB - 300 * MB


def test_a_settled_job_claims_only_its_recent_growth() -> None:
    """Grown, then still for a second: its claim is the last second's slope over the horizon."""
    settled = reports((0.0, 0), (1.0, 500 * MB), (2.0, 900 * MB), (3.0, 900 * MB + GROWING_BYTES))
    assert held_bytes(PACK, 2 * GB, settled) > GB  # the 3 s window still sees the growth
    assert claim_bytes(PACK, 2 * GB, settled) == int(GROWING_BYTES * HORIZON_SECONDS) + FLOOR_BYTES


def test_an_unobserved_or_strict_job_claims_what_it_holds() -> None:
    """Not yet seen growing, or strict: nothing is known to shrink its claim."""
    young = reports((0.0, 0))
    assert claim_bytes(PACK, GB, young) == GB
    settled = reports((0.0, 0), (1.0, 500 * MB), (2.5, 500 * MB))
    assert claim_bytes(MemoryPolicy.STRICT, GB, settled) == 500 * MB


def test_a_trial_ends_when_the_rest_of_its_estimate_fits() -> None:
    """used + claims + (estimate - measured) at the line is room; a byte more is not."""
    assert leaves_trial(1 * GB, 500 * MB, 2 * GB, 700 * MB, 200 * MB)
    assert not leaves_trial(1 * GB, 500 * MB + 1, 2 * GB, 700 * MB, 200 * MB)


def test_a_pack_job_that_does_not_fit_starts_on_trial_and_holds_nothing(tmp_path: Path) -> None:
    """Line 9 GB, used 1 GB, 7 GB held: a 3 GB pack job starts on trial (its floor fits);
    a strict one, or one whose floor does not fit, is refused."""
    guard, _ = fixture_guard(tmp_path, used=GB)
    assert guard.admit("big", memory_bytes=7 * GB, policy=PACK).admit
    assert not guard.admit("strict", memory_bytes=3 * GB).admit
    trial = guard.admit("trial", memory_bytes=3 * GB, policy=PACK)
    assert trial.admit and trial.summary.startswith("on trial")
    assert trial.estimate_bytes == 3 * GB  # its estimate, not the floor it was judged on
    assert guard.trials() == ["trial"]
    assert guard.statistics().reserved_bytes == 7 * GB
    full, _ = fixture_guard(tmp_path / "full", used=2 * GB)
    assert full.admit("big", memory_bytes=7 * GB, policy=PACK).admit
    assert not full.admit("trial", memory_bytes=3 * GB, policy=PACK).admit  # 9 GB + floor


def test_while_jobs_are_on_trial_pack_jobs_start_only_on_trial(tmp_path: Path) -> None:
    """The queue's order holds: a later pack job that would fit waits its turn as a trial, and
    past MAX_TRIALS it waits; a strict job is judged as ever."""
    guard, _ = fixture_guard(tmp_path, used=GB)
    assert guard.admit("big", memory_bytes=7 * GB, policy=PACK).admit
    assert guard.admit("t0", memory_bytes=3 * GB, policy=PACK).admit
    for n in range(1, MAX_TRIALS):
        assert guard.admit(f"t{n}", memory_bytes=100 * MB, policy=PACK).admit
    assert guard.trials() == [f"t{n}" for n in range(MAX_TRIALS)]
    late = guard.admit("late", memory_bytes=100 * MB, policy=PACK)
    assert not late.admit and f"waits for the {MAX_TRIALS} jobs on trial" in late.summary
    assert guard.admit("strict", memory_bytes=100 * MB).admit


def test_a_job_that_fits_whole_waits_behind_a_trial_whose_growth_leaves_no_room(
    tmp_path: Path,
) -> None:
    """Behind a trial that may still grow by 8 GB, 900 MB fits whole under the line (a trial
    holds nothing: 1 + 7 + 0.9 <= 9 GB) but not beside that trial's rest under the suspend
    line: it waits, and would not take the room the trial before it grows into."""
    guard, _ = fixture_guard(tmp_path, used=GB)
    assert guard.admit("big", memory_bytes=7 * GB, policy=PACK).admit
    assert guard.admit("t0", memory_bytes=8 * GB, policy=PACK).admit
    behind = guard.admit("behind", memory_bytes=900 * MB, policy=PACK)
    assert not behind.admit and "waits for the 1 jobs on trial" in behind.summary
    assert guard.trials() == ["t0"]


def test_a_reading_lets_a_trial_go_once_its_rest_fits(tmp_path: Path) -> None:
    """Each pressure reading ends the trials whose rest fits, oldest first, and carries what
    the jobs off trial claim (a growing job: the whole rest of its estimate)."""
    guard, clock = fixture_guard(tmp_path, used=GB)
    assert guard.admit("big", memory_bytes=7 * GB, policy=PACK).admit
    assert guard.admit("trial", memory_bytes=3500 * MB, policy=PACK).admit
    first = guard.pressure_reading()
    assert first is not None and first.claimed == 7 * GB and guard.trials() == ["trial"]
    clock.advance(IDLE_OBSERVE_SECONDS)
    guard.report_measured("big", 2 * GB)  # growing: claims its rest, 5 GB
    grown = guard.pressure_reading()
    assert grown is not None and grown.claimed == 5 * GB and guard.trials() == ["trial"]
    clock.advance(1.0)
    guard.report_measured("big", 2 * GB)
    guard.report_measured("trial", 0)
    # Settled, big claims its floor: 1 GB used + 64 MB + the trial's 3.5 GB fit under 9 GB.
    settled = guard.pressure_reading()
    assert guard.trials() == []
    # ... and, off trial, the former trial claims its whole rest too.
    assert settled is not None and settled.claimed == FLOOR_BYTES + 3500 * MB


def test_nothing_starts_on_trial_with_no_job_of_ours_to_yield_to(tmp_path: Path) -> None:
    """A trial is paused for older jobs; with none, it would be the oldest live job, which is
    never paused: a job that does not fit beside others' memory alone waits."""
    guard, _ = fixture_guard(tmp_path, used=GB)
    assert not guard.admit("alone", memory_bytes=8 * GB + 1, policy=PACK).admit
    assert guard.trials() == []


def reading(used: int, claimed: int = 0) -> Reading:
    return Reading(
        used=used,
        limit=2 * GB,
        headroom_percent=10.0,
        reserve=0,
        full_avg10=None,
        at=0.0,
        claimed=claimed,
    )


def live(name: str, started: float, **over: object) -> Live:
    fields: dict[str, object] = {"footprint": 300 * MB, "estimate": 500 * MB, **over}
    return Live(job_id=name, started=started, **fields)  # type: ignore[arg-type]


def test_the_newest_trial_is_paused_when_claims_pass_the_suspend_line() -> None:
    """used + claimed past the suspend line: the newest running trial is paused, launches wait,
    and it is not a hold of the ladder."""
    jobs = [live("old", 1), live("t1", 2, trial=True), live("t2", 3, trial=True)]
    plan, state = decide(
        LadderState(), reading(1 * GB, SUSPEND - GB + 1), jobs, SETTINGS, cooling=False
    )
    assert [(a.step, a.job_id, a.trial) for a in plan.actions] == [(Step.SUSPEND, "t2", True)]
    assert plan.hold and not state.holding
    calm, _ = decide(LadderState(), reading(1 * GB, SUSPEND - GB), jobs, SETTINGS, cooling=False)
    assert calm.actions == () and not calm.hold


def test_the_oldest_live_job_is_never_paused_and_goes_on_when_left_suspended() -> None:
    """A trial that is the oldest live job is never paused; a suspended oldest job goes on."""
    lone = [live("t1", 1, trial=True)]
    plan, _ = decide(LadderState(), reading(GB, 2 * GB), lone, SETTINGS, cooling=False)
    assert plan.actions == ()
    left = [live("t1", 1, trial=True, suspended=True), live("t2", 2, trial=True)]
    plan, _ = decide(LadderState(), reading(GB, 2 * GB), left, SETTINGS, cooling=False)
    assert [(a.step, a.job_id) for a in plan.actions] == [(Step.RESUME, "t1")]


def test_a_paused_trial_goes_on_oldest_first_once_claims_are_a_margin_below() -> None:
    """Resume at used + claimed + margin <= the suspend line, the oldest paused trial first,
    and not while a job off trial waits suspended."""
    jobs = [live("old", 1), live("t1", 2, trial=True, suspended=True)]
    jobs.append(live("t2", 3, trial=True, suspended=True))
    just = SUSPEND - GB - TRIAL_RESUME_MARGIN
    plan, _ = decide(LadderState(), reading(GB, just + 1), jobs, SETTINGS, cooling=False)
    assert plan.actions == () and plan.hold
    plan, _ = decide(LadderState(), reading(GB, just), jobs, SETTINGS, cooling=False)
    assert [(a.step, a.job_id, a.trial) for a in plan.actions] == [(Step.RESUME, "t1", True)]
    waiting = [live("old", 1), live("mid", 2, suspended=True, footprint=0, estimate=2 * GB)]
    waiting.append(live("t1", 3, trial=True, suspended=True))
    plan, _ = decide(LadderState(), reading(GB, 0), waiting, SETTINGS, cooling=False)
    assert [a.step for a in plan.actions] == [Step.HOLD]  # the suspended job's hold; no resume


def test_the_monitor_counts_trial_pauses_apart_from_the_ladders_steps() -> None:
    """A pause reaches the scheduler as a trial's pause and is counted as one, not as a
    suspension or a hold."""
    clock = FakeClock(0.0)
    target = FakeTarget([live("old", 1), live("t1", 2, trial=True)])
    feed = iter([reading(GB, GB)])
    m = PressureMonitor(
        target=target,
        read=lambda: next(feed),
        cooldown=Cooldown(clock),
        settings=lambda: SETTINGS,
        pace=MonitorPace(clock=clock),
    )
    m.tick()
    stats = m.statistics()
    assert target.done == [("pause", "t1")] and target.held == [True]
    assert (stats.trial_pauses, stats.suspensions, stats.holds) == (1, 0, 0)


def test_every_reading_of_live_jobs_tells_the_guard_their_footprints(tmp_path: Path) -> None:
    """The claims a trial is paused against move between launch rounds (none run while
    launches are held): each look at the live jobs reports their footprints to the guard."""
    guard, _ = fixture_guard(tmp_path, used=GB)
    tree = FakeHandle("x")
    scheduler = Scheduler(
        SchedulerSettings(
            logs_dir=tmp_path / "logs",
            limits=lambda: Limits(32, 8, 4, 2, 100.0, 10),
            pressure=False,
        ),
        parts=SchedulerParts(guard=guard, launcher=lambda job_id, spec: tree),
    )
    scheduler.submit(JobSpec(argv=["x"], memory_bytes=GB))
    scheduler.tick()
    assert guard.statistics().reserved_bytes == GB
    tree.footprint = 700 * MB
    scheduler.relief.live_jobs()
    reserved = guard.statistics().reserved_bytes
    scheduler.close()
    assert reserved == 300 * MB  # strict: its estimate less what it has measured


def test_with_no_trial_to_pause_a_suspended_job_is_resumed_as_before() -> None:
    """Claims past the suspend line pause a trial only where one runs: otherwise the ladder's
    own resume goes on as if packing had no trials."""
    jobs = [live("old", 1), live("mid", 2, suspended=True, footprint=400 * MB)]
    plan, _ = decide(LadderState(), reading(GB, 2 * GB), jobs, SETTINGS, cooling=False)
    assert [(a.step, a.job_id, a.trial) for a in plan.actions][-1] == (Step.RESUME, "mid", False)


def test_nothing_starts_on_trial_beside_strict_work_alone(tmp_path: Path) -> None:
    """A lease or a strict job may be work the monitor cannot see or pause: a trial yields
    only to pack jobs, so beside strict work alone a pack job waits for its whole estimate."""
    guard, _ = fixture_guard(tmp_path, used=GB)
    assert guard.admit("lease", memory_bytes=7 * GB).admit
    assert not guard.admit("pack", memory_bytes=3 * GB, policy=PACK).admit
    assert guard.trials() == []


def test_a_trial_that_holds_still_is_not_paused() -> None:
    """Pausing a trial that did not grow since the last reading takes no room back and keeps
    what it holds from being given back when it ends: the newest trial that grew is paused,
    and none while none grew."""
    jobs = [live("old", 1), live("t1", 2, trial=True), live("t2", 3, trial=True)]
    over = reading(1 * GB, SUSPEND - GB + 1)
    t1_grew = LadderState(footprints=(("old", 300 * MB), ("t1", 100 * MB), ("t2", 300 * MB)))
    plan, _ = decide(t1_grew, over, jobs, SETTINGS, cooling=False)
    assert [(a.step, a.job_id, a.trial) for a in plan.actions] == [(Step.SUSPEND, "t1", True)]
    still = LadderState(footprints=(("old", 300 * MB), ("t1", 300 * MB), ("t2", 300 * MB)))
    plan, _ = decide(still, over, jobs, SETTINGS, cooling=False)
    assert plan.actions == () and not plan.hold


def test_the_typical_peak_is_the_median_of_the_newest_once_enough_are_known() -> None:
    assert typical_peak([], prior=GB) == GB
    assert typical_peak([300 * MB] * (PEAKS_NEEDED - 1), prior=GB) == GB
    assert typical_peak([100 * MB, 900 * MB, 300 * MB], prior=GB) == 300 * MB
    assert typical_peak([100 * MB, 200 * MB, 300 * MB, 900 * MB], prior=GB) == 300 * MB


def test_a_trial_fits_when_the_room_holds_every_trials_rest_and_the_new_one() -> None:
    """What each trial may still grow by, and all the new one is expected to, under the room."""
    assert trial_fits(1000 * MB, 400 * MB, [300 * MB, 0])
    assert trial_fits(700 * MB, 400 * MB, [300 * MB, 0])
    assert not trial_fits(700 * MB - 1, 400 * MB, [300 * MB, 0])
    assert not trial_fits(100 * GB, MB, [0] * MAX_TRIALS)  # never more than MAX_TRIALS


def _trials_started(guard: Guard) -> int:
    """Beside a 4 GB pack job (1 GB used of a 9 GB line), how many jobs of unknown size start on
    trial before one is refused."""
    assert guard.admit("big", memory_bytes=4 * GB, policy=PACK).admit
    started = 0
    while guard.admit(f"t{started}", policy=PACK).admit:
        started += 1
    assert guard.trials() == [f"t{n}" for n in range(started)]
    return started


def test_the_number_of_trials_follows_the_room_and_the_work_seen(tmp_path: Path) -> None:
    """The suspend line (9.5 GB) less 4 GB used leaves 5.5 GB: with nothing seen, each trial is
    expected to grow to the default (1 GiB), so 5 fit; so too after jobs stopped short of their
    peak; once two jobs of unknown size ran to their end at 200 MB, trials are expected at
    that, and start up to MAX_TRIALS."""
    fresh, _ = fixture_guard(tmp_path / "fresh", used=4 * GB)
    assert _trials_started(fresh) == 5
    stopped, _ = fixture_guard(tmp_path / "stopped", used=4 * GB)
    for n in range(PEAKS_NEEDED):  # stopped (or cancelled) short of their peak: nothing learned
        assert stopped.admit(f"small{n}", policy=PACK).admit
        stopped.report_measured(f"small{n}", 200 * MB)
        stopped.release(f"small{n}")
    assert _trials_started(stopped) == 5
    seen, _ = fixture_guard(tmp_path / "seen", used=4 * GB)
    for n in range(PEAKS_NEEDED):
        assert seen.admit(f"small{n}", policy=PACK).admit
        seen.report_measured(f"small{n}", 200 * MB)
        seen.release(f"small{n}", ended_alone=True)
    assert _trials_started(seen) == MAX_TRIALS


def _shape_trials_started(guard: Guard, typical: int) -> int:
    """As :func:`_trials_started`, each trial told that its command shape peaks at ``typical``."""
    assert guard.admit("big", memory_bytes=4 * GB, policy=PACK).admit
    started = 0
    while guard.admit(f"t{started}", policy=PACK, typical_bytes=typical).admit:
        started += 1
    return started


def test_a_trial_is_expected_to_grow_to_its_command_shapes_typical_peak(tmp_path: Path) -> None:
    """5.5 GB under the suspend line: trials whose shape peaks at 2 GB are expected at that, so
    2 start, not the default's 5; at 700 MB, 7 start.  The shape's figure comes before the
    typical peak of all work seen here (200 MB: MAX_TRIALS would start)."""
    large, _ = fixture_guard(tmp_path / "large", used=4 * GB)
    assert _shape_trials_started(large, 2 * GB) == 2
    small, _ = fixture_guard(tmp_path / "small", used=4 * GB)
    assert _shape_trials_started(small, 700 * MB) == 7
    seen, _ = fixture_guard(tmp_path / "seen", used=4 * GB)
    for n in range(PEAKS_NEEDED):
        assert seen.admit(f"small{n}", policy=PACK).admit
        seen.report_measured(f"small{n}", 200 * MB)
        seen.release(f"small{n}", ended_alone=True)
    assert _shape_trials_started(seen, 2 * GB) == 2


def test_a_shapes_typical_peak_does_not_size_a_job_with_an_estimate_of_its_own(
    tmp_path: Path,
) -> None:
    """A stated (or learned) estimate is the job's own: its shape says nothing more of it.
    3 GB used and 4 GB held leave room for one 1.5 GB job whole; then 6.5 GB under the suspend
    line hold 4 trials expected at 1.5 GB each (at the shape's 100 MB, MAX_TRIALS would)."""

    def trials(name: str, typical: int | None) -> list[str]:
        guard, _ = fixture_guard(tmp_path / name, used=3 * GB)
        assert guard.admit("big", memory_bytes=4 * GB, policy=PACK).admit
        count = 0
        while guard.admit(
            f"t{count}", memory_bytes=3 * GB // 2, policy=PACK, typical_bytes=typical
        ).admit:
            count += 1
        return guard.trials()

    assert trials("with", GB // 10) == trials("without", None) == ["t1", "t2", "t3", "t4"]


def test_a_job_of_unknown_size_claims_its_forecast_not_the_rest_of_the_default(
    tmp_path: Path,
) -> None:
    """The default is a guess: once a job of unknown size is seen growing, it claims against
    the trials what its growth forecasts; a job whose size was given claims all of its rest."""
    claims = []
    for name, given in (("guessed", None), ("given", 1 << 30)):
        guard, clock = fixture_guard(tmp_path / name, used=GB)
        assert guard.admit(name, memory_bytes=given, policy=PACK).admit
        for measured in (100 * MB, 300 * MB):
            clock.advance(1.0)
            guard.report_measured(name, measured)
        read = guard.pressure_reading()
        assert read is not None
        claims.append(read.claimed)
    forecast = int(200 * MB * HORIZON_SECONDS) + FLOOR_BYTES  # 200 MB/s over the last second
    assert claims == [forecast, (1 << 30) - 300 * MB]


def test_a_trial_that_still_grows_is_paused_though_it_rose_little_since_the_last_reading() -> None:
    """A slow grower rises less than the ladder's noise between two readings (and less still
    when it reads faster near the line): its growth measured over the last seconds counts."""
    over = reading(1 * GB, SUSPEND - GB + 1)
    jobs = [live("old", 1), live("t1", 2, trial=True, growing=True), live("t2", 3, trial=True)]
    still = LadderState(footprints=(("old", 300 * MB), ("t1", 300 * MB), ("t2", 300 * MB)))
    plan, _ = decide(still, over, jobs, SETTINGS, cooling=False)
    assert [(a.step, a.job_id, a.trial) for a in plan.actions] == [(Step.SUSPEND, "t1", True)]


def test_a_rerun_is_no_guess_and_teaches_nothing_of_work_of_unknown_size(tmp_path: Path) -> None:
    """A job run again after a stop is asked with what its run showed: its peak is not a peak
    of work nobody has seen (with it, two peaks would be known and the typical 2 GB)."""
    guard, _ = fixture_guard(tmp_path, used=4 * GB)
    assert guard.admit("small", policy=PACK).admit
    guard.report_measured("small", 200 * MB)
    guard.release("small", ended_alone=True)
    assert guard.admit("again", policy=PACK, rerun=Rerun(peak=2 * GB, ours=0)).admit
    guard.report_measured("again", 2 * GB)
    guard.release("again", ended_alone=True)
    assert _trials_started(guard) == 5  # the default still sizes the trials


def test_with_the_guard_off_nothing_waits_for_trials(tmp_path: Path) -> None:
    """Turned off while a job is on trial, the guard admits every job without a check, none on
    trial and none told to wait for the trials before it."""
    env = {**NO_DISK}  # the guard reads its variables on every call
    guard, _ = fixture_guard(tmp_path, used=GB, env=env)
    assert guard.admit("big", memory_bytes=7 * GB, policy=PACK).admit
    assert guard.admit("t0", memory_bytes=3 * GB, policy=PACK).admit
    assert guard.trials() == ["t0"]
    env["ROOMKEEPER_GUARD"] = "off"
    late = guard.admit("late", memory_bytes=100 * MB, policy=PACK)
    assert late.admit and late.summary.startswith("guard off")
    assert guard.trials() == ["t0"]

"""The relief ladder, pure: which step memory pressure calls for, from one reading.

Admission (:mod:`roomkeeper.guard.rule`) judges a job before it starts;
the ladder watches what admitted work does afterwards, under sustained
memory pressure::

    headroom = limit - memory_line(limit, headroom%)      (the guard's headroom)
    hold     when used > line                              (new launches wait: ``pressure``)
    suspend  when used (past the line: or used plus its last rise) > memory_line +
             headroom / 2 and rising: the newest suspendable tree, and every other
             newer tree that grew since the last reading
    stop     when used > limit - headroom / 4, or PSI full avg10 > FULL% for SECONDS:
             the newest tree, restartable work first (a last run last), and every
             other newer tree that grew is suspended; then a cooldown holds admission.
             A granted lease whose holder gave a ``relieve`` hook is chosen the same
             way, newest first: its holder is asked to end that turn (``relieve``);
             a lease without the hook is never chosen
    resume   suspended trees, oldest first, once one fits under the line again and
             used is not rising (before anything new is admitted)
    pause    a job on trial (packing), newest first, when used + what the jobs not on
             trial claim > the suspend line; go on, oldest first, once it is
             TRIAL_RESUME_MARGIN below and no job off trial waits suspended
             (launches wait meanwhile; not counted as a hold)
    unblock  when the oldest suspended tree cannot go on, stop the newest suspended
             tree that would run again, for which the suspended trees have waited
             together as long as it had run, and whose memory alone lets the oldest
             go on

The progress guarantee: the oldest live job is never suspended or stopped for
newer ones, and one that became the oldest while suspended goes on at once;
when it is the only one left and the stop rule still holds, it alone
outgrows the container and is stopped as one that can never fit here.
One victim at a time: while a stopped tree is still going, no other is chosen.

Why unblock: a suspended tree keeps its memory, so trees frozen together can
wait for one another until a running job ends, minutes for long work, every
one of them idle.  Stopping one of them gives its memory to the older ones at
the cost of what it had done; waiting costs the idle time of every suspended
tree, all of them held by the memory the frozen ones keep.  The rung waits
until that idle time, added up since the tree was frozen, equals the work a
stop would throw away (the rent-or-buy rule).  Where the stop lets every
counted tree go on, that never costs more than twice the better of the two
choices made knowing when memory comes back.  Where it lets only the oldest
go on by the others' estimates, the rung stops sooner than that bound asks:
their estimates are often a guess's, and trees frozen together past the line
have mostly done their growing, so the others can follow as used falls.
Counting the victim's own idle time alone kept a first wave of blind starts
(one more than fit, all frozen together) idle until it alone had waited as
long as it ran, every other tree idle beside it.

Why every growing tree at once, and why the last rise counts: where the
monitor reads slowly (a busy or emulated machine, no kernel notification),
several trees grow together between two readings, and the quarter headroom
left past the suspend line is gone before a second reading could take a
second tree.  Freezing loses nothing, so the ladder freezes all the growth
it saw, and acts one reading early when the rise it saw would carry used
past the line by the next one.

Nothing here reads the kernel, a clock or a thread: :func:`decide` takes a
:class:`Reading`, the live jobs and the ladder's :class:`LadderState`, and
returns the :class:`Plan` and the next state.  The monitor
(:mod:`roomkeeper.relief.monitor`) takes the readings and acts.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace

from roomkeeper.config import PressureSettings
from roomkeeper.guard.lines import Reading
from roomkeeper.guard.packing import TRIAL_RESUME_MARGIN
from roomkeeper.guard.rule import Word, gb

RISE_BYTES = 1 << 20  # less than this between two readings is noise, not growth


class Step(enum.Enum):
    """What one rung of the ladder does."""

    HOLD = "hold"  # new launches wait (reason ``pressure``)
    SUSPEND = "suspend"  # freeze one tree: its growth stops, nothing is lost
    RESUME = "resume"  # let a suspended tree go on
    STOP = "stop"  # stop one tree, keep its output, start the cooldown
    RELIEVE = "relieve"  # ask a lease's holder to end its turn now (its relieve hook)


class PressureReason(Word):
    """Why the ladder holds, pauses or stops work: what a job and the API say of its steps."""

    PRESSURE = "pressure", "launches held for memory pressure"  # past the line, or cooldown
    MEMORY_PRESSURE = "memory_pressure", "memory pressure"  # suspended, stopped or queued again
    ON_TRIAL = "on_trial", "paused on trial (older jobs' growth needs the room)"  # packing


@dataclass(frozen=True, slots=True)
class Live:
    """One live job as the ladder sees it.

    Attributes:
        job_id: the scheduler's id.
        started: monotonic seconds of its launch: the order of age.
        footprint: its tree's memory now.
        estimate: the memory it was admitted with.
        suspended: frozen now.
        suspendable: its tree can be frozen.
        restartable: it may be stopped and queued again.
        stopping: a stop was asked and its tree is not gone yet.
        trial: started on trial (packing): paused and resumed by the trial's own rule.
        last_run: the last run of restartable work stopped for pressure before, admitted
            with its worst case reserved and holding no more than it reserved: stopped only
            when no newer job is left to stop.
        lease: a granted lease with a relieve hook, not a tree: its work runs in another
            process, so it is never suspended; at the stop rung it is relieved instead.
        growing: its measured growth over the last seconds is still upward (a slow grower
            may rise less than :data:`RISE_BYTES` between two readings).
        runs_again: a stop for pressure would queue it again (restartable, re-runs left).
        ran_s: seconds this run of it has run, its suspensions left out.
        suspended_s: seconds it has been suspended now (0 while it runs).
    """

    job_id: str
    started: float
    footprint: int
    estimate: int
    suspended: bool = False
    suspendable: bool = True
    restartable: bool = False
    stopping: bool = False
    trial: bool = False
    last_run: bool = False
    lease: bool = False
    growing: bool = False
    runs_again: bool = False
    ran_s: float = 0.0
    suspended_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Action:
    """One step to take now: which, on which job, and why in numbers."""

    step: Step
    job_id: str | None
    why: str
    never_fits: bool = False  # a stop of a job that alone outgrows the container
    trial: bool = False  # a pause or a resume of a job on trial, not a rung of the ladder


@dataclass(frozen=True, slots=True)
class Plan:
    """What one reading calls for.

    Attributes:
        hold: whether new launches wait now (past the line, a suspended or paused job,
            the cooldown).
        actions: the steps to take, in order (at most one resume or stop; suspensions of
            every newer tree that grew).
        crossed: the step whose threshold this reading crossed, for the reaction time.
        unrelieved: the stop rung called for a victim and there was none to choose (no
            job of ours, no lease with a relieve hook): the monitor says so.
    """

    hold: bool
    actions: tuple[Action, ...]
    crossed: Step | None = None
    unrelieved: bool = False


@dataclass(frozen=True, slots=True)
class LadderState:
    """What the ladder remembers between readings.

    Attributes:
        last_used: the previous reading's used bytes (None before the first).
        full_since: when PSI full first stayed above the threshold (None while below).
        holding: whether the previous plan held launches for pressure (a paused trial
            alone does not count).
        above: the highest threshold the previous reading was past.
        footprints: each live job's footprint at the previous reading (job id, bytes).
    """

    last_used: int | None = None
    full_since: float | None = None
    holding: bool = False
    above: Step | None = None
    footprints: tuple[tuple[str, int], ...] = ()


_ORDER = {None: 0, Step.HOLD: 1, Step.SUSPEND: 2, Step.STOP: 3}


def decide(
    state: LadderState,
    reading: Reading,
    live: Sequence[Live],
    settings: PressureSettings,
    *,
    cooling: bool,
    cooling_left_s: float = 0.0,
    stopping: bool = False,
    leases: Sequence[Live] = (),
) -> tuple[Plan, LadderState]:
    """The plan for one reading, and the ladder's next state.

    Args:
        state: what the previous call returned (``LadderState()`` first).
        reading: the container now.
        live: every live job (running or suspended), any order.
        settings: the ROOMKEEPER_PRESSURE_* variables.
        cooling: whether the shared cooldown clock holds admission now.
        cooling_left_s: how long it holds still, for the words of a hold it alone causes.
        stopping: whether a tree stopped earlier is still going, its job in ``live`` or
            not (a leader can die before the members that hold the memory), or a relieved
            lease's memory is still awaited.
        leases: the granted leases that may be relieved (a relieve hook not yet called),
            each a :class:`Live` with ``lease`` set; chosen at the stop rung only.
    """
    rise = 0 if state.last_used is None else reading.used - state.last_used
    rising = rise > RISE_BYTES
    full_since = _full_since(state.full_since, reading, settings)
    critical = full_since is not None and reading.at - full_since >= settings.full_seconds
    above = _above(reading, critical, rise if rising else 0)
    by_age = sorted(live, key=lambda j: j.started)
    grew = _grew(dict(state.footprints), by_age)
    # Stop victims: our trees and the leases that can be relieved, oldest first.
    pool = sorted([*live, *leases], key=lambda j: j.started)
    actions: list[Action] = []
    unrelieved = False
    if above is Step.STOP:
        # What grows is frozen as well: a stop takes time to give memory back.
        freeze = _suspend(reading, by_age, grew, rise, newest=False) if rising else []
        if not critical and reading.used <= reading.stop_line and (freeze or len(pool) < 2):
            # Only the rise points past the stop line: freezing it is enough, and a guess
            # never stops the oldest job alone as one that can never fit.
            actions += freeze
        else:
            actions += [] if stopping else _stop(reading, pool, critical, rise)
            unrelieved = not stopping and not pool
            stopped = {a.job_id for a in actions}
            actions += [a for a in freeze if a.job_id not in stopped]
    elif above is Step.SUSPEND and rising:
        actions += _suspend(reading, by_age, grew, rise, newest=True)
    elif by_age and by_age[0].suspended and not by_age[0].stopping:
        actions += [_go_on_oldest(by_age[0])]
    elif pause := _pause_trial(reading, by_age, grew):
        actions += pause
    elif (
        not rising
        and above in (None, Step.HOLD)
        and (going_on := _resume(reading, by_age) or _resume_trial(reading, by_age))
    ):
        actions += going_on
    elif not rising and not stopping:
        actions += _unblock(reading, by_age)
    pressure = above is not None or cooling or any(j.suspended and not j.trial for j in live)
    acting = (Step.SUSPEND, Step.STOP, Step.RELIEVE)
    pressure = pressure or any(a.step in acting and not a.trial for a in actions)
    if pressure and not state.holding:
        why = _hold_why(reading, above, cooling, cooling_left_s, live)
        actions.insert(0, Action(Step.HOLD, None, why))
    # A paused trial holds launches too (nothing starts past it), but it is packing at
    # work, not a rung of the ladder: it is not counted as a hold.
    paused = any(j.suspended and j.trial for j in live)
    paused = paused or any(a.step is Step.SUSPEND and a.trial for a in actions)
    hold = pressure or paused
    crossed = above if _ORDER[above] > _ORDER[state.above] else None
    next_state = replace(
        state,
        last_used=reading.used,
        full_since=full_since,
        holding=pressure,
        above=above,
        footprints=tuple((j.job_id, j.footprint) for j in live),
    )
    plan = Plan(hold=hold, actions=tuple(actions), crossed=crossed, unrelieved=unrelieved)
    return plan, next_state


def _full_since(since: float | None, reading: Reading, settings: PressureSettings) -> float | None:
    """When PSI full went above the threshold and stayed there; None while it is below."""
    if reading.full_avg10 is None or reading.full_avg10 <= settings.full_percent:
        return None
    return reading.at if since is None else since


def _above(reading: Reading, critical: bool, rise: int) -> Step | None:
    """The highest rung whose threshold this reading is past, or, once past the line, will be
    past by the next reading if used rises as it just did (``rise``)."""
    if critical or reading.used > reading.stop_line:
        return Step.STOP
    if reading.used <= reading.hold_line:
        return None
    if reading.used > reading.suspend_line and reading.used + rise > reading.stop_line:
        return Step.STOP
    if reading.used + rise > reading.suspend_line:
        return Step.SUSPEND
    return Step.HOLD


def _hold_why(
    reading: Reading, above: Step | None, cooling: bool, left_s: float, live: Sequence[Live]
) -> str:
    """What holds launches, in words: the line crossed, else the cooldown (with the seconds
    it holds still), else the suspended trees; never a crossing that did not happen."""
    if above is not None:
        return _figures(reading, "line", reading.hold_line)
    under = f"used {gb(reading.used)} <= line {gb(reading.hold_line)} GB"
    if cooling:
        return f"cooldown after a stop or a relief, {left_s:.0f} s left ({under})"
    suspended = sum(1 for j in live if j.suspended and not j.trial)
    if suspended:
        return f"{suspended} suspended job(s) still hold their memory ({under})"
    return f"a step of the ladder is under way ({under})"


def _figures(reading: Reading, name: str, line: int) -> str:
    """The numbers of a step, in decimal GB (no path, no command)."""
    text = f"used {gb(reading.used)} > {name} {gb(line)} (limit {gb(reading.limit)}, GB)"
    if reading.full_avg10 is not None:
        text += f", PSI full avg10 {reading.full_avg10:.1f} %"
    return text


def _stop(reading: Reading, by_age: list[Live], critical: bool, rise: int) -> list[Action]:
    """Stop the newest tree or relieve the newest lease (restartable work and leases first,
    a last run last), never the oldest for newer ones."""
    if any(j.stopping for j in by_age):
        return []  # one victim at a time: wait until it is gone
    if reading.used > reading.stop_line:
        why = _figures(reading, "stop line", reading.stop_line)
    elif critical:
        why = f"PSI full avg10 {reading.full_avg10:.1f} % sustained"
    else:
        why = _projected(reading, rise, "stop line", reading.stop_line)
    if not by_age:
        return []
    newer = by_age[1:]
    if not newer:  # the oldest alone: it outgrows the container by itself
        if by_age[0].lease:
            return [Action(Step.RELIEVE, by_age[0].job_id, why)]
        return [Action(Step.STOP, by_age[0].job_id, why, never_fits=True)]
    # A last run keeping to the worst case it reserved: what outgrew its estimate is
    # someone else, and stopping it would give up work that fits.  A lease's turn is
    # ended by its own holder, who asked to be relieved: as restartable as work gets.
    victim = max(newer, key=lambda j: (not j.last_run, j.restartable or j.lease, j.started))
    return [Action(Step.RELIEVE if victim.lease else Step.STOP, victim.job_id, why)]


def _grew(before: dict[str, int], by_age: list[Live]) -> set[str]:
    """The jobs whose footprint rose since the previous reading (a job new since then: by
    all it has)."""
    return {j.job_id for j in by_age if j.footprint - before.get(j.job_id, 0) > RISE_BYTES}


def _projected(reading: Reading, rise: int, name: str, line: int) -> str:
    """Why a step is taken one reading early, in numbers."""
    return (
        f"used {gb(reading.used)} + its last rise {gb(rise)} > {name} {gb(line)} "
        f"(limit {gb(reading.limit)}, GB)"
    )


def _suspend(
    reading: Reading, by_age: list[Live], grew: set[str], rise: int, *, newest: bool
) -> list[Action]:
    """Suspend the newest suspendable running tree (with ``newest``) and every other one that
    grew since the last reading, newest first; never the oldest."""
    candidates = [j for j in by_age[1:] if j.suspendable and not j.suspended and not j.stopping]
    victims = [
        j for j in reversed(candidates) if j.job_id in grew or (newest and j is candidates[-1])
    ]
    if reading.used > reading.suspend_line:
        why = _figures(reading, "line", reading.suspend_line)
    elif reading.used + rise > reading.suspend_line:
        why = _projected(reading, rise, "line", reading.suspend_line)
    else:  # frozen beside a stop for sustained PSI pressure, below the line
        why = f"it grows beside a stop: {_figures(reading, 'line', reading.suspend_line)}"
    return [Action(Step.SUSPEND, j.job_id, why) for j in victims]


def _go_on_oldest(job: Live) -> Action:
    """The progress guarantee: the oldest live job never waits suspended (the older ones it
    waited for have ended), whatever it still expects to grow."""
    return Action(Step.RESUME, job.job_id, "it is the oldest live job now", trial=job.trial)


def _pause_trial(reading: Reading, by_age: list[Live], grew: set[str]) -> list[Action]:
    """Pause the newest job on trial that grew since the last reading or still grows (never the
    oldest live job): the others' claims need the room it grows into.  Nothing while they do
    not, or no trial grows: a trial that holds still takes no more, and pausing it only keeps
    what it holds from being given back when it ends."""
    if reading.used + reading.claimed <= reading.suspend_line:
        return []
    running = [
        j
        for j in by_age[1:]
        if j.trial
        and (j.job_id in grew or j.growing)
        and j.suspendable
        and not (j.suspended or j.stopping)
    ]
    if not running:
        return []
    why = (
        f"used {gb(reading.used)} + claimed {gb(reading.claimed)} > suspend line "
        f"{gb(reading.suspend_line)} (GB)"
    )
    return [Action(Step.SUSPEND, running[-1].job_id, why, trial=True)]


def _resume_trial(reading: Reading, by_age: list[Live]) -> list[Action]:
    """Let the oldest paused job on trial go on once used and the others' claims are
    :data:`TRIAL_RESUME_MARGIN` below the suspend line, and no job off trial is suspended."""
    if any(j.suspended and not j.trial for j in by_age):
        return []
    if reading.used + reading.claimed + TRIAL_RESUME_MARGIN > reading.suspend_line:
        return []
    for job in by_age:
        if job.trial and job.suspended and not job.stopping:
            why = (
                f"used {gb(reading.used)} + claimed {gb(reading.claimed)} <= suspend line "
                f"{gb(reading.suspend_line)} less {gb(TRIAL_RESUME_MARGIN)} (GB)"
            )
            return [Action(Step.RESUME, job.job_id, why, trial=True)]
    return []


def _unblock(reading: Reading, by_age: list[Live]) -> list[Action]:
    """Stop the newest suspended tree that would run again, for which the suspended trees
    have waited together as long as it had run, and whose memory back lets the oldest
    suspended one go on, when that one cannot go on by itself (see the module's
    rent-or-buy note)."""
    waiting = [j for j in by_age if j.suspended and not j.trial and not j.stopping]
    if len(waiting) < 2:
        return []  # one alone waits for running work, not for another suspended tree
    oldest = waiting[0]
    rest = max(0, oldest.estimate - oldest.footprint)  # it does not fit: else it went on
    for job in reversed(waiting[1:]):
        # Every tree frozen since it was waits on the memory the frozen ones hold: their
        # idle time together is what not stopping it has cost.
        idle = sum(min(j.suspended_s, job.suspended_s) for j in waiting)
        # A run of no length (frozen as it began) throws nothing away, but it is no
        # evidence either: waiting has cost nothing yet.
        if not job.runs_again or job.ran_s <= 0 or idle < job.ran_s:
            continue
        # Trees frozen together grow unevenly and are frozen at different readings: the
        # newest may hold too little, or have run longer than it was waited for, while
        # an older one beside it qualifies; waiting for memory to free by itself can take
        # minutes.
        if reading.used - job.footprint + rest > reading.hold_line:
            continue
        why = (
            f"{len(waiting)} suspended tree(s) idle {idle:.0f} s together since it was "
            f"suspended {job.suspended_s:.0f} s ago, after running {job.ran_s:.0f} s; its "
            f"{gb(job.footprint)} lets job {oldest.job_id} go on: used {gb(reading.used)} - "
            f"{gb(job.footprint)} + its rest {gb(rest)} <= line {gb(reading.hold_line)} (GB)"
        )
        return [Action(Step.STOP, job.job_id, why)]
    return []  # no one tree's memory would let the oldest go on: waiting costs less


def _resume(reading: Reading, by_age: list[Live]) -> list[Action]:
    """Resume the oldest suspended tree once what it still expects to grow fits under the line."""
    for job in by_age:
        if not job.suspended or job.stopping or job.trial:
            continue
        still = max(0, job.estimate - job.footprint)
        if reading.used + still <= reading.hold_line:
            why = (
                f"used {gb(reading.used)} + its rest {gb(still)} <= line "
                f"{gb(reading.hold_line)} (GB)"
            )
            return [Action(Step.RESUME, job.job_id, why)]
        return []  # oldest first: a younger one never goes before it
    return []

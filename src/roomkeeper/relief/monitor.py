"""The pressure monitor: its own thread, reading the container every 100 ms, acting on the ladder.

Admission cannot see what a job does once it runs.  The monitor reads the
same non-reclaimable usage of the container the guard reads, and PSI memory,
at least every :data:`INTERVAL_S`, and wakes at once where the kernel can
say so (:mod:`roomkeeper.kernel.notify`: a v1 usage threshold, a v2 PSI
trigger or a change of ``memory.events``).  Each reading goes through the
pure ladder (:func:`roomkeeper.relief.ladder.decide`); its plan is carried
out through the scheduler (:class:`Target`), whose lock guards every record.

It runs on a thread of its own, so a busy event loop or a slow launch round
cannot delay it.  It measures its reaction time (from the reading, or the
kernel's notification, that crossed a threshold, to the step taken) and
counts every step; :meth:`PressureMonitor.statistics` is the snapshot the
benchmark, the API and ``roomkeeper batch`` show.  It never touches a
process it did not start: it acts only on the scheduler's own jobs, and
asks a lease's holder, through the relieve hook the holder gave, to end
its turn (:class:`LeaseTarget`).

A relief is one victim like a stop: the hook is called once, and the lease
counts as relieved once its hook answered and used memory fell by about its
share (:data:`RELIEVED_SHARE` of what it reserved) within
:data:`RELIEF_WAIT_S`; else, or when the hook failed, it counts as not
relieved and the ladder goes on to its next victim.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import select
import statistics as stats
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from roomkeeper.config import PressureSettings, read_pressure_settings
from roomkeeper.guard.lines import Reading
from roomkeeper.guard.rule import gb
from roomkeeper.kernel.notify import Notifier
from roomkeeper.relief.cooldown import Cooldown, CooldownCause
from roomkeeper.relief.ladder import (
    RISE_BYTES,
    Action,
    LadderState,
    Live,
    Plan,
    Step,
    decide,
)

log = logging.getLogger("roomkeeper")

INTERVAL_S = 0.1  # the pressure monitor reads at least this often
# Near the line it reads ten times as often: where no kernel notification can be armed
# (a read-only cgroup file system), jobs growing together cover the quarter headroom
# between the suspend and stop lines, and the last quarter to the limit, in less than
# 100 ms.  A reading costs well under a millisecond, so this is cheap while it lasts.
NEAR_INTERVAL_S = 0.01
SLOW_READING_S = 0.5  # a reading that takes longer is logged with where its time went
SLOW_SAID_EVERY_S = 10.0  # ... at most this often
REACTIONS_KEPT = 1000  # reaction times kept for the percentiles (the latest)
RELIEF_WAIT_S = 5.0  # a relieved lease's memory must be back within this (the hook's 3 s too)
RELIEVED_SHARE = 0.5  # ... by at least this share of what the lease reserved (and 1 MiB)
UNRELIEVED_SAID_EVERY_S = 10.0  # "nothing to act on" is logged at most this often


class Target(Protocol):
    """What the monitor acts on: the scheduler's live jobs, under the scheduler's lock."""

    def live_jobs(self) -> list[Live]:
        """Every running or suspended job, with its footprint now."""
        ...

    def hold_for_pressure(self, hold: bool) -> None:
        """Hold new launches (reason ``pressure``), or let them go."""
        ...

    def suspend_for_pressure(self, job_id: str, *, trial: bool = False) -> bool:
        """Suspend the job's tree (a pause of a job on trial when ``trial``); whether it is
        suspended now."""
        ...

    def suspend_all_for_pressure(self, job_ids: list[str]) -> list[str]:
        """Suspend several trees, each halted before any is walked; the ones suspended now."""
        ...

    def resume_after_pressure(self, job_id: str) -> bool:
        """Let the job's tree go on; whether it runs now."""
        ...

    def stop_in_progress(self) -> bool:
        """Whether a tree stopped earlier is still going (its job may have left the list)."""
        ...

    def stop_for_pressure(self, job_id: str, why: str, *, never_fits: bool) -> bool:
        """Stop the job's tree, keeping its output; whether a stop was started."""
        ...


class LeaseTarget(Protocol):
    """The gateway's leases, as the ladder may relieve them."""

    def relievable(self) -> list[Live]:
        """Granted leases with a relieve hook not yet called, ``lease`` set, their
        ``started`` on the monitor's clock and ``estimate`` what they reserve."""
        ...

    def unrelievable(self) -> tuple[int, int]:
        """(how many granted leases carry no relieve hook, what they reserve together)."""
        ...

    def relieve(self, lease_id: str, why: str) -> concurrent.futures.Future[str] | None:
        """Call the lease's relieve hook (once ever); its outcome in words, None when the
        lease cannot be relieved now (ended meanwhile)."""
        ...

    def settle(self, lease_id: str, relieved: bool, outcome: str, freed: int) -> None:
        """Record how a relief went (``freed``: how far used fell); a relieved lease ends
        ``relieved``."""
        ...


@dataclass(frozen=True, slots=True)
class _Relieving:
    """The one relief awaited: whose, what it reserved, used memory when asked."""

    lease_id: str
    share: int
    used: int
    asked: float
    hook: concurrent.futures.Future[str]


@dataclass(frozen=True, slots=True)
class ReliefEvent:
    """One step taken, in numbers only (the gateway's recovery history keeps it).

    Attributes:
        step: which rung.
        job_id: the job it acted on (None for a hold).
        used_bytes: the container's used memory when it was decided.
        limit_bytes: the container's limit.
        footprint_bytes: the job's memory then (0 for a hold).
        reaction_s: from the crossing to the step taken (None for a resume).
        why: the numbers in words, for the log.
        never_fits: a stop of a job that alone outgrows the container.
    """

    step: Step
    job_id: str | None
    used_bytes: int
    limit_bytes: int
    footprint_bytes: int
    reaction_s: float | None
    why: str
    never_fits: bool = False


@dataclass(frozen=True, slots=True)
class MonitorStatistics:
    """A snapshot of the monitor's counts and reaction times.

    Attributes:
        holds: how many times launches began to be held for pressure.
        suspensions: trees suspended.
        resumes: trees resumed.
        stops: trees stopped for pressure.
        reruns: restartable jobs queued again after a stop (the scheduler's count).
        reaction_p50_s: the median reaction time (None before the first step).
        reaction_max_s: the longest reaction time (None before the first step).
        trial_pauses: pauses of jobs on trial (packing at work, not rungs of the ladder).
        readings: readings taken.
        woken: readings a kernel notification woke the monitor for.
        wakes_on: what wakes it, in words ("polling only (...)" without notifications).
        holding: whether launches are held for pressure now.
        trial_pauses: pauses of jobs on trial (packing at work, not rungs of the ladder).
        relieves: leases whose holders were asked to end their turn.
        relieved: of those, the leases whose memory came back.
    """

    holds: int
    suspensions: int
    resumes: int
    stops: int
    reruns: int
    reaction_p50_s: float | None
    reaction_max_s: float | None
    readings: int
    woken: int
    wakes_on: str
    holding: bool
    trial_pauses: int = 0
    relieves: int = 0
    relieved: int = 0


@dataclass(frozen=True, slots=True)
class MonitorPace:
    """When the monitor reads: its clock, how often, and what wakes it sooner.

    Attributes:
        clock: monotonic seconds.
        interval: seconds between readings without a notification.
        arm: arms kernel notifications for a reading's group (None: polling only).
    """

    clock: Callable[[], float] = time.monotonic
    interval: float = INTERVAL_S
    arm: Callable[[Notifier, Reading], None] | None = None


class PressureMonitor:
    """Reads the container, decides with the ladder, acts through the scheduler.

    Args:
        target: the scheduler's side (:class:`Target`).
        read: one reading now, None where memory is unknown or nothing is protected
            (then the monitor does nothing).
        cooldown: the one cooldown clock, shared with the supervisor's relief.
        settings: the ROOMKEEPER_PRESSURE_* variables, read afresh for each reading.
        pace: its clock, interval and notifications; polling on the real clock when omitted.
        on_step: told of every step taken (the gateway's history), never under a lock.
        reruns: how many restartable jobs the scheduler queued again.
    """

    def __init__(
        self,
        *,
        target: Target,
        read: Callable[[], Reading | None],
        cooldown: Cooldown,
        settings: Callable[[], PressureSettings] = read_pressure_settings,
        pace: MonitorPace | None = None,
        on_step: Callable[[ReliefEvent], None] | None = None,
        reruns: Callable[[], int] = lambda: 0,
    ) -> None:
        pace = pace if pace is not None else MonitorPace()
        self._target = target
        self._read = read
        self._cooldown = cooldown
        self._settings = settings
        self._arm = pace.arm
        self._clock = pace.clock
        self._on_step = on_step
        self._reruns = reruns
        self._interval = pace.interval
        self._state = LadderState()
        self._crossed: dict[Step, float] = {}  # when each threshold was crossed, until acted on
        self._lock = threading.Lock()  # the counts
        self._counts = {step: 0 for step in Step}
        self._reactions: deque[float] = deque(maxlen=REACTIONS_KEPT)
        self._readings = 0
        self._woken = 0
        self._trial_pauses = 0
        self._notifier = Notifier()
        self._armed_for: tuple[int, int] | None = None
        self._wakes_on = "not armed yet" if pace.arm is not None else "polling only (not armed)"
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        # Made by start(), written once by close(): the wait wakes at once instead of at the
        # end of its interval.  A monitor never started holds no descriptor.
        self._wake_r = self._wake_w = -1
        self._near = False  # the last reading was near the line: read again sooner
        self._slow_said = float("-inf")  # when a slow reading was last logged
        self._leases: LeaseTarget | None = None
        self._relieving: _Relieving | None = None
        self._shares: dict[str, int] = {}  # what each relievable lease reserves, this reading
        self._relieved = 0
        self._unrelieved_said = float("-inf")

    def watch_leases(self, leases: LeaseTarget) -> None:
        """Let the ladder relieve the gateway's leases (before :meth:`start`)."""
        self._leases = leases

    # ------------------------------------------------------------ one reading

    def tick(self, *, woken_at: float | None = None) -> Plan | None:
        """Take one reading and carry out its plan; None when nothing could be read.

        Args:
            woken_at: when a kernel notification woke the monitor, the crossing's
                time for the reaction (it is earlier than the reading).
        """
        began = self._clock()
        # A stop still going, then the live jobs, then the reading: a stopped tree that is
        # gone gave its memory back before the reading, so the reading never shows memory
        # of a stop the ladder no longer waits for (a second victim would be chosen for it).
        stopping = self._target.stop_in_progress()
        live = self._target.live_jobs()
        leases = [] if self._leases is None else self._leases.relievable()
        self._shares = {j.job_id: j.estimate for j in leases}
        live_s = self._clock() - began
        reading = self._read()
        if reading is None:
            self._near = False
            return None
        read_s = self._clock() - began - live_s
        self._near = reading.used >= reading.hold_line - reading.headroom // 2
        if self._arm is not None and self._armed_for != (reading.limit, reading.hold_line):
            self._rearm(reading)  # the first reading, or the container's limit moved
        settings = self._settings()
        # One victim at a time: a lease asked to end its turn is awaited like a stopped tree.
        stopping = self._settle_relief(reading) or stopping
        if not settings.cooldown_fixed:
            self._end_cooldown_once_relieved(reading, stopping)
        cooling_left_s = self._cooldown.remaining()
        plan, self._state = decide(
            self._state,
            reading,
            live,
            settings,
            cooling=cooling_left_s > 0,
            cooling_left_s=cooling_left_s,
            stopping=stopping,
            leases=leases,
        )
        if plan.unrelieved:
            self._say_unrelieved(reading)
        with self._lock:
            self._readings += 1
        self._note_crossings(plan, reading, woken_at)
        self._target.hold_for_pressure(plan.hold)
        self._carry_out(plan, reading, {j.job_id: j.footprint for j in [*live, *leases]})
        if not self._state.holding:  # no pressure (a paused trial alone holds launches)
            self._crossed.clear()
        self._near = self._near or self._state.holding
        took = self._clock() - began
        if took > SLOW_READING_S and began - self._slow_said >= SLOW_SAID_EVERY_S:
            self._slow_said = began  # blind meanwhile: say where the time went, now and then
            log.warning(
                "a pressure reading took %.0f ms (the reading %.0f ms, the live jobs %.0f ms, "
                "the steps %.0f ms)",
                took * 1000,
                read_s * 1000,
                live_s * 1000,
                (took - read_s - live_s) * 1000,
            )
        return plan

    def _note_crossings(self, plan: Plan, reading: Reading, woken_at: float | None) -> None:
        """Keep when each rung was crossed, for the reaction of the step that answers it."""
        if plan.crossed is not None:
            seen = reading.at if woken_at is None else min(woken_at, reading.at)
            for step in Step:  # a reading past a higher rung is past the lower ones too
                if _RANK[step] <= _RANK[plan.crossed]:
                    self._crossed.setdefault(step, seen)
        # A rung this reading is no longer past was answered (by a lower step, or by usage
        # falling): its crossing is over, and a later crossing of it is timed from its own
        # reading, never from this one (a stop once took 15 s "to react" that way).
        now_past = 0 if self._state.above is None else _RANK[self._state.above]
        for step in [s for s in self._crossed if _RANK[s] > now_past]:
            del self._crossed[step]

    def _settle_relief(self, reading: Reading) -> bool:
        """Settle the relief awaited, if one is: relieved once its hook answered and used fell
        by about the lease's share; not relieved when the hook failed or the wait is over.
        Whether one is still awaited."""
        pending = self._relieving
        if pending is None or self._leases is None:
            return False
        fell = pending.used - reading.used
        said = _said(pending.hook)
        waited = self._clock() - pending.asked
        needed = max(int(pending.share * RELIEVED_SHARE), RISE_BYTES)
        relieved = False
        if said is not None and not said.startswith("ok"):
            outcome = f"not relieved: its relieve hook {said}"
        elif said is not None and fell >= needed:
            relieved = True
            outcome = f"relieved: used fell {gb(fell)} GB in {waited * 1000:.0f} ms (hook {said})"
        elif waited > RELIEF_WAIT_S:
            outcome = (
                f"not relieved: used fell {gb(max(0, fell))} of its {gb(pending.share)} GB "
                f"within {RELIEF_WAIT_S:g} s (hook {said or 'not answered'})"
            )
            pending.hook.cancel()  # never called late, once given up (if it still waits)
        else:
            return True
        self._relieving = None
        with self._lock:
            self._relieved += relieved
        log.log(
            logging.INFO if relieved else logging.WARNING,
            "memory pressure: lease %s %s%s",
            pending.lease_id,
            outcome,
            "" if relieved else "; the ladder goes on",
        )
        try:
            self._leases.settle(pending.lease_id, relieved, outcome, max(0, fell))
        except Exception:  # recording it must not stop the relief
            log.exception("recording the relief of lease %s failed", pending.lease_id)
        return False

    def _say_unrelieved(self, reading: Reading) -> None:
        """Past the stop rung with no victim to choose: say why, now and then."""
        if reading.at - self._unrelieved_said < UNRELIEVED_SAID_EVERY_S:
            return
        self._unrelieved_said = reading.at
        count, reserved = (0, 0) if self._leases is None else self._leases.unrelievable()
        leases = (
            f"{count} granted lease(s) reserving {gb(reserved)} GB carry no relieve hook or "
            "were asked already"
            if count
            else "no lease is granted"
        )
        log.warning(
            "memory pressure: %s, and nothing to act on: no job of ours runs here and %s "
            "(a lease is relieved only through its relieve hook)",
            _figures_of(reading),
            leases,
        )

    def _end_cooldown_once_relieved(self, reading: Reading, stopping: bool) -> None:
        """End a stop's cooldown once what it waited for has happened: the stopped tree is
        gone (its memory is back in this reading) and used memory plus the running jobs'
        forecast fits under the line.  Its ceiling is ROOMKEEPER_PRESSURE_COOLDOWN's default."""
        if stopping or not self._cooldown.holding(CooldownCause.PRESSURE):
            return
        if reading.used + reading.claimed > reading.hold_line:
            return
        held = self._cooldown.clear(CooldownCause.PRESSURE)
        if held is not None:
            log.info(
                "memory pressure: admission free again %.1f s after the stop: the stopped "
                "tree's memory is back and used %s + forecast %s <= line %s (GB)",
                held,
                gb(reading.used),
                gb(reading.claimed),
                gb(reading.hold_line),
            )

    def _carry_out(self, plan: Plan, reading: Reading, footprints: dict[str, int]) -> None:
        """Take the plan's steps in order: a hold and a stop first (a stop gives memory back,
        the most urgent step), then the reading's suspensions together, every tree halted
        before any is walked for its escaped processes (slow on a busy machine)."""
        asked = [
            a.job_id
            for a in plan.actions
            if a.step is Step.SUSPEND and not a.trial and a.job_id is not None
        ]
        frozen: set[str] | None = None
        for action in plan.actions:
            if action.trial:
                self._act_on_trial(action)
                continue
            if action.step is Step.SUSPEND and frozen is None:
                frozen = set(self._target.suspend_all_for_pressure(asked))
            self._act(action, reading, footprints.get(action.job_id or "", 0), frozen or set())

    def _act(self, action: Action, reading: Reading, footprint: int, frozen: set[str]) -> None:
        """Carry out one step (a suspension is done already: ``frozen``, the ones that took);
        log it, count it, and tell ``on_step``."""
        step, job_id = action.step, action.job_id
        if not self._take(action, reading, frozen):
            return
        reaction = None
        if step is not Step.RESUME:
            crossed = self._crossed.pop(step, None)
            reaction = None if crossed is None else max(0.0, self._clock() - crossed)
        with self._lock:
            self._counts[step] += 1
            if reaction is not None:
                self._reactions.append(reaction)
        self._log(action, reaction)
        if self._on_step is not None:
            event = ReliefEvent(
                step,
                job_id,
                reading.used,
                reading.limit,
                footprint,
                reaction,
                action.why,
                action.never_fits,
            )
            try:
                self._on_step(event)
            except Exception:  # a failing history write must not stop the relief
                log.exception("recording a pressure step failed")

    def _take(self, action: Action, reading: Reading, frozen: set[str]) -> bool:
        """Take one step; whether it took.  A stop or a relief starts the cooldown."""
        step, job_id = action.step, action.job_id
        if step is Step.HOLD:
            return True
        if step is Step.SUSPEND:
            return job_id in frozen
        if job_id is None:
            return False
        if step is Step.RESUME:
            return self._target.resume_after_pressure(job_id)
        if step is Step.RELIEVE:
            done = self._ask_relief(job_id, action.why, reading)
        else:
            done = self._target.stop_for_pressure(job_id, action.why, never_fits=action.never_fits)
        if done:
            self._cooldown.start(self._settings().cooldown_s, CooldownCause.PRESSURE)
        return done

    def _ask_relief(self, lease_id: str, why: str, reading: Reading) -> bool:
        """Call the lease's relieve hook once and await its memory; whether it was called."""
        if self._leases is None:
            return False
        share = self._shares.get(lease_id, 0)
        hook = self._leases.relieve(lease_id, why)
        if hook is None:
            return False
        self._relieving = _Relieving(lease_id, share, reading.used, self._clock(), hook)
        return True

    def _act_on_trial(self, action: Action) -> None:
        """Pause or resume a job on trial: counted apart from the ladder's steps, logged at
        info, kept out of the recovery history (packing at work, not relief)."""
        assert action.job_id is not None
        if action.step is Step.SUSPEND:
            if not self._target.suspend_for_pressure(action.job_id, trial=True):
                return
            with self._lock:
                self._trial_pauses += 1
            log.info("job %s on trial paused: %s", action.job_id, action.why)
        elif self._target.resume_after_pressure(action.job_id):
            log.info("job %s on trial goes on: %s", action.job_id, action.why)

    def _log(self, action: Action, reaction: float | None) -> None:
        """One log line per step, with its numbers."""
        took = "" if reaction is None else f" ({reaction * 1000:.0f} ms after the crossing)"
        if action.step is Step.HOLD:
            log.warning("memory pressure: launches held: %s%s", action.why, took)
        elif action.step is Step.SUSPEND:
            log.warning("memory pressure: job %s suspended: %s%s", action.job_id, action.why, took)
        elif action.step is Step.RESUME:
            log.info("memory pressure eased: job %s resumed: %s", action.job_id, action.why)
        elif action.step is Step.RELIEVE:
            log.warning(
                "memory pressure: lease %s asked to end its turn (its relieve hook): %s%s",
                action.job_id,
                action.why,
                took,
            )
        elif action.never_fits:
            log.warning(
                "memory pressure: job %s stopped: it alone outgrows the container, it can "
                "never fit here: %s%s",
                action.job_id,
                action.why,
                took,
            )
        else:
            settings = self._settings()
            most = f"{settings.cooldown_s:.0f} s"
            held = (
                f"admission held for {most}"
                if settings.cooldown_fixed
                else f"admission held until its memory is back (at most {most})"
            )
            log.warning(
                "memory pressure: job %s stopped (output kept), %s: %s%s",
                action.job_id,
                held,
                action.why,
                took,
            )

    # --------------------------------------------------------------- the loop

    def start(self) -> None:
        """Read on a thread of its own until :meth:`close`."""
        if self._thread is None:
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._thread = threading.Thread(
                target=self._loop, name="roomkeeper-pressure", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        woken_at: float | None = None
        while not self._closing.is_set():
            try:
                self.tick(woken_at=woken_at)
            except Exception:  # the monitor must outlive any one bad reading
                log.exception("a pressure reading failed; trying again shortly")
            woken_at = self._wait()

    def next_wait(self) -> float:
        """Seconds until the next reading: the interval, or a tenth of it near the line."""
        return min(self._interval, NEAR_INTERVAL_S) if self._near else self._interval

    def _wait(self) -> float | None:
        """Sleep until the next reading, or less when a notification comes; when it came,
        if it did."""
        poller = select.poll()
        self._notifier.register(poller)
        if self._wake_r >= 0:
            poller.register(self._wake_r, select.POLLIN)
        events = poller.poll(max(1, int(self.next_wait() * 1000)))
        if not events or self._closing.is_set():
            return None
        at = self._clock()
        for fd, _ in events:
            self._notifier.clear(fd)
        with self._lock:
            self._woken += 1
        return at

    def _rearm(self, reading: Reading) -> None:
        """Arm the kernel's notifications once for the reading's thresholds; say what wakes us."""
        assert self._arm is not None
        self._notifier.close()
        self._notifier = Notifier()
        self._armed_for = (reading.limit, reading.hold_line)
        try:
            self._arm(self._notifier, reading)
        except Exception as err:  # notifications are an optimisation: polling still works
            self._notifier.failures.append(str(err))
        self._wakes_on = self._notifier.describe()
        if self._notifier.armed:
            log.info("pressure monitor wakes on: %s", self._notifier.describe())
        else:
            log.info(
                "pressure monitor: no kernel notification could be armed, reading every "
                "%.0f ms instead: %s",
                self._interval * 1000,
                self._notifier.describe(),
            )

    def close(self) -> None:
        """Stop the thread and close the notifications."""
        self._closing.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._notifier.close()
        if self._thread is None or not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    def statistics(self) -> MonitorStatistics:
        """Counts of each step, reaction times p50 and max, readings, what wakes it."""
        with self._lock:
            reactions = list(self._reactions)
            return MonitorStatistics(
                holds=self._counts[Step.HOLD],
                suspensions=self._counts[Step.SUSPEND],
                resumes=self._counts[Step.RESUME],
                stops=self._counts[Step.STOP],
                reruns=self._reruns(),
                reaction_p50_s=stats.median(reactions) if reactions else None,
                reaction_max_s=max(reactions) if reactions else None,
                readings=self._readings,
                woken=self._woken,
                wakes_on=self._wakes_on,
                holding=self._state.holding,
                trial_pauses=self._trial_pauses,
                relieves=self._counts[Step.RELIEVE],
                relieved=self._relieved,
            )


_RANK = {Step.HOLD: 1, Step.SUSPEND: 2, Step.STOP: 3, Step.RELIEVE: 3, Step.RESUME: 0}


def _said(hook: concurrent.futures.Future[str]) -> str | None:
    """A relieve hook's outcome in words once it answered, None while it runs."""
    if not hook.done():
        return None
    error = hook.exception()
    return hook.result() if error is None else f"failed: {type(error).__name__}"


def _figures_of(reading: Reading) -> str:
    """Used against the stop line, in decimal GB."""
    return (
        f"used {gb(reading.used)}, stop line {gb(reading.stop_line)} "
        f"(limit {gb(reading.limit)}, GB)"
    )


def arm_container(notifier: Notifier, reading: Reading) -> None:
    """Arm what the container's cgroup offers: v1 usage thresholds at the ladder's three
    lines, or a v2 PSI trigger and ``memory.events``; nothing without a cgroup."""
    if reading.directory is None:
        notifier.failures.append("the container is the machine: no cgroup to arm")
    elif reading.version == 1:
        lines = [reading.hold_line, reading.suspend_line, reading.stop_line]
        notifier.arm_v1_thresholds(reading.directory, [max(0, n) for n in lines])
    elif reading.version == 2:
        notifier.arm_v2(reading.directory)

"""The guard: does one more job fit in the container?

The rule, generalized to jobs that state their own size::

    refuse for memory when  used + sum(young reservations) + estimate
                            > limit - min(limit x headroom%, 8 GB)
    refuse for disk when    free < job_disk + min(total x headroom%, 10 GB)

With every estimate equal to ROOMKEEPER_JOB_MEMORY_MB this is exactly the
original ``used + (young + 1) x per_job``.  Memory is judged first because it is
the failure that takes everything with it; one cause is reported.  Unknown
is a refusal, not room.  A platform with no container to protect (not
Linux) passes, and says so.

Young jobs: a job takes minutes to allocate what it will hold, so every
admitted job reserves its estimate from admission until the warm-up window
ends or it is released, whatever its outcome.  A caller that can measure a
young job's own footprint reports it with :meth:`Guard.report_measured`; the
job then reserves only ``max(0, estimate - measured)``, so its memory is
never counted twice (once in the reading, once in its reservation).

Each reservation has a memory policy (:mod:`roomkeeper.guard.packing`):
``strict`` holds the above; ``pack`` holds only what the job's measured
growth forecasts for the next few seconds, never more than ``strict``.
The job asked about still needs its whole estimate to fit beside what the
others hold, except that a ``pack`` job which does not may start *on trial*
(:mod:`roomkeeper.guard.packing`): judged as if it asked only the floor, it
holds nothing and the pressure monitor pauses it first.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from roomkeeper.config import Settings, read_settings
from roomkeeper.guard.attribution import ENDED_WORK_SETTLES_S
from roomkeeper.guard.lines import Reading
from roomkeeper.guard.packing import (
    FLOOR_BYTES,
    PEAKS_KEPT,
    MemoryPolicy,
    Report,
    claim_bytes,
    growth_now,
    held_bytes,
    leaves_trial,
    trial_fits,
    trimmed,
    typical_peak,
)
from roomkeeper.guard.rule import (
    Ask,
    Decision,
    MemoryRoom,
    Reason,
    Word,
    decision,
    default_disk,
    default_estimate,
    disk_needed,
    disk_rule,
    fit_summary,
    gb,
    memory_line,
    memory_room,
    suspend_line,
)
from roomkeeper.kernel.delegation import JobGroupPlace, prepared_place
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT, Platform
from roomkeeper.kernel.resources import (
    DiskReading,
    MemoryReading,
    Resources,
    read_disk,
    read_memory,
    read_pressure_inputs,
)
from roomkeeper.paths import workspace_dir
from roomkeeper.units import format_gb

log = logging.getLogger("roomkeeper")

REFUSALS_REMEMBERED = 1024  # jobs whose last logged refusal is remembered (oldest forgotten)


@dataclass(frozen=True, slots=True)
class GuardStatistics:
    """A snapshot of the guard's state.

    Attributes:
        young: jobs holding a reservation now (jobs on trial among them, holding nothing).
        reserved_bytes: memory those reservations hold now.
        last_decision: the most recent decision of :meth:`Guard.admit`, if any.
        decisions: how many admit calls ended with each reason, by its value.
    """

    young: int
    reserved_bytes: int
    last_decision: Decision | None
    decisions: Mapping[str, int]


@dataclass(slots=True)
class _Reservation:
    estimate: int
    started: float
    policy: MemoryPolicy = MemoryPolicy.STRICT
    trial: bool = False  # on trial (packing): it holds nothing, and is paused first
    guessed: bool = False  # its estimate is the default, not its own or a learned size
    typical: int | None = None  # what its command shape typically peaks at (a guess too)
    peak: int = 0  # the most it was measured at
    # The admission is the first report: nothing of the job is in the reading yet.
    reports: list[Report] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.reports:
            self.reports.append(Report(self.started, 0))

    @property
    def held(self) -> int:
        return 0 if self.trial else held_bytes(self.policy, self.estimate, self.reports)

    @property
    def worst(self) -> int:
        """All it may still grow by: the rest of its estimate, whatever its policy."""
        return max(0, self.estimate - self.measured)

    @property
    def claim(self) -> int:
        """What it claims against the jobs on trial (nothing while on trial itself)."""
        if self.trial:
            return 0
        if self.guessed and self.policy is MemoryPolicy.PACK:
            return self.held
        return claim_bytes(self.policy, self.estimate, self.reports)

    @property
    def measured(self) -> int:
        return self.reports[-1].measured

    @property
    def learns_typical(self) -> bool:
        """Whether its peak, when it ends, tells what work of unknown size holds: a pack job
        admitted on a guess and seen holding memory (a job never measured tells nothing)."""
        return self.guessed and self.policy is MemoryPolicy.PACK and self.peak > 0

    def leave_trial(self, at: float) -> None:
        """Reserve from now on as any pack job does; its growth is judged afresh from here
        (a pause is no growth, and must not read as a small job)."""
        self.trial = False
        self.reports = [Report(at, self.measured)]

    def report(self, at: float, measured: int) -> None:
        self.reports.append(Report(at, measured))
        self.reports = trimmed(self.reports)
        self.peak = max(self.peak, measured)


@dataclass(frozen=True, slots=True)
class Rerun:
    """A job asked about again after a stop for memory pressure.

    Attributes:
        peak: the most its stopped run held: it is never asked for less.
        ours: what every live job of ours holds now (their footprints): memory the
            job would have were they gone.
    """

    peak: int
    ours: int


def _at_most_alone(
    ask: Ask, rerun: Rerun, settings: Settings, used: int, limit: int, reserve: int
) -> Ask:
    """A re-run's forecast asked at most at the room it would have with none of our jobs
    running, but never below its peak (less room than that, and it waits); never "never
    fits": it ran here before."""
    line = memory_line(limit, settings.memory_headroom_percent) - reserve
    alone = max(0, line - max(0, used - rerun.ours))
    return ask.resized(estimate=min(ask.estimate, max(alone, rerun.peak)), defaulted=True)


def _prepared_job_groups() -> str | None:
    """Where this process makes job groups, once its scheduler has prepared them."""
    place = prepared_place()
    return None if place is None else _described(place)


@functools.lru_cache(maxsize=8)
def _described(place: JobGroupPlace) -> str:
    """A place in words, worded once (every decision asks)."""
    return place.describe()


class Guard:
    """Admission control from the kernel's own numbers.

    Needs no arguments: it reads the environment (``ROOMKEEPER_*``) and the
    kernel's files on every call.  Thread-safe: a judgement and the
    reservation it makes are one step, so two callers cannot both take the
    same room.

    Args:
        env: the variables to read on every call; ``os.environ`` when omitted.
        proc_root: where ``/proc`` is (tests point it at a fixture tree).
        cgroup_root: where ``/sys/fs/cgroup`` is.
        workspace: the volume to judge; ROOMKEEPER_WORKSPACE (default ROOMKEEPER_HOME/workspace).
        clock: monotonic seconds, for the warm-up window.
        platform: ``sys.platform``; anything but Linux passes.
        reserve: bytes kept free on top of the headroom, asked with the limit on
            every decision (the gateway keeps room for its own growth; its current
            footprint is already in "used").
        job_groups: where job cgroups are made, or why none are, in words;
            None while nobody has asked (said in the "guard is on" line).
            The process's own answer where the roots are the real ones.
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        proc_root: str = PROC_ROOT,
        cgroup_root: str = CGROUP_ROOT,
        workspace: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        platform: str = sys.platform,
        reserve: Callable[[int], int] | None = None,
        job_groups: Callable[[], str | None] | None = None,
    ) -> None:
        self._env = env
        if job_groups is None and (proc_root, cgroup_root) == (PROC_ROOT, CGROUP_ROOT):
            job_groups = _prepared_job_groups
        self._job_groups = job_groups
        self._reserve = reserve
        self._proc_root = proc_root
        self._cgroup_root = cgroup_root
        self._workspace = workspace
        self._clock = clock
        self._platform = Platform.named(platform)  # the platform choice, made once
        self._lock = threading.Lock()
        self._young: dict[str, _Reservation] = {}
        self._last: Decision | None = None
        self._counts: Counter[str] = Counter()
        self._announced: object = None
        self._refusals_logged: dict[str, Word] = {}  # the reason last logged, per job
        # The peaks of the newest pack jobs that ended on a guessed estimate: what sizes trials.
        self._guessed_peaks: deque[int] = deque(maxlen=PEAKS_KEPT)
        # The last end of a reservation measured together with others (leases): a share read
        # before it is stale, and so is one read while the ended work may still be giving
        # its memory back.
        self._shared_end_at = float("-inf")

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
        """Judge whether ``job_id`` fits now and, if it does, reserve its memory.

        Admitting an id that already holds a reservation judges it again in
        place: its old reservation is not counted against itself.

        Args:
            job_id: the key of the reservation; release it with :meth:`release`.
            memory_bytes: this job's memory estimate; ROOMKEEPER_JOB_MEMORY_MB when None.
            disk_bytes: this job's disk estimate; ROOMKEEPER_JOB_DISK_MB when None.
            policy: what the job reserves while young once admitted (``strict``
                unless the caller can suspend and stop it: see
                :mod:`roomkeeper.guard.packing`).
            rerun: the job runs again after a stop for pressure: its estimate is a
                forecast that may overshoot, asked at most at the room it would have with
                none of our jobs running (never below its peak), never refused as one that
                can never fit (it ran here).
            worst_case: judge with every young job's whole worst case (the rest of its
                estimate, whatever its policy, trials too) and reserve this job's whole
                estimate (``strict``, never on trial): the last run of work stopped for
                pressure, which must not be stopped again by others' growth.
            typical_bytes: what runs of the job's command shape typically peaked at
                (:mod:`roomkeeper.jobs.sizes`), for a job with no estimate of its own: what
                its trial is expected to grow to, before the typical peak of all work of
                unknown size seen here.
        """
        guessed = memory_bytes is None and rerun is None and not worst_case  # a re-run ran here
        with self._lock:
            settings = read_settings(self._env)
            decision = self._judge(
                job_id,
                settings,
                memory_bytes,
                disk_bytes,
                worst_case=worst_case,
                rerun=rerun,
            )
            trial = False
            if worst_case:
                policy = MemoryPolicy.STRICT
                if not decision.admit and decision.reason is Reason.MEMORY:
                    summary = f"its last run waits for room for its worst case: {decision.summary}"
                    decision = replace(decision, summary=fit_summary(summary))
            elif policy is MemoryPolicy.PACK:
                decision, trial = self._on_trial(
                    job_id, settings, disk_bytes, decision, guessed, typical_bytes
                )
            if decision.admit:
                self._young[job_id] = _Reservation(
                    decision.estimate_bytes,
                    self._clock(),
                    policy=policy,
                    trial=trial,
                    guessed=guessed,
                    typical=typical_bytes,  # counts only while its estimate is a guess
                )
                self._refusals_logged.pop(job_id, None)
            self._counts[decision.reason.value] += 1
            self._last = decision
        if not decision.admit:
            self._log_refusal(job_id, decision)
        return decision

    def _on_trial(
        self,
        job_id: str,
        settings: Settings,
        disk_bytes: int | None,
        judged: Decision,
        guessed: bool,
        typical: int | None,
    ) -> tuple[Decision, bool]:
        """A pack job's decision with trials (:mod:`roomkeeper.guard.packing`): whether it starts
        on trial instead, or waits for the jobs on trial before it; with the lock held.
        ``guessed``: its estimate is the default, not its own; ``typical``: its shape's
        typical peak, if known."""
        others = self._others(job_id)
        on_trial = sum(1 for r in others if r.trial)
        refused_for_memory = judged.reason is Reason.MEMORY and not judged.never_fits
        if not on_trial and not refused_for_memory:
            return judged, False
        if not any(r.policy is MemoryPolicy.PACK and not r.trial for r in others):
            # No pack job of ours to yield to (a lease or a strict job may be work the
            # monitor cannot see): it would be the oldest live job, never paused.
            return judged, False
        if not (judged.admit or refused_for_memory) or judged.reason in (
            Reason.OFF,
            Reason.NO_CONTAINER,
        ):
            # A refusal for disk or an unknown reading stands; with no container to protect
            # there is no room to judge a trial by.
            return judged, False
        floor = self._judge(job_id, settings, FLOOR_BYTES, disk_bytes)
        if floor.admit and self._trial_fits(
            floor, settings, others, judged.estimate_bytes, guessed, typical
        ):
            summary = f"on trial, in room nobody reserved, paused first: {floor.summary}"
            return replace(floor, summary=summary, estimate_bytes=judged.estimate_bytes), True
        if judged.admit:  # it fits, but the jobs on trial before it go first
            summary = f"waits for the {on_trial} jobs on trial before it: {judged.summary}"
            return replace(judged, admit=False, reason=Reason.MEMORY, summary=summary), False
        return judged, False

    def _trial_fits(
        self,
        floor: Decision,
        settings: Settings,
        others: list[_Reservation],
        estimate: int,
        guessed: bool,
        typical: int | None,
    ) -> bool:
        """Whether the room under the suspend line holds the jobs on trial and this one, each
        grown to what it is expected to hold (:func:`~roomkeeper.guard.packing.trial_fits`)."""
        memory = floor.memory
        if memory is None or memory.used_bytes is None or memory.limit_bytes is None:
            return False
        line = suspend_line(memory.limit_bytes, settings.memory_headroom_percent)
        trials = [r for r in others if r.trial]
        rests = [
            max(0, self._expected(r.estimate, r.guessed, r.typical) - r.measured) for r in trials
        ]
        expected = self._expected(estimate, guessed, typical)
        return trial_fits(line - memory.used_bytes, expected, rests)

    def _expected(self, estimate: int, guessed: bool, typical: int | None) -> int:
        """What a job is expected to hold at most: its estimate or, where that is a guess, what
        its command shape typically peaks at (``typical``), else the typical peak of the work
        of unknown size that ended here (the guess until enough has)."""
        if not guessed:
            return estimate
        return typical if typical is not None else typical_peak(self._guessed_peaks, estimate)

    def _others(self, job_id: str) -> list[_Reservation]:
        return [r for j, r in self._young.items() if j != job_id]

    def end_trial(self, job_id: str) -> None:
        """End ``job_id``'s trial (it became the oldest live job, which is never paused): it
        reserves as any pack job from now on.  Unknown ids and jobs off trial are ignored."""
        with self._lock:
            reservation = self._young.get(job_id)
            if reservation is not None and reservation.trial:
                reservation.leave_trial(self._clock())

    def trials(self) -> list[str]:
        """The jobs on trial now, oldest first."""
        warmup = read_settings(self._env).job_warmup_seconds
        with self._lock:
            self._expire(warmup)
            trials = [(r.started, j) for j, r in self._young.items() if r.trial]
        return [j for _, j in sorted(trials)]

    def _claims_after_trials(self, used: int, line: int) -> int:
        """Let each job on trial whose rest now fits leave its trial, oldest first; what the
        jobs not on trial then claim (:func:`~roomkeeper.guard.packing.claim_bytes`)."""
        claimed = sum(r.claim for r in self._young.values() if not r.trial)
        for r in sorted((r for r in self._young.values() if r.trial), key=lambda r: r.started):
            if leaves_trial(used, claimed, line, r.estimate, r.measured):
                r.leave_trial(self._clock())
                claimed += r.claim
        return claimed

    def _log_refusal(self, job_id: str, decision: Decision) -> None:
        """Log a refusal once per job and change of reason, not once per retried round."""
        with self._lock:
            if self._refusals_logged.get(job_id) is decision.reason:
                return
            self._refusals_logged[job_id] = decision.reason
            while len(self._refusals_logged) > REFUSALS_REMEMBERED:
                del self._refusals_logged[next(iter(self._refusals_logged))]
        log.info("refused %s: %s", job_id, decision.summary)

    def check(
        self,
        *,
        memory_bytes: int | None = None,
        disk_bytes: int | None = None,
        resources: Resources | None = None,
    ) -> Decision:
        """Judge one more job of the given (or default) size without reserving anything.

        Args:
            memory_bytes: the job's memory estimate; ROOMKEEPER_JOB_MEMORY_MB when None.
            disk_bytes: the job's disk estimate; ROOMKEEPER_JOB_DISK_MB when None.
            resources: a reading just taken, to judge instead of reading again
                (``roomkeeper probe`` shows the same numbers it judged).
        """
        with self._lock:
            settings = read_settings(self._env)
            return self._judge("(check)", settings, memory_bytes, disk_bytes, resources)

    def hold(self, job_id: str, memory_bytes: int, *, age_s: float = 0.0) -> None:
        """Reserve without judging: for work admitted before a restart (a lease still held).

        Args:
            job_id: the reservation's key.
            memory_bytes: what it reserves.
            age_s: how long ago it was admitted, so its warm-up window ends on time.
        """
        with self._lock:
            self._young[job_id] = _Reservation(max(0, memory_bytes), self._clock() - age_s)

    def estimate(self, memory_bytes: int | None) -> int:
        """The memory a job is expected to hold: its own figure, else the default, which is
        ROOMKEEPER_JOB_MEMORY_MB but at most a quarter of the line where a limit is known."""
        if memory_bytes is not None:
            return max(0, memory_bytes)
        settings = read_settings(self._env)
        if not settings.guard_on or not self._platform.linux:
            return settings.job_memory_bytes
        memory = self._read_memory(settings)
        if memory.limit_bytes is None:
            return settings.job_memory_bytes
        return self._default_for(
            settings, memory.limit_bytes, self._reserve_for(memory.limit_bytes)
        )

    def release(self, job_id: str, *, ended_alone: bool = False) -> None:
        """End ``job_id``'s reservation, whatever its outcome; unknown ids are ignored.

        ``ended_alone``: the job ran to its own end (not stopped, cancelled or timed out), so
        its peak is what work like it holds (see :func:`~roomkeeper.guard.packing.typical_peak`).
        """
        with self._lock:
            ended = self._young.pop(job_id, None)
            if ended is not None and ended_alone:
                self._learn_peak(ended)

    def release_shared(self, job_id: str, sharers: Iterable[str]) -> None:
        """End ``job_id``'s reservation, one of several measured together (leases, whose
        shares of the container's growth are told by
        :mod:`~roomkeeper.guard.attribution`); each of ``sharers`` reserves its whole
        estimate again until it is told its share afresh.

        Some of what a sharer was told may be the ended one's work: that memory leaves the
        reading when the work ends, and its reservation goes now, so the sharer would go
        on reserving nothing for growth its own work has not done.  Shares read before
        this are ignored, and so are those read within
        :data:`~roomkeeper.guard.attribution.ENDED_WORK_SETTLES_S` after it: the ended
        work may tell its end before it gives its memory back, and that memory, still in
        the reading, is no sharer's (:meth:`report_measured`'s ``shared_read_at``).
        """
        with self._lock:
            self._young.pop(job_id, None)
            now = self._clock()
            self._shared_end_at = now
            for key in sharers:
                reservation = self._young.get(key)
                if reservation is not None and reservation.measured:
                    reservation.report(now, 0)

    def _learn_peak(self, reservation: _Reservation) -> None:
        if reservation.learns_typical:
            self._guessed_peaks.append(reservation.peak)

    def growth_rate(self, job_id: str) -> float:
        """Bytes per second ``job_id`` grows by now, from its reports (the steeper of the
        slope window's and the last half second's); 0.0 when it holds no reservation."""
        with self._lock:
            reservation = self._young.get(job_id)
            if reservation is None:
                return 0.0
            return growth_now(reservation.reports)

    def report_measured(
        self,
        job_id: str,
        measured_bytes: int,
        *,
        shared_read_at: float | None = None,
    ) -> None:
        """Tell the guard how much of ``job_id``'s memory the reading already shows.

        The job then reserves only ``max(0, estimate - measured)`` (``strict``),
        or what its growth over its recent reports forecasts, at most that
        (``pack``).  Leases are told shares of the container's growth
        (:mod:`~roomkeeper.guard.attribution`); one never told keeps its whole
        reservation.

        ``shared_read_at``: for a share of growth measured together with others, when the
        reading it came from was taken (the guard's clock, as :class:`Reading` ``.at``); a
        share read before one of them ended (:meth:`release_shared`), or less than
        :data:`~roomkeeper.guard.attribution.ENDED_WORK_SETTLES_S` after, is ignored.
        """
        with self._lock:
            if (
                shared_read_at is not None
                and shared_read_at - self._shared_end_at < ENDED_WORK_SETTLES_S
            ):
                return
            reservation = self._young.get(job_id)
            if reservation is not None:
                reservation.report(self._clock(), max(0, measured_bytes))

    def pressure_reading(self) -> Reading | None:
        """What the pressure monitor judges: the guard's own reading, line and reserve, and PSI.

        None where the guard has nothing to protect (off, not Linux) or memory
        is unknown: the relief ladder never acts on a guess.  Each reading also
        lets a job on trial whose rest now fits leave its trial (oldest first),
        and carries what the jobs not on trial claim, against which the ladder
        pauses and resumes the jobs on trial.
        """
        reading = self.memory_reading()
        if reading is None:
            return None
        settings = read_settings(self._env)
        with self._lock:
            self._expire(settings.job_warmup_seconds)
            claimed = self._claims_after_trials(reading.used, reading.hold_line)
        return replace(reading, claimed=claimed)

    def memory_reading(self) -> Reading | None:
        """The reading :meth:`pressure_reading` takes, with no effect on the reservations or the
        trials (``claimed`` is 0): for watchers beside the pressure monitor."""
        settings = read_settings(self._env)
        if not settings.guard_on or not self._platform.linux:
            return None
        inputs = read_pressure_inputs(
            proc_root=self._proc_root,
            cgroup_root=self._cgroup_root,
            settings=settings,
            platform=self._platform,
        )
        memory = inputs.memory
        if memory.used_bytes is None or memory.limit_bytes is None:
            return None
        return Reading(
            used=memory.used_bytes,
            limit=memory.limit_bytes,
            headroom_percent=settings.memory_headroom_percent,
            reserve=self._reserve_for(memory.limit_bytes),
            full_avg10=inputs.full_avg10,
            at=self._clock(),
            directory=inputs.directory,
            version=inputs.version,
        )

    def statistics(self) -> GuardStatistics:
        """Young count, reserved bytes, the last decision and decision counts."""
        with self._lock:
            self._expire(read_settings(self._env).job_warmup_seconds)
            return GuardStatistics(
                young=len(self._young),
                reserved_bytes=sum(r.held for r in self._young.values()),
                last_decision=self._last,
                decisions=dict(self._counts),
            )

    @staticmethod
    def _default_for(settings: Settings, limit_bytes: int, reserve: int) -> int:
        """The default estimate in a container of ``limit_bytes`` with the caller's reserve."""
        line = memory_line(limit_bytes, settings.memory_headroom_percent) - reserve
        return default_estimate(settings.job_memory_bytes, line)

    def _reserve_for(self, limit_bytes: int) -> int:
        """The caller's reserve in a container of ``limit_bytes`` (none without a caller)."""
        return max(0, self._reserve(limit_bytes)) if self._reserve is not None else 0

    def _expire(self, warmup: float) -> None:
        now = self._clock()
        for job_id in [j for j, r in self._young.items() if now - r.started >= warmup]:
            self._learn_peak(self._young.pop(job_id))  # past its warm-up: it has grown

    def _volume(self, settings: Settings) -> str | os.PathLike[str]:
        if self._workspace is not None:
            return self._workspace
        return settings.workspace or workspace_dir(self._env)

    def _announce(self, key: object, text: str) -> None:
        """Say what the guard reads when first used and again only when that changes."""
        if key != self._announced:
            self._announced = key
            log.info("%s", text)

    def _judge(
        self,
        job_id: str,
        settings: Settings,
        memory_bytes: int | None,
        disk_bytes: int | None,
        resources: Resources | None = None,
        *,
        worst_case: bool = False,
        rerun: Rerun | None = None,
    ) -> Decision:
        """Judge one job: the guard's switch, the platform, then memory, then disk."""
        ask = self._ask(job_id, settings, memory_bytes, disk_bytes, worst_case=worst_case)
        if not settings.guard_on:
            self._announce("off", "roomkeeper guard is off: jobs start without a check")
            return decision(
                ask, admit=True, reason=Reason.OFF, summary="guard off: admitted without a check"
            )
        memory = resources.memory if resources is not None else self._read_memory(settings)
        if not self._platform.linux:
            return self._no_container(ask, memory)
        disk = None
        if memory.known:
            disk = resources.disk if resources is not None else read_disk(self._volume(settings))
        self._announce_readings(memory, disk)
        if memory.used_bytes is None or memory.limit_bytes is None:
            summary = f"measurements unavailable: memory unknown ({memory.unknown_reason})"
            return decision(ask, admit=False, reason=Reason.UNKNOWN, summary=summary, memory=memory)
        reserve = self._reserve_for(memory.limit_bytes)
        if ask.defaulted:
            ask = ask.resized(estimate=self._default_for(settings, memory.limit_bytes, reserve))
        if rerun is not None:
            ask = _at_most_alone(
                ask, rerun, settings, memory.used_bytes, memory.limit_bytes, reserve
            )
        room = memory_room(ask, memory, memory.used_bytes, memory.limit_bytes, settings, reserve)
        if room.total > room.line:
            return self._no_room_for_memory(ask, memory, room, disk)
        assert disk is not None
        if ask.disk_defaulted and disk.total_bytes is not None:
            ask = ask.resized(job_disk=default_disk(settings.job_disk_bytes, disk.total_bytes))
        reason, summary, never = disk_rule(ask, disk, room, settings.disk_headroom_percent)
        needed = None
        if disk.total_bytes is not None:
            needed = disk_needed(ask.job_disk, disk.total_bytes, settings.disk_headroom_percent)
        return decision(
            ask,
            admit=reason is Reason.OK,
            reason=reason,
            summary=summary,
            memory=memory,
            disk=disk,
            room=room,
            never_fits=never,
            disk_needed=needed,
        )

    @staticmethod
    def _no_room_for_memory(
        ask: Ask, memory: MemoryReading, room: MemoryRoom, disk: DiskReading | None
    ) -> Decision:
        """Refused for memory: for now, or for ever when the job alone is above the line.

        The disk reading goes with it, though not judged: a panel showing the volume
        must not go blank because memory refused first.
        """
        never = ask.estimate > room.line and not ask.defaulted
        if never:
            summary = (
                f"no room for memory even with nothing else running (GB): job "
                f"{gb(ask.estimate)} > line {gb(room.line)}; {room.figures % '>'}"
            )
        else:
            summary = f"no room for memory (GB): {room.figures % '>'}"
        return decision(
            ask,
            admit=False,
            reason=Reason.MEMORY,
            summary=summary,
            memory=memory,
            disk=disk,
            room=room,
            never_fits=never,
        )

    def _ask(
        self,
        job_id: str,
        settings: Settings,
        memory_bytes: int | None,
        disk_bytes: int | None,
        *,
        worst_case: bool = False,
    ) -> Ask:
        """The question for one job: its sizes, and what the other young jobs hold now (with
        ``worst_case``, all that they may still grow by)."""
        self._expire(settings.job_warmup_seconds)
        # Judged again in place: the job's own old reservation is not held against it.
        young = [r for j, r in self._young.items() if j != job_id]
        held = sum(r.worst for r in young) if worst_case else sum(r.held for r in young)
        return Ask(
            job_id=job_id,
            estimate=settings.job_memory_bytes if memory_bytes is None else max(0, memory_bytes),
            defaulted=memory_bytes is None,
            disk_defaulted=disk_bytes is None,
            job_disk=settings.job_disk_bytes if disk_bytes is None else max(0, disk_bytes),
            reserved=held,
            young=len(young),
        )

    def _read_memory(self, settings: Settings) -> MemoryReading:
        return read_memory(
            proc_root=self._proc_root,
            cgroup_root=self._cgroup_root,
            settings=settings,
            platform=self._platform,
        )

    def _no_container(self, ask: Ask, memory: MemoryReading) -> Decision:
        """Off Linux there is no container to protect: admitted, with the numbers psutil has."""
        name = self._platform.name
        self._announce("portable", f"roomkeeper guard: no container to protect on {name}")
        summary = f"no container to protect on {name}: admitted"
        if memory.used_bytes is not None and memory.limit_bytes is not None:
            summary += f"; {format_gb(memory.used_bytes)} used of {format_gb(memory.limit_bytes)}"
        return decision(ask, admit=True, reason=Reason.NO_CONTAINER, summary=summary, memory=memory)

    def _announce_readings(self, memory: MemoryReading, disk: DiskReading | None) -> None:
        """Say which files the guard judges, which volume and where job groups go, on change.

        Where roomkeeper makes no job groups (cgroup v2 forbids it in a group
        that holds others' processes, or the cgroup files are read-only),
        this line is where it says so, once.
        """
        volume = disk.path if disk else "not read"
        groups = self._job_groups() if self._job_groups is not None else None
        # What describe() says depends on these parts alone: they are the announcement's key,
        # and its words are built only when it changes.
        reads = (memory.source, memory.limit_bytes, memory.limit_origin, memory.unknown_reason)
        if (reads, volume, groups) == self._announced:
            return
        text = f'reads: "{memory.describe()}", volume: "{volume}"'
        if groups is not None:
            text += f', job groups: "{groups}"'
        self._announce((reads, volume, groups), f"roomkeeper guard is on {{{text}}}")

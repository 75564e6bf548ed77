"""The guard: does one more job fit in the container?

The rule is seed 000's, generalized to jobs that state their own size::

    refuse for memory when  used + sum(young reservations) + estimate
                            > limit - min(limit x headroom%, 8 GB)
    refuse for disk when    free < job_disk + min(total x headroom%, 10 GB)

With every estimate equal to ROOMKEEPER_JOB_MEMORY_MB this is exactly the
seed's ``used + (young + 1) x per_job``.  Memory is judged first because it is
the failure that takes everything with it; one cause is reported.  Unknown
is a refusal, not room.  A platform with no container to protect (not
Linux) passes, and says so.

Young jobs: a job takes minutes to allocate what it will hold, so every
admitted job reserves its estimate from admission until the warm-up window
ends or it is released, whatever its outcome.  A caller that can measure a
young job's own footprint reports it with :meth:`Guard.report_measured`; the
job then reserves only ``max(0, estimate - measured)``, so its memory is
never counted twice (once in the reading, once in its reservation).
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from roomkeeper.config import Settings, read_settings
from roomkeeper.kernel.delegation import prepared_place
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT, Platform
from roomkeeper.kernel.resources import (
    DiskReading,
    LimitOrigin,
    MemoryReading,
    Resources,
    read_disk,
    read_memory,
)
from roomkeeper.paths import workspace_dir
from roomkeeper.units import GB, format_gb

log = logging.getLogger("roomkeeper")

MEMORY_HEADROOM_CAP = 8 * GB  # decimal: 8,000,000,000 bytes (seed 000)
DISK_HEADROOM_CAP = 10 * GB  # decimal: 10,000,000,000 bytes (seed 000)
SUMMARY_LIMIT = 200


class Reason(enum.Enum):
    """Why a decision came out as it did: one closed vocabulary for every layer."""

    OK = "ok"  # room for it
    NO_CONTAINER = "no_container"  # not Linux: nothing to protect, admitted
    OFF = "off"  # ROOMKEEPER_GUARD=off: admitted without a check
    MEMORY = "memory"  # no room in the container's memory
    DISK = "disk"  # no room on the workspace volume
    UNKNOWN = "unknown"  # a reading could not be taken: refused
    # Words the scheduler adds (seed 002): why a job waits or was refused.
    CPU = "cpu"  # CPU pressure above ROOMKEEPER_CPU_PRESSURE_PERCENT
    SLOTS = "slots"  # ROOMKEEPER_MAX_RUNNING jobs are running
    OWNER_SLOTS = "owner_slots"  # this owner runs ROOMKEEPER_MAX_RUNNING_PER_OWNER jobs
    QUEUED = "queued"  # not judged yet: its turn has not come
    SHUTDOWN = "shutdown"  # ended by an orderly shutdown, not by a person
    HELD = "held"  # launches are held (relief, recovery mode): a person or time releases them
    QUEUE_FULL = "queue_full"  # submission refused: ROOMKEEPER_MAX_WAITING jobs wait
    OWNER_QUEUE_FULL = "owner_queue_full"  # submission refused: the owner's queue is full


@dataclass(frozen=True, slots=True)
class Decision:
    """The guard's answer for one job.

    Attributes:
        job_id: the job judged.
        admit: whether it may start.
        reason: why, from :class:`Reason`.
        summary: every number that decided it, in decimal GB, under 200
            characters and without a path, fit for a browser or a log.
        memory: the memory reading judged (None when the guard is off).
        disk: the disk reading judged (None when memory already refused).
        estimate_bytes: the memory this job was expected to hold.
        young_reserved_bytes: what young jobs held when it was judged.
        memory_line_bytes: limit minus headroom (None when unknown).
    """

    job_id: str
    admit: bool
    reason: Reason
    summary: str
    memory: MemoryReading | None = None
    disk: DiskReading | None = None
    estimate_bytes: int = 0
    young_reserved_bytes: int = 0
    memory_line_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GuardStatistics:
    """A snapshot of the guard's state.

    Attributes:
        young: jobs holding a reservation now.
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
    measured: int = 0

    @property
    def held(self) -> int:
        return max(0, self.estimate - self.measured)


def _prepared_job_groups() -> str | None:
    """Where this process makes job groups, once its scheduler has prepared them."""
    place = prepared_place()
    return None if place is None else place.describe()


def memory_line(limit: int, headroom_percent: float) -> int:
    """The line used memory must stay under: ``limit - min(limit x headroom%, 8 GB)``."""
    return limit - min(int(limit * headroom_percent / 100), MEMORY_HEADROOM_CAP)


def disk_needed(job_disk: int, total: int, headroom_percent: float) -> int:
    """Free space a start needs: ``job_disk + min(total x headroom%, 10 GB)``."""
    return job_disk + min(int(total * headroom_percent / 100), DISK_HEADROOM_CAP)


def _g(n_bytes: int) -> str:
    """Decimal GB, two places: the unit is named once per summary clause."""
    return f"{n_bytes / GB:.2f}"


def _fit(summary: str) -> str:
    return summary if len(summary) < SUMMARY_LIMIT else summary[: SUMMARY_LIMIT - 2] + "…"


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
        reserve: bytes kept free on top of the headroom, asked on every
            decision (the gateway keeps ROOMKEEPER_GATEWAY_RESERVE_MB for its
            own growth; its current footprint is already in "used").
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
        reserve: Callable[[], int] | None = None,
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

    def admit(
        self, job_id: str, *, memory_bytes: int | None = None, disk_bytes: int | None = None
    ) -> Decision:
        """Judge whether ``job_id`` fits now and, if it does, reserve its memory.

        Admitting an id that already holds a reservation judges it again in
        place: its old reservation is not counted against itself.

        Args:
            job_id: the key of the reservation; release it with :meth:`release`.
            memory_bytes: this job's memory estimate; ROOMKEEPER_JOB_MEMORY_MB when None.
            disk_bytes: this job's disk estimate; ROOMKEEPER_JOB_DISK_MB when None.
        """
        with self._lock:
            settings = read_settings(self._env)
            decision = self._judge(job_id, settings, memory_bytes, disk_bytes)
            if decision.admit:
                self._young[job_id] = _Reservation(decision.estimate_bytes, self._clock())
            self._counts[decision.reason.value] += 1
            self._last = decision
        if not decision.admit:
            log.info("refused %s: %s", job_id, decision.summary)
        return decision

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

    def release(self, job_id: str) -> None:
        """End ``job_id``'s reservation, whatever its outcome; unknown ids are ignored."""
        with self._lock:
            self._young.pop(job_id, None)

    def report_measured(self, job_id: str, measured_bytes: int) -> None:
        """Tell the guard how much of ``job_id``'s memory the reading already shows.

        The job then reserves only ``max(0, estimate - measured)``.  Work that
        runs elsewhere (leases) never reports, and keeps its full reservation.
        """
        with self._lock:
            reservation = self._young.get(job_id)
            if reservation is not None:
                reservation.measured = max(0, measured_bytes)

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

    def _expire(self, warmup: float) -> None:
        now = self._clock()
        for job_id in [j for j, r in self._young.items() if now - r.started >= warmup]:
            del self._young[job_id]

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
    ) -> Decision:
        """Judge one job: the guard's switch, the platform, then memory, then disk."""
        ask = self._ask(job_id, settings, memory_bytes, disk_bytes)
        if not settings.guard_on:
            self._announce("off", "roomkeeper guard is off: jobs start without a check")
            return _decision(
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
            return _decision(
                ask, admit=False, reason=Reason.UNKNOWN, summary=summary, memory=memory
            )
        reserve = max(0, self._reserve()) if self._reserve is not None else 0
        room = _memory_room(ask, memory, memory.used_bytes, memory.limit_bytes, settings, reserve)
        if room.total > room.line:
            summary = f"no room for memory (GB): {room.figures % '>'}"
            return _decision(
                ask, admit=False, reason=Reason.MEMORY, summary=summary, memory=memory, room=room
            )
        assert disk is not None
        reason, summary = _disk_rule(ask, disk, room, settings.disk_headroom_percent)
        return _decision(
            ask,
            admit=reason is Reason.OK,
            reason=reason,
            summary=summary,
            memory=memory,
            disk=disk,
            room=room,
        )

    def _ask(
        self, job_id: str, settings: Settings, memory_bytes: int | None, disk_bytes: int | None
    ) -> _Ask:
        """The question for one job: its sizes, and what the other young jobs hold now."""
        self._expire(settings.job_warmup_seconds)
        # Judged again in place: the job's own old reservation is not held against it.
        young = [r for j, r in self._young.items() if j != job_id]
        return _Ask(
            job_id=job_id,
            estimate=settings.job_memory_bytes if memory_bytes is None else max(0, memory_bytes),
            job_disk=settings.job_disk_bytes if disk_bytes is None else max(0, disk_bytes),
            reserved=sum(r.held for r in young),
            young=len(young),
        )

    def _read_memory(self, settings: Settings) -> MemoryReading:
        return read_memory(
            proc_root=self._proc_root,
            cgroup_root=self._cgroup_root,
            settings=settings,
            platform=self._platform,
        )

    def _no_container(self, ask: _Ask, memory: MemoryReading) -> Decision:
        """Off Linux there is no container to protect: admitted, with the numbers psutil has."""
        name = self._platform.name
        self._announce("portable", f"roomkeeper guard: no container to protect on {name}")
        summary = f"no container to protect on {name}: admitted"
        if memory.used_bytes is not None and memory.limit_bytes is not None:
            summary += f"; {format_gb(memory.used_bytes)} used of {format_gb(memory.limit_bytes)}"
        return _decision(
            ask, admit=True, reason=Reason.NO_CONTAINER, summary=summary, memory=memory
        )

    def _announce_readings(self, memory: MemoryReading, disk: DiskReading | None) -> None:
        """Say which files the guard judges, which volume and where job groups go, on change.

        Where roomkeeper makes no job groups (cgroup v2 forbids it in a group
        that holds others' processes, or the cgroup files are read-only),
        this line is where it says so, once.
        """
        reads = memory.describe()
        volume = disk.path if disk else "not read"
        groups = self._job_groups() if self._job_groups is not None else None
        if (reads, volume, groups) != self._announced:
            text = f'reads: "{reads}", volume: "{volume}"'
            if groups is not None:
                text += f', job groups: "{groups}"'
            self._announce((reads, volume, groups), f"roomkeeper guard is on {{{text}}}")


@dataclass(frozen=True, slots=True)
class _Ask:
    """One admission question: the job, its sizes, and what young jobs hold besides it."""

    job_id: str
    estimate: int
    job_disk: int
    reserved: int  # what the other young jobs hold now
    young: int  # how many other young jobs hold it


@dataclass(frozen=True, slots=True)
class _MemoryRoom:
    """The memory rule's numbers for one job, and the words that show them."""

    line: int  # limit - headroom - the caller's reserve
    total: int  # used + reserved + estimate
    figures: str  # every number, with ``%s`` where the comparison goes


def _memory_room(
    ask: _Ask, memory: MemoryReading, used: int, limit: int, settings: Settings, reserve: int
) -> _MemoryRoom:
    """The memory rule's line and total for ``ask``, from a known reading."""
    line = memory_line(limit, settings.memory_headroom_percent) - reserve
    total = used + ask.reserved + ask.estimate
    stated = " stated" if memory.limit_origin is LimitOrigin.STATED else ""
    figures = (
        f"used {_g(used)} + young {_g(ask.reserved)} ({ask.young}) + job {_g(ask.estimate)} "
        f"= {_g(total)} %s line {_g(line)} (limit {_g(limit)}{stated}, {memory.source.value})"
    )
    return _MemoryRoom(line=line, total=total, figures=figures)


def _disk_rule(
    ask: _Ask, disk: DiskReading, room: _MemoryRoom, headroom_percent: float
) -> tuple[Reason, str]:
    """The disk rule, once memory has room: the reason (unknown, disk or ok) and the summary."""
    if disk.free_bytes is None or disk.total_bytes is None:
        return Reason.UNKNOWN, f"measurements unavailable: disk unknown ({disk.unknown_reason})"
    needed = disk_needed(ask.job_disk, disk.total_bytes, headroom_percent)
    disk_figures = (
        f"free {_g(disk.free_bytes)}, needs {_g(needed)} (job {_g(ask.job_disk)}) "
        f"of {_g(disk.total_bytes)}"
    )
    if disk.free_bytes < needed:
        return Reason.DISK, f"no room on disk (GB): {disk_figures}; memory {room.figures % '<='}"
    return Reason.OK, f"room (GB): memory {room.figures % '<='}; disk {disk_figures}"


def _decision(
    ask: _Ask,
    *,
    admit: bool,
    reason: Reason,
    summary: str,
    memory: MemoryReading | None = None,
    disk: DiskReading | None = None,
    room: _MemoryRoom | None = None,
) -> Decision:
    """The decision for ``ask``; the young jobs' hold and the line once memory was judged."""
    return Decision(
        job_id=ask.job_id,
        admit=admit,
        reason=reason,
        summary=_fit(summary),
        memory=memory,
        disk=disk,
        estimate_bytes=ask.estimate,
        young_reserved_bytes=ask.reserved if room is not None else 0,
        memory_line_bytes=room.line if room is not None else None,
    )

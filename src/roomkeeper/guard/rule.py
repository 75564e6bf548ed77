"""The guard's rule, pure: the memory and disk lines, and the words of a decision.

::

    refuse for memory when  used + sum(young reservations) + estimate
                            > limit - min(limit x headroom%, 8 GB)
    refuse for disk when    free < job_disk + min(total x headroom%, 10 GB)

Nothing here reads the kernel or holds state: :class:`roomkeeper.guard.admission.Guard`
takes the readings, keeps the young reservations, and asks these functions.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Self

from roomkeeper.config import Settings
from roomkeeper.kernel.resources import DiskReading, LimitOrigin, MemoryReading, MemorySource
from roomkeeper.units import GB

MEMORY_HEADROOM_CAP = 8 * GB  # decimal: 8,000,000,000 bytes
DISK_HEADROOM_CAP = 10 * GB  # decimal: 10,000,000,000 bytes
SUMMARY_LIMIT = 200


class Word(enum.Enum):
    """A word of a closed vocabulary: its code on the wire and its description for people.

    Each vocabulary is a subclass that lives with the part that decides its words
    (the rule's :class:`Reason` here, the scheduler's, the relief ladder's, the
    cluster's, the journal's), and writes each member as ``CODE = "code",
    "description"``: a word without its description cannot be written.  The API
    and the Health page take the codes and the descriptions from these classes
    (:mod:`roomkeeper.api.words` puts them together), never from a copy.
    """

    _value_: str
    description: str

    def __new__(cls, code: str, description: str) -> Self:
        member = object.__new__(cls)
        member._value_ = code
        member.description = description
        return member

    # Written out so the code types as the string it is (the members are written as
    # (code, description) pairs; the value is the code alone).
    @property
    def value(self) -> str:
        """The word's code, as the wire, the journal and ``/metrics`` carry it."""
        return self._value_

    @classmethod
    def from_code(cls, code: str) -> Self:
        """The member whose code is ``code``.

        Raises:
            ValueError: no member of this vocabulary has that code.
        """
        for member in cls:
            if member.value == code:
                return member
        raise ValueError(f"{code!r} is not a {cls.__name__} code")


class Reason(Word):
    """Why the admission rule decided as it did: room, no room, or no judgement."""

    OK = "ok", "room for it"
    NO_CONTAINER = "no_container", "no container to protect"  # not Linux: admitted
    OFF = "off", "guard off"  # ROOMKEEPER_GUARD=off: admitted without a check
    MEMORY = "memory", "no room in memory"  # in the container's memory (or on any node)
    DISK = "disk", "no room on disk"  # on the workspace volume
    UNKNOWN = "unknown", "measurements unavailable"  # a reading could not be taken: refused


ADMITTING_REASONS = (Reason.OK, Reason.OFF, Reason.NO_CONTAINER)
"""The rule's reasons that admit; every other :class:`Reason` refuses."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The guard's answer for one job.

    Attributes:
        job_id: the job judged.
        admit: whether it may start.
        reason: why, a :class:`Word`: the rule's :class:`Reason`, or the word of the
            part that judged instead (the scheduler's CPU gate, the cluster's placement).
        summary: every number that decided it, in decimal GB, under 200
            characters and without a path, fit for a browser or a log.
        memory: the memory reading judged (None when the guard is off).
        disk: the disk reading judged (None when memory already refused).
        estimate_bytes: the memory this job was expected to hold.
        young_reserved_bytes: what young jobs held when it was judged.
        memory_line_bytes: limit minus headroom (None when unknown).
        never_fits: refused, and it could not fit even with nothing else running:
            its memory estimate is above the line, or its disk need above the
            volume's total.  Waiting would be for ever: such a job is failed at once.
        disk_needed_bytes: the free space the disk rule asked for (the guard's
            own line: what pruning worktrees must reach), when disk was judged.
        aside: refused because nothing that exists now could hold it (no node of
            a cluster is that large), though something may come (a node joins):
            the job waits aside and the jobs behind it are judged meanwhile.
    """

    job_id: str
    admit: bool
    reason: Word
    summary: str
    memory: MemoryReading | None = None
    disk: DiskReading | None = None
    estimate_bytes: int = 0
    young_reserved_bytes: int = 0
    memory_line_bytes: int | None = None
    never_fits: bool = False
    disk_needed_bytes: int | None = None
    aside: bool = False


def memory_line(limit: int, headroom_percent: float) -> int:
    """The line used memory must stay under: ``limit - min(limit x headroom%, 8 GB)``."""
    return limit - min(int(limit * headroom_percent / 100), MEMORY_HEADROOM_CAP)


def suspend_line(limit: int, headroom_percent: float) -> int:
    """Where the relief ladder suspends: past :func:`memory_line` by half the headroom."""
    line = memory_line(limit, headroom_percent)
    return line + (limit - line) // 2


DEFAULT_SHARE_OF_LINE = 4  # with nothing stated or learned, a job is at most a quarter of the line


def default_estimate(job_memory_bytes: int, line: int) -> int:
    """A job's estimate when nobody stated or learned one: ROOMKEEPER_JOB_MEMORY_MB, but never
    more than a quarter of the line, so that a small container still runs unknown work (and
    its growth, measured, decides the rest)."""
    return min(job_memory_bytes, max(0, line) // DEFAULT_SHARE_OF_LINE)


DEFAULT_SHARE_OF_VOLUME = 2  # with nothing stated, a job's disk ask is at most half the volume


def default_disk(job_disk_bytes: int, total: int) -> int:
    """A job's disk ask when it stated none: ROOMKEEPER_JOB_DISK_MB, but never more than half
    the volume, so that a small volume (a container's /tmp) still runs work."""
    return min(job_disk_bytes, max(0, total) // DEFAULT_SHARE_OF_VOLUME)


def disk_needed(job_disk: int, total: int, headroom_percent: float) -> int:
    """Free space a start needs: ``job_disk + min(total x headroom%, 10 GB)``."""
    return job_disk + min(int(total * headroom_percent / 100), DISK_HEADROOM_CAP)


def gb(n_bytes: int) -> str:
    """Decimal GB, two places: the unit is named once per summary clause."""
    return f"{n_bytes / GB:.2f}"


def fit_summary(summary: str) -> str:
    return summary if len(summary) < SUMMARY_LIMIT else summary[: SUMMARY_LIMIT - 2] + "…"


@dataclass(frozen=True, slots=True)
class Ask:
    """One admission question: the job, its sizes, and what young jobs hold besides it."""

    job_id: str
    estimate: int
    job_disk: int
    reserved: int  # what the other young jobs hold now
    young: int  # how many other young jobs hold it
    defaulted: bool = False  # the estimate is a default, not the job's own: never "never fits"
    disk_defaulted: bool = False  # likewise for the disk ask

    def resized(
        self,
        *,
        estimate: int | None = None,
        job_disk: int | None = None,
        defaulted: bool | None = None,
    ) -> Ask:
        """The same question with another memory estimate or disk ask (None: as it is).
        Built directly, not by dataclasses.replace: a decision makes two of these, and
        replace's generic copy costs more than the rest of the judging."""
        return Ask(
            job_id=self.job_id,
            estimate=self.estimate if estimate is None else estimate,
            job_disk=self.job_disk if job_disk is None else job_disk,
            reserved=self.reserved,
            young=self.young,
            defaulted=self.defaulted if defaulted is None else defaulted,
            disk_defaulted=self.disk_defaulted,
        )


@dataclass(frozen=True, slots=True)
class MemoryRoom:
    """The memory rule's numbers for one job, and the words that show them."""

    line: int  # limit - headroom - the caller's reserve
    total: int  # used + reserved + estimate
    figures: str  # every number, with ``%s`` where the comparison goes


def memory_room(
    ask: Ask, memory: MemoryReading, used: int, limit: int, settings: Settings, reserve: int
) -> MemoryRoom:
    """The memory rule's line and total for ``ask``, from a known reading."""
    line = memory_line(limit, settings.memory_headroom_percent) - reserve
    total = used + ask.reserved + ask.estimate
    figures = (
        f"used {gb(used)} + young {gb(ask.reserved)} ({ask.young}) + job {gb(ask.estimate)} "
        f"= {gb(total)} %s {_line_words(line, limit, memory.limit_origin, memory.source)}"
    )
    return MemoryRoom(line=line, total=total, figures=figures)


@functools.lru_cache(maxsize=64)
def _line_words(line: int, limit: int, origin: LimitOrigin, source: MemorySource) -> str:
    """The line and the limit it comes from, in words: the same for decision after decision."""
    stated = " stated" if origin is LimitOrigin.STATED else ""
    return f"line {gb(line)} (limit {gb(limit)}{stated}, {source.value})"


def disk_rule(
    ask: Ask, disk: DiskReading, room: MemoryRoom, headroom_percent: float
) -> tuple[Reason, str, bool]:
    """The disk rule, once memory has room: the reason (unknown, disk or ok), the summary,
    and whether the job could never fit on this volume."""
    if disk.free_bytes is None or disk.total_bytes is None:
        summary = f"measurements unavailable: disk unknown ({disk.unknown_reason})"
        return Reason.UNKNOWN, summary, False
    needed = disk_needed(ask.job_disk, disk.total_bytes, headroom_percent)
    disk_figures = (
        f"free {gb(disk.free_bytes)}, {_disk_words(needed, ask.job_disk, disk.total_bytes)}"
    )
    if needed > disk.total_bytes:
        return (
            Reason.DISK,
            f"no room on disk even when it is empty (GB): needs {gb(needed)} > total "
            f"{gb(disk.total_bytes)}; memory {room.figures % '<='}",
            True,
        )
    if disk.free_bytes < needed:
        summary = f"no room on disk (GB): {disk_figures}; memory {room.figures % '<='}"
        return Reason.DISK, summary, False
    return Reason.OK, f"room (GB): memory {room.figures % '<='}; disk {disk_figures}", False


@functools.lru_cache(maxsize=64)
def _disk_words(needed: int, job_disk: int, total: int) -> str:
    """What a start needs of the volume, in words: the same for decision after decision."""
    return f"needs {gb(needed)} (job {gb(job_disk)}) of {gb(total)}"


def decision(
    ask: Ask,
    *,
    admit: bool,
    reason: Reason,
    summary: str,
    memory: MemoryReading | None = None,
    disk: DiskReading | None = None,
    room: MemoryRoom | None = None,
    never_fits: bool = False,
    disk_needed: int | None = None,
) -> Decision:
    """The decision for ``ask``; the young jobs' hold and the line once memory was judged."""
    return Decision(
        job_id=ask.job_id,
        admit=admit,
        reason=reason,
        summary=fit_summary(summary),
        memory=memory,
        disk=disk,
        estimate_bytes=ask.estimate,
        young_reserved_bytes=ask.reserved if room is not None else 0,
        memory_line_bytes=room.line if room is not None else None,
        never_fits=never_fits,
        disk_needed_bytes=disk_needed,
    )

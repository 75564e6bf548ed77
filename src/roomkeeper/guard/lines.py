"""The lines the guard draws on memory, in one reading the pressure monitor judges.

Admission stops at the hold line; the relief ladder suspends past the
suspend line and stops past the stop line.  All three come from the same
limit and headroom the admission rule uses, so admission and relief never
disagree about where "full" is.
"""

from __future__ import annotations

from dataclasses import dataclass

from roomkeeper.guard.rule import memory_line, suspend_line


@dataclass(frozen=True, slots=True)
class Reading:
    """What the monitor read: the guard's own numbers, and the container's PSI.

    Attributes:
        used: non-reclaimable memory of the container (the guard's "used").
        limit: the container's effective limit.
        headroom_percent: ROOMKEEPER_MEMORY_HEADROOM_PERCENT.
        reserve: what the guard keeps free on top of the headroom (the gateway's own).
        full_avg10: PSI memory ``full`` avg10 of the container, None where it has none
            (a host-wide figure is never given when a container limit exists).
        at: monotonic seconds.
        directory: the container's cgroup directory, where notifications are armed.
        version: its cgroup version (None without a cgroup).
        claimed: what the young jobs not on trial claim against those on trial
            (:func:`roomkeeper.guard.packing.claim_bytes`).
    """

    used: int
    limit: int
    headroom_percent: float
    reserve: int
    full_avg10: float | None
    at: float
    directory: str | None = None
    version: int | None = None
    claimed: int = 0

    @property
    def headroom(self) -> int:
        """The guard's headroom: limit minus its line."""
        return self.limit - memory_line(self.limit, self.headroom_percent)

    @property
    def hold_line(self) -> int:
        """The guard's own line: nothing is admitted past it."""
        return memory_line(self.limit, self.headroom_percent) - self.reserve

    @property
    def suspend_line(self) -> int:
        """Past the line by half the headroom."""
        return suspend_line(self.limit, self.headroom_percent)

    @property
    def stop_line(self) -> int:
        """Within a quarter of the headroom of the limit."""
        return self.limit - self.headroom // 4

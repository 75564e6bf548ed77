"""Granted leases measured from the container's growth, so none is counted twice.

:class:`LeaseGrowth` reads the guard's ``used`` and our running jobs'
footprints at each step (the baseline keeper's, every half second), keeps
the base (what the container holds that is none of our work: taken at quiet moments, raised as
:func:`~roomkeeper.guard.attribution.raised_base` allows), attributes the growth
since to the granted leases oldest first
(:mod:`roomkeeper.guard.attribution` states the rule and why it is sound), and
tells the guard each lease's share as its measured memory.  A young lease then
reserves only the part of its estimate its work has not yet allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from roomkeeper.guard.admission import Guard
from roomkeeper.guard.attribution import Holder, attribute, raised_base
from roomkeeper.guard.leases import Leases, LeaseState, guard_key
from roomkeeper.jobs.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class LeaseGrowthStatistics:
    """A snapshot of the attribution.

    Attributes:
        base_bytes: the base now; None until a quiet moment was seen (nothing attributed).
        grown_bytes: the growth attributed from at the last step.
        measured: each granted lease's id to its attributed bytes at the last step.
    """

    base_bytes: int | None
    grown_bytes: int
    measured: Mapping[str, int]


class LeaseGrowth:
    """Attributes the container's growth to granted leases and reports it to the guard.

    Args:
        guard: whose reading gives ``used``, and whose reservations are reported to.
        scheduler: our running jobs' footprints, and whether any runs.
        leases: the granted leases.
    """

    def __init__(
        self,
        *,
        guard: Guard,
        scheduler: Scheduler,
        leases: Leases,
    ) -> None:
        self._guard = guard
        self._scheduler = scheduler
        self._leases = leases
        self._base: int | None = None
        self._grown = 0
        self._measured: dict[str, int] = {}

    def step(self) -> None:
        """One reading: record the base when quiet, else attribute and report the growth."""
        reading = self._guard.memory_reading()
        if reading is None:
            return
        footprints = self._scheduler.local_footprints()
        unexplained = reading.used - footprints
        granted = [v for v in self._leases.views() if v.state is LeaseState.GRANTED]
        if not granted and not self._scheduler.local_sessions():
            self._base = unexplained  # quiet: all that is here is nobody's work of ours
            self._grown, self._measured = 0, {}
            return
        if self._base is None:
            return  # never seen quiet: every lease keeps its whole reservation
        holders = [
            Holder(v.id, v.granted_at, v.terms.memory_bytes or 0)
            for v in granted
            if v.terms.memory_bytes
        ]
        self._base = raised_base(self._base, unexplained, holders)
        self._grown = unexplained - self._base
        self._measured = dict(attribute(self._grown, holders))
        for lease_id, measured in self._measured.items():
            self._guard.report_measured(guard_key(lease_id), measured)

    def statistics(self) -> LeaseGrowthStatistics:
        """The base, the growth and each lease's share at the last step."""
        return LeaseGrowthStatistics(self._base, self._grown, dict(self._measured))

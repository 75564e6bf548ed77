"""Granted leases measured from the container's growth, so none is counted twice.

:class:`LeaseGrowth` reads the guard's ``used`` and our running jobs'
footprints at each step (the baseline keeper's, every half second), keeps
the base (what the container holds that is none of our work: taken at quiet moments, raised as
:func:`~roomkeeper.guard.attribution.raised_base` allows), attributes the growth
since to the leases that hold a reservation (granted, or ended with a release hook still
running) oldest first
(:mod:`roomkeeper.guard.attribution` states the rule and why it is sound), and
tells the guard each lease's share as its measured memory.  A young lease then
reserves only the part of its estimate its work has not yet allocated.

It also learns what a lease of a ``kind`` takes.  Nothing measures one lease's work
alone, but its memory leaves the container when it ends: :meth:`LeaseGrowth.sample`
reads the container every :data:`SAMPLE_EVERY_S` while a lease of a kind is granted.
A lease released (not expired: an expiry comes long after, or before, its work gave
anything back) with no other lease ending within twice :data:`LEARN_WINDOW_S` before or
after it is measured once that has passed: the largest fall of the readings, reading
after falling reading without a rise between, from :data:`LEARN_WINDOW_S` before its
end to as long after (its holder may tell its end before or after its work gives its
memory back).  That fall is kept as a run of ``kind:<kind>``, as a job's peak is.
Other work growing in the same tenth of a second makes it smaller, and other work's
falls are separate runs, never added to it.  Leases that end close together are not told
apart, and a fall under :data:`LEARN_MIN_BYTES` is memory not given back at the end
(work that keeps its memory, or ran elsewhere): neither is kept.  How the kept runs
size a lease: :func:`~roomkeeper.jobs.sizes.lease_size`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from roomkeeper.guard.admission import Guard
from roomkeeper.guard.attribution import Holder, attribute, raised_base
from roomkeeper.guard.leases import Leases, LeaseState, guard_key
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.sizes import KIND_PREFIX, LEAST_RUN_BYTES

log = logging.getLogger(__name__)

LEARN_WINDOW_S = 1.0
"""How far before and after its end a lease's memory is looked for falling: a holder may
tell its end a little before or after its work gives its memory back (a hook's process
starts first).  Another end within twice this, either side, may have its own fall in the
window, so such a lease teaches nothing."""
SAMPLE_EVERY_S = 0.1
"""How often the container is read while a lease of a kind is granted: the less time
between two readings, the less of other work's growth hides in the fall between them."""
LEARN_MIN_BYTES = LEAST_RUN_BYTES
"""The least fall kept as a lease's size: less is noise, or memory not given back."""


@dataclass(frozen=True, slots=True)
class LeaseGrowthStatistics:
    """A snapshot of the attribution.

    Attributes:
        base_bytes: the base now; None until a quiet moment was seen (nothing attributed).
        grown_bytes: the growth attributed from at the last step.
        measured: each holding lease's id to its attributed bytes at the last step.
        learned: each kind to the last size its ended leases taught (this run).
    """

    base_bytes: int | None
    grown_bytes: int
    measured: Mapping[str, int]
    learned: Mapping[str, int]


class LeaseGrowth:
    """Attributes the container's growth to holding leases and reports it to the guard.

    Args:
        guard: whose reading gives ``used``, and whose reservations are reported to.
        scheduler: our running jobs' footprints, and whether any runs.
        leases: the leases (those holding a reservation are measured).
        learn: keeps one ended lease's size under its kind's key (``kind:<kind>``).
        clock: seconds, for the window an ended lease's memory is looked for in.
    """

    def __init__(
        self,
        *,
        guard: Guard,
        scheduler: Scheduler,
        leases: Leases,
        learn: Callable[[str, int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._guard = guard
        self._scheduler = scheduler
        self._leases = leases
        self._learn = learn
        self._clock = clock
        self._base: int | None = None
        self._grown = 0
        self._measured: dict[str, int] = {}
        self._readings: deque[tuple[float, int]] = deque()  # (at, unexplained), the window's
        self._granted: dict[str, str | None] = {}  # granted at the last step: id to kind
        self._ends_seen = 0  # leases ended by the last step, however they ended
        self._last_end = float("-inf")
        self._pending: tuple[float, str] | None = None  # (ended at, kind): measured later
        self._learned: dict[str, int] = {}

    def step(self) -> None:
        """One reading: record the base when quiet, else attribute and report the growth."""
        reading = self._guard.memory_reading()
        if reading is None:
            return
        unexplained = reading.used - self._scheduler.local_footprints()
        # An ended lease whose release hook still runs holds its reservation, and its
        # session may hold memory: it is a holder until the hook finishes.
        holding = self._leases.holding()
        if not holding and not self._scheduler.local_sessions():
            self._base = unexplained  # quiet: all that is here is nobody's work of ours
            self._grown, self._measured = 0, {}
            return
        if self._base is None:
            return  # never seen quiet: every lease keeps its whole reservation
        holders = [
            Holder(v.id, v.granted_at, v.terms.memory_bytes or 0)
            for v in holding
            if v.terms.memory_bytes
        ]
        self._base = raised_base(self._base, unexplained, holders)
        self._grown = unexplained - self._base
        self._measured = dict(attribute(self._grown, holders))
        for lease_id, measured in self._measured.items():
            # A lease that ended since the reading makes the share stale: the guard knows.
            self._guard.report_measured(guard_key(lease_id), measured, shared_read_at=reading.at)

    def sample(self) -> None:
        """One quick look for learning: which leases ended, and, while a lease of a kind is
        granted or an end waits to be kept, a reading of the container."""
        now = self._clock()
        views = self._leases.views()
        granted = {v.id: v.terms.kind for v in views if v.state is LeaseState.GRANTED}
        ends = self._ends()
        # Counted, not only seen: a lease granted and ended between two samples ended too.
        new_ends, self._ends_seen = ends - self._ends_seen, ends
        ended: list[str | None] = []
        if new_ends > 0:
            released = {v.id for v in views if v.state is LeaseState.RELEASED}
            ended = [k for i, k in self._granted.items() if i not in granted and i in released]
        watching = self._pending is not None or any(
            kind is not None for kind in (*granted.values(), *self._granted.values())
        )
        self._granted = granted
        reading = self._guard.memory_reading() if watching else None
        if reading is not None:
            self._readings.append((now, reading.used - self._scheduler.local_footprints()))
        else:
            self._readings.clear()  # a gap: no fall is measured across it
        while self._readings and now - self._readings[0][0] > 3 * LEARN_WINDOW_S:
            self._readings.popleft()
        apart = 2 * LEARN_WINDOW_S  # no other end's fall can be in this one's window
        if new_ends > 0:
            alone = len(ended) == new_ends == 1 and now - self._last_end > apart
            # Another end close after a pending one: whose fall is whose is not known.
            self._pending = (now, ended[0]) if alone and ended[0] is not None else None
            self._last_end = now
        elif self._pending is not None and now - self._pending[0] > apart:
            at, kind = self._pending
            self._pending = None
            window = [u for t, u in self._readings if abs(t - at) <= LEARN_WINDOW_S]
            fell = _largest_fall(window)
            if fell >= LEARN_MIN_BYTES:
                self._learned[kind] = fell
                self._learn(KIND_PREFIX + kind, fell)
                log.debug("a lease of kind %s gave back %d MiB as it ended", kind, fell >> 20)

    def _ends(self) -> int:
        return sum(n for state, n in self._leases.counts().items() if state != "granted")

    def statistics(self) -> LeaseGrowthStatistics:
        """The base, the growth, each lease's share at the last step, and what was learned."""
        return LeaseGrowthStatistics(
            self._base, self._grown, dict(self._measured), dict(self._learned)
        )


def _largest_fall(readings: list[int]) -> int:
    """The most the readings fell in one run of falls (each reading at or under the one
    before); 0 when they never fell.  A rise ends a run: another holder's growth and
    shrinking between are not added to it."""
    largest, top = 0, readings[0] if readings else 0
    for before, after in itertools.pairwise(readings):
        if after > before:
            top = after
        largest = max(largest, top - after)
    return largest

"""Leases' memory, attributed from the container's growth that is not our jobs'.

A lease's work runs in processes roomkeeper does not spawn, so nothing measures
it alone; but where that work runs in the guard's own container, its memory
shows in ``used`` as it grows, beside the lease's reservation of its whole
estimate.  Unattributed, every lease is counted twice (once in the reading,
once in its reservation) for its whole warm-up window.  The rule::

    base   = used - our running jobs' footprints, at the last quiet moment
             (no job of ours running, no lease holding), raised to at least
             used - footprints - sum(holding leases' estimates) at every step
    grown  = used - our running jobs' footprints - base
    holding leases, oldest first:  measured = min(estimate, what is left of grown)

(a holding lease is a granted one, or one that ended and whose release hook still runs:
its reservation stands, and its session may still hold memory.)

Each young lease then reserves ``max(0, estimate - measured)``
(:meth:`~roomkeeper.guard.admission.Guard.report_measured`).

Why this never reserves less than the leases may still grow into: the leases'
own memory is at most ``grown`` (``base`` is what was there before any of them,
and only rises), and what the reservations drop together is at most what was
attributed, which is at most ``grown``; so ``used + reservations`` stays at or
above ``base + every lease's estimate``, which is what the container holds once
every lease has grown to its estimate.  Which lease is attributed what does not
change that sum; oldest first gives the memory to the leases whose work has had
longest to allocate it, and a lease just granted (its work not started) keeps
its whole reservation.

That holds at the step, from one reading.  Between steps a lease may end: its work's
memory leaves the reading and its reservation goes, while what the others were told may
be that work's (oldest first gives a slow lease a quick one's growth).  So an end makes
every other lease reserve its whole estimate again, and a step whose reading came
before an end, or less than :data:`ENDED_WORK_SETTLES_S` after it, tells nothing
(:meth:`~roomkeeper.guard.admission.Guard.release_shared`): a holder may tell its end
before its work gives the memory back.

What it assumes, said where it fails: growth since the quiet moment that is
neither our jobs' nor the leases' (another program in the container, memory an
ended lease's work never gave back) is taken for the leases' and shortens their
reservations by as much.  The raise of ``base`` bounds that while the leases keep
to their estimates, the gateway's reserve (``ROOMKEEPER_GATEWAY_RESERVE_MB``)
covers the gateway's own growth, and the pressure monitor relieves what is left.
With no quiet moment seen since the gateway started, nothing is attributed: every
lease keeps its whole reservation.  Nothing here reads the kernel or a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ENDED_WORK_SETTLES_S = 1.0
"""How long after a lease ends its work may still be giving its memory back (a holder may
tell its end first): shares read in that time may hold the ended work's memory, which is
no remaining lease's, so none is taken."""


@dataclass(frozen=True, slots=True)
class Holder:
    """One holding lease as attribution sees it.

    Attributes:
        key: its reservation's key in the guard.
        started: when it was granted (any clock, the same for every holder).
        estimate: what it reserves unmeasured: the most it is attributed.
    """

    key: str
    started: float
    estimate: int


def raised_base(base: int, unexplained: int, holders: Iterable[Holder]) -> int:
    """The base, raised to what the leases cannot explain while they keep to their estimates.

    Args:
        base: the base so far (``used`` less our jobs' footprints at a quiet moment).
        unexplained: ``used`` less our running jobs' footprints now.
        holders: every holding lease.
    """
    return max(base, unexplained - sum(h.estimate for h in holders))


def attribute(grown: int, holders: Iterable[Holder]) -> Mapping[str, int]:
    """What each lease is attributed of ``grown``: oldest first, each at most its estimate.

    Args:
        grown: the container's growth since the base that is not our jobs' (below 0 is 0).
        holders: every holding lease.

    Returns:
        Each holder's key to its measured bytes (0 once ``grown`` is spent).
    """
    left = max(0, grown)
    measured: dict[str, int] = {}
    for holder in sorted(holders, key=lambda h: (h.started, h.key)):
        share = min(max(0, holder.estimate), left)
        measured[holder.key] = share
        left -= share
    return measured

"""Memory policies, pure: what a young job reserves under ``strict`` and under ``pack``.

``strict`` is seed 000's rule as the guard has always applied it: a young job
reserves ``max(0, estimate - measured)`` until its warm-up window ends.

``pack`` fills the container by measurement: once it has been observed for
:data:`OBSERVE_SECONDS`, a young job reserves only what its observed growth
forecasts for the next :data:`HORIZON_SECONDS`::

    forecast = max(0, slope) x HORIZON_SECONDS + FLOOR_BYTES
    held     = min(forecast, max(0, estimate - measured))

where ``slope`` is the growth of its measured footprint over the reports of
the last :data:`SLOPE_WINDOW_SECONDS` (the admission itself counts as a
report of 0 bytes, so a job's first report already gives a slope).  The
forecast is never more than ``strict`` would hold: packing only ever
reserves less.  Before its first report :data:`OBSERVE_SECONDS` after its
admission a job has no observed growth, only a start-up: it holds what
``strict`` holds, so a burst of launches in one round cannot each count as
a floor's worth.  What a forecast misses, the pressure monitor's relief
ladder answers (issue 12); that is why ``pack`` is only for work roomkeeper
itself runs and can suspend, never for leases.

Nothing here reads the kernel or holds state; :class:`roomkeeper.guard.admission.Guard`
keeps each young job's reports and asks :func:`held_bytes`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from roomkeeper.units import MIB

HORIZON_SECONDS = 3.0  # how far ahead a pack reservation looks
SLOPE_WINDOW_SECONDS = 3.0  # the reports a slope is taken over: the recent ones
FLOOR_BYTES = 64 * MIB  # held on top of the forecast: a job that has not grown yet still costs
OBSERVE_SECONDS = 0.5  # a pack job holds its strict reservation until observed this long
REPORTS_KEPT = 16  # per young job; more than the window ever needs at the scheduler's rate


class MemoryPolicy(enum.Enum):
    """How much a young job reserves until its warm-up window ends."""

    STRICT = "strict"  # its estimate less its measured footprint (seed 000)
    PACK = "pack"  # what its measured growth forecasts, at most what strict holds


@dataclass(frozen=True, slots=True)
class Report:
    """One measurement of a young job's own footprint, at monotonic seconds ``at``."""

    at: float
    measured: int


def growth_slope(reports: Sequence[Report], window_s: float = SLOPE_WINDOW_SECONDS) -> float:
    """Bytes per second between the oldest report in the window and the newest.

    The oldest report older than the window is kept as the window's start
    when no other is inside it, so two reports always give a slope.  Fewer
    than two reports, or no time between them, give 0.0.
    """
    if len(reports) < 2:
        return 0.0
    newest = reports[-1]
    start = reports[-2]
    for report in reports[:-1]:
        if newest.at - report.at <= window_s:
            start = report
            break
    elapsed = newest.at - start.at
    if elapsed <= 0:
        return 0.0
    return (newest.measured - start.measured) / elapsed


def forecast_bytes(
    reports: Sequence[Report],
    *,
    horizon_s: float = HORIZON_SECONDS,
    floor: int = FLOOR_BYTES,
    window_s: float = SLOPE_WINDOW_SECONDS,
) -> int:
    """What a job growing as measured will add over ``horizon_s``, plus ``floor``."""
    return int(max(0.0, growth_slope(reports, window_s)) * horizon_s) + floor


def held_bytes(policy: MemoryPolicy, estimate: int, reports: Sequence[Report]) -> int:
    """What a young job reserves now under ``policy``.

    Args:
        policy: the job's memory policy.
        estimate: the memory it is expected to hold at most.
        reports: its measured footprints, oldest first; the first is its admission (0 bytes).
    """
    measured = reports[-1].measured if reports else 0
    strict = max(0, estimate - measured)
    if policy is MemoryPolicy.STRICT or not observed(reports):
        return strict
    return min(strict, forecast_bytes(reports))


def observed(reports: Sequence[Report], observe_s: float = OBSERVE_SECONDS) -> bool:
    """Whether the reports span ``observe_s`` since the first (the admission)."""
    return len(reports) >= 2 and reports[-1].at - reports[0].at >= observe_s

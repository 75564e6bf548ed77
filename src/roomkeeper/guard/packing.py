"""Memory policies, pure: what a young job reserves under ``strict`` and under ``pack``.

``strict`` is the admission rule as the guard has always applied it: a young job
reserves ``max(0, estimate - measured)`` until its warm-up window ends.

``pack`` fills the container by measurement: once its growth has been seen
(:func:`observed`, below), a young job reserves only what that growth
forecasts for the next :data:`HORIZON_SECONDS`::

    forecast = max(0, slope) x HORIZON_SECONDS + FLOOR_BYTES
    held     = min(forecast, max(0, estimate - measured))

where ``slope`` is the larger of its measured growth over the reports of the
last :data:`SLOPE_WINDOW_SECONDS` and over the last :data:`RECENT_SECONDS`
(the admission itself counts as a report of 0 bytes, so a job's first report
already gives a slope; the recent one catches a job that has just begun to
grow fast, whose long average still carries its idle start).  The forecast
is never more than ``strict`` would hold: packing only ever reserves less.

A job is judged by its growth only once that growth has been seen: from
the first report at :data:`STARTED_BYTES` or more (an interpreter or a shell
alone is less) for :data:`OBSERVE_SECONDS`, or, for one that stays below
that, :data:`IDLE_OBSERVE_SECONDS` after its admission.  Until then it
holds what ``strict`` holds: a burst of launches in one round cannot each
count as a floor's worth, and a job still importing its libraries half a
second after its start does not look small (a swarm whose jobs slept 0.4 s
before growing was stopped once, with its 60 s cooldown, when half a second
from admission was enough).  What a forecast misses, the pressure monitor's relief
ladder answers; that is why ``pack`` is only for work roomkeeper
itself runs and can suspend, never for leases.

**Trials.**  With nothing learned, a new job must be assumed as large as its
estimate, and a container whose running jobs are near their peak rarely has
that much room: admission alone would run no more jobs at once than a static
``-j`` does.  A pack job that does not fit with its estimate may instead
start *on trial* when it fits as if it asked only :data:`FLOOR_BYTES`, at
most :data:`MAX_TRIALS` at a time; while any job is on trial, no pack job
starts otherwise (the queue's order holds).  A job on trial reserves
nothing: it runs only in room that no other job's reservation claims, and
the pressure monitor pauses it, newest first, as soon as used memory plus
the others' claims (:func:`claim_bytes`) pass the ladder's suspend line,
and lets it go on, oldest first, once they are :data:`TRIAL_RESUME_MARGIN`
below it (and no job off trial waits suspended).  A claim is a job's
reservation; while it is still growing (more than :data:`GROWING_BYTES` over
the last :data:`GROWING_WINDOW_SECONDS`) the whole rest of its estimate, since
a forecast misses growth that lasts longer than its horizon and a trial must
never take the room such growth needs; once an observed job has settled, its
last second's growth over the horizon, which may be less than its
reservation (the 3 s window still remembers growth that has stopped).  Only
a pack job off trial is yielded to: beside leases or strict jobs alone,
which may be work the monitor cannot see, nothing starts on trial.
A job leaves its trial once the rest of its estimate fits under the line
beside the others' claims (:func:`leaves_trial`); from then on it reserves
as any pack job does.  A paused job has lost nothing: when a wave of jobs
ends, those on trial go on from where they stood instead of starting.

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
OBSERVE_SECONDS = 0.5  # a pack job holds its strict reservation until seen growing this long
STARTED_BYTES = 16 * MIB  # a footprint this large: the job's own work has begun
IDLE_OBSERVE_SECONDS = 2.0  # a job still below STARTED_BYTES this long after admission is small
RECENT_SECONDS = 0.5  # the short window of the slope: growth that has just begun
REPORTS_KEPT = 40  # newest per young job (4 s at the monitor's 10 a second: the slope window),
# besides the two observation dates from (see trimmed)
MAX_TRIALS = 3  # jobs on trial at once: more paused at once only waits longer, and grows together
GROWING_WINDOW_SECONDS = 1.0  # a job that grew more than GROWING_BYTES over this still grows
GROWING_BYTES = 32 * MIB
TRIAL_RESUME_MARGIN = 32 * MIB  # a paused trial goes on this far below the suspend line


class MemoryPolicy(enum.Enum):
    """How much a young job reserves until its warm-up window ends."""

    STRICT = "strict"  # its estimate less its measured footprint
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
    """What a job growing as measured will add over ``horizon_s``, plus ``floor``.

    The slope is the steeper of the window's and the last :data:`RECENT_SECONDS`'.
    """
    slope = max(growth_slope(reports, window_s), growth_slope(reports, RECENT_SECONDS))
    return int(max(0.0, slope) * horizon_s) + floor


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


def trimmed(reports: list[Report], kept: int = REPORTS_KEPT) -> list[Report]:
    """The newest ``kept`` reports, and always the two that :func:`observed` dates from:
    the admission (the first) and the first at :data:`STARTED_BYTES` or more; in time order."""
    if len(reports) <= kept:
        return reports
    keep = {0, *range(len(reports) - kept, len(reports))}
    began = _began(reports)
    if began is not None:
        keep.add(began)
    return [reports[i] for i in sorted(keep)]


def observed(reports: Sequence[Report], observe_s: float = OBSERVE_SECONDS) -> bool:
    """Whether the job's growth has been seen: ``observe_s`` since its first report at
    :data:`STARTED_BYTES` or more or, for a job that has not got there,
    :data:`IDLE_OBSERVE_SECONDS` since its admission (the first report)."""
    if len(reports) < 2:
        return False
    newest = reports[-1].at
    began = _began(reports)
    if began is not None:
        return newest - reports[began].at >= observe_s
    return newest - reports[0].at >= IDLE_OBSERVE_SECONDS


def _began(reports: Sequence[Report]) -> int | None:
    """The index of the first report at :data:`STARTED_BYTES` or more: the job's work began."""
    return next((i for i, r in enumerate(reports) if r.measured >= STARTED_BYTES), None)


def growing(reports: Sequence[Report]) -> bool:
    """Whether the job grew more than :data:`GROWING_BYTES` over the last
    :data:`GROWING_WINDOW_SECONDS` (judged from its reports)."""
    slope = growth_slope(reports, GROWING_WINDOW_SECONDS)
    return slope * GROWING_WINDOW_SECONDS > GROWING_BYTES


def claim_bytes(policy: MemoryPolicy, estimate: int, reports: Sequence[Report]) -> int:
    """What a job not on trial claims against the jobs on trial: the whole rest of its
    estimate while it is still growing; once an observed pack job has settled, the last
    second's growth over the horizon (at most its reservation); else its reservation."""
    held = held_bytes(policy, estimate, reports)
    if growing(reports):
        return max(held, estimate - (reports[-1].measured if reports else 0))
    if policy is MemoryPolicy.STRICT or not observed(reports):
        return held
    return min(held, forecast_bytes(reports, window_s=GROWING_WINDOW_SECONDS))


def leaves_trial(used: int, claimed: int, line: int, estimate: int, measured: int) -> bool:
    """Whether a job on trial may leave it: the rest of its estimate fits under ``line``
    beside ``used`` and the claims of the jobs not on trial."""
    return used + claimed + max(0, estimate - measured) <= line

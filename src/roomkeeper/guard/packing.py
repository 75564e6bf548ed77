"""Memory policies, pure: what a young job reserves under ``strict`` and under ``pack``.

``strict`` reserves ``max(0, estimate - measured)`` until the warm-up window
ends.  ``pack`` reserves what a job's measured growth forecasts for the next
:data:`HORIZON_SECONDS`, never more than ``strict`` would::

    forecast = max(0, slope) x HORIZON_SECONDS + FLOOR_BYTES
    held     = min(forecast, max(0, estimate - measured))

``slope`` is the steeper of the growth over :data:`SLOPE_WINDOW_SECONDS` and
over :data:`RECENT_SECONDS`, so a job that has just begun to grow fast is not
judged by its idle start.  Until its growth has been seen (:func:`observed`)
a job holds what ``strict`` holds, so a burst of launches cannot each count
as a floor's worth.

*Trials*: a pack job that does not fit with its estimate may start on trial
when it fits as if it asked :data:`FLOOR_BYTES` and the room under the suspend
line holds what the jobs on trial, it among them, are expected to grow to
(:func:`trial_fits`: each to its own estimate or, where that is a guess, to
the typical peak of the work seen so far; at most :data:`MAX_TRIALS` at once).
It reserves nothing; the pressure monitor pauses it, while it grows, when
used memory plus the other jobs' claims (:func:`claim_bytes`) pass the
suspend line, and lets it go on :data:`TRIAL_RESUME_MARGIN` below.  It
leaves its trial once the rest of its estimate fits (:func:`leaves_trial`).

*Typical peak* (:func:`typical_peak`): the median of the peaks of the last
:data:`PEAKS_KEPT` pack jobs that ended on a guessed estimate (the default:
nothing known of them), once :data:`PEAKS_NEEDED` have; the default until
then.  Jobs of one batch are alike more often than not, so this corrects the
default's guess within a few lines; it only sizes trials, which are paused
first.  A job whose command shape has run before (:mod:`roomkeeper.jobs.sizes`,
in this batch or an earlier one) is expected to grow to its shape's typical
peak instead.  A job on a guessed estimate, once its growth has been seen, also
claims only its reservation (its forecast), not the rest of the guess.

What a forecast misses, the relief ladder answers: that is why ``pack`` is
only for work roomkeeper runs and can suspend, never for leases.  Nothing
here reads the kernel or holds state; :class:`roomkeeper.guard.admission.Guard`
keeps each young job's reports.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

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
MAX_TRIALS = 8  # jobs on trial at once at most, however much room: more only wait paused
PEAKS_KEPT = 8  # the newest guessed jobs' peaks whose median is the typical peak
PEAKS_NEEDED = 2  # peaks known before they say more than the default
GROWING_WINDOW_SECONDS = 1.0  # a job that grew more than GROWING_BYTES over this still grows
GROWING_BYTES = 32 * MIB
TRIAL_RESUME_MARGIN = 32 * MIB  # a paused trial goes on this far below the suspend line


_Prior = TypeVar("_Prior", int, None)


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


def growth_now(reports: Sequence[Report], window_s: float = SLOPE_WINDOW_SECONDS) -> float:
    """The steeper of the growth over ``window_s`` and over the last :data:`RECENT_SECONDS`:
    a job that has just begun to grow fast is not judged by its idle start."""
    return max(growth_slope(reports, window_s), growth_slope(reports, RECENT_SECONDS))


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
    return int(max(0.0, growth_now(reports, window_s)) * horizon_s) + floor


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


def typical_peak(peaks: Sequence[int], prior: _Prior) -> int | _Prior:
    """The (upper) median of ``peaks`` (the newest guessed jobs' peaks, or a command shape's
    last runs'); ``prior`` while fewer than :data:`PEAKS_NEEDED` are known."""
    if len(peaks) < PEAKS_NEEDED:
        return prior
    return sorted(peaks)[len(peaks) // 2]


def trial_fits(room: int, expected: int, rests: Sequence[int]) -> bool:
    """Whether one more job may start on trial: ``room`` (the suspend line less used memory)
    holds what each job on trial may still grow by (``rests``) and all that the new one is
    expected to (``expected``), and fewer than :data:`MAX_TRIALS` are on trial.  The jobs off
    trial are not counted here: what they claim is what pauses the trials."""
    if len(rests) >= MAX_TRIALS:
        return False
    return sum(rests) + expected <= room

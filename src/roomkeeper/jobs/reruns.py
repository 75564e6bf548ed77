"""The next run of restartable work stopped for memory pressure, pure: its estimate.

A job stopped while it still grew had reached only part of its size, so its
peak alone is no estimate: run again with it, the job is stopped again at
the same point.  The next run's estimate grows from what was seen::

    grown    = peak + min(rate x ran, peak)      (growing at ``rate`` when stopped)
    floor    = failed       when it was frozen when stopped and within it (peak <= failed)
             = 2 x failed   otherwise
    estimate = min(line, max(floor, grown, peak))

``failed`` is the estimate the stopped run was admitted with.  A run stopped
while it ran was stopped where its own growth took it, or outgrew its
estimate: the next one at least doubles it, or it would be stopped again at
the same point.  A tree frozen when stopped (by the unblock step, or at the
stop line while frozen with the rest) was stopped for the others' growth,
and within its estimate that says nothing about its own size: the next run
keeps it, or its growth's forecast if that is more (doubled, it would wait
for room it has not shown it needs, and once running be thought to have that
much left to grow).  A tree stopped on another node counts as not frozen.
``rate x ran`` is where the job would be had it kept growing as fast for as
long again; it is at most the peak once more, so one fast burst before the
stop does not ask for the whole container.  Nothing is
asked above ``line`` (the memory line at the job's admission): the job's
peak fit under it, and an estimate above it would fail the job as one that
can never fit.  The guard asks it at most at the room the job would have
with none of our jobs running, never below its peak
(:class:`roomkeeper.guard.admission.Rerun`).

The last allowed run (:func:`is_last_run`) is admitted with its whole
estimate reserved beside every other young job's whole rest, alone if need
be, and while it keeps to what it reserved the relief ladder stops it only
when no newer job is left to stop.  So restartable work that fits alone
finishes, unless it outgrows even its grown estimate, or memory that is not
our jobs' leaves it less room than its last peak.
"""

from __future__ import annotations


def stopped_for_others(*, frozen: bool, peak: int, failed: int) -> bool:
    """Whether a stopped run says nothing about its own size: it was frozen when stopped, and
    its peak stayed within the estimate it was admitted with (its estimate is kept)."""
    return frozen and peak <= failed


def rerun_estimate(
    *, failed: int, peak: int, rate: float, ran_s: float, line: int | None, frozen: bool = False
) -> int:
    """The estimate of the next run of a job stopped for memory pressure.

    Args:
        failed: the estimate the stopped run was admitted with.
        peak: the most its tree held in that run.
        rate: bytes per second it was growing by when stopped (0 or less: it was not).
        ran_s: seconds the stopped run lasted.
        line: the guard's memory line at its admission; None when unknown.
        frozen: it was suspended when stopped (stopped for the others' growth); unknown
            (a tree stopped on another node) counts as not.
    """
    peak, failed = max(0, peak), max(0, failed)
    grown = peak + min(max(0.0, rate) * max(0.0, ran_s), peak)
    floor = failed if stopped_for_others(frozen=frozen, peak=peak, failed=failed) else 2 * failed
    estimate = max(floor, int(grown), peak)
    if line is not None and line > 0:
        estimate = min(estimate, line)
    return estimate


def queued_again(*, restartable: bool, reruns: int, retries: int) -> bool:
    """Whether a stop for pressure queues the job again: restartable work with re-runs left
    (``reruns`` of ``retries`` used)."""
    return restartable and reruns < retries


def is_last_run(reruns: int, retries: int) -> bool:
    """Whether a job queued again ``reruns`` times, of ``retries`` allowed, runs for the last
    time: no stop for pressure would queue it again."""
    return reruns > 0 and reruns >= retries

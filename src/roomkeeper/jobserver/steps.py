"""Which build steps may run, pure: every step started can always be finished below the line.

A build's steps are anonymous until they grow: a token tells nothing of the
step that takes it.  A fixed count must allow for every step being the
largest at once; this rule lets more steps run and keeps instead the one
promise that matters: every step started can finish, one after another if
need be, without memory passing the line.  Each step is bounded by its job's
*largest* step (finished, or running now), and a step that finishes gives
back its footprint and all it grew by (the banker's algorithm, with memory
as its one resource).  A step still growing may be the one that passes the
largest so far, so it needs at least what it grows by in :data:`GROWING_S`;
and one already past every step its job finished, while it grows, has no
bound learned at all: it is taken to be able to grow as much again as it
holds (where it grows slowly, as on a busy or emulated machine, a second of
its growth says too little)::

    need(step)  = max(its job's largest step - its footprint, its rate x GROWING_S,
                      its footprint, if it grows past every finished step)
    room        = line - used - what the running steps grow by before the next look
    safe        = in order of need, smallest first: need <= room, then room += footprint

While it is safe, every step runs.  When the running steps' growth would
make it unsafe, running steps are paused (SIGSTOP), the furthest from its
end first, until it is safe again; the one nearest its end always goes on,
finishes soonest and gives back the most.  A paused step holds its footprint
and loses nothing.  A paused step goes on, the nearest its end first, once
it is safe with it running; one always goes on when nothing runs.  A new step
(a token) is let in only while it is safe with one more step of the job's
largest size.

Tokens cannot be taken back from a build tool that holds them (make and
ninja read a returned token again at once), so pausing is how the running
steps are kept in check.  What a step is *expected* to grow by still
(:func:`expected_growth`, from the sizes its job's finished steps reached) is
what the guard holds for the job, beside every other job's admission.

Nothing here reads the kernel, a clock or a process; the jobserver's meter
(:mod:`roomkeeper.jobserver.meter`) takes the census and sends the signals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

StepKey = tuple[str, int]
"""Which step: its job's id and its pid."""

LOOK_AHEAD_S = 0.15  # growth allowed for before the next look, at least (rounds: every 0.1 s)
LEARNED_AFTER = 4  # finished steps before their sizes say what a step is expected to grow by
GROWING_S = 1.0  # a step growing is taken to go on growing this long, past the largest if need be
NEED_GRAIN = 1 << 20  # needs this close are equal when choosing a step (pages come and go)


@dataclass(frozen=True, slots=True)
class Step:
    """One step as the rule sees it.

    Attributes:
        key: which step: its job's id and its pid.
        began: when it was first seen (any clock, the same for every step); newest is last.
        footprint: what it holds now.
        need: the most it may still grow by (its job's largest step less its footprint).
        rate: bytes per second it grows by while it runs (for a paused step, what it grew
            by before it was paused: what it will grow by once it goes on).
        paused: it is stopped with SIGSTOP.
    """

    key: StepKey
    began: float
    footprint: int
    need: int
    rate: float
    paused: bool = False


def step_need(largest: int, footprint: int, rate: float, finished_largest: int) -> int:
    """The most a step may still grow by: to its job's ``largest`` step (finished, or running
    now), at least what it grows by in :data:`GROWING_S` at ``rate`` (bytes per second), and,
    while it grows past ``finished_largest`` (the largest finished step, or the default
    before one finished), as much again as it holds."""
    unbounded = rate > 0 and footprint > finished_largest
    return max(largest - footprint, int(max(0.0, rate) * GROWING_S), footprint * unbounded, 0)


def expected_growth(footprint: int, finished: Sequence[int], largest: int, rate: float) -> int:
    """What a step at ``footprint`` is expected to grow by still: the mean of the finished
    steps' peaks above it, less its footprint; with none above it, what it grows by before
    the next look.  Until :data:`LEARNED_AFTER` steps finished, the rest of ``largest``."""
    if len(finished) < LEARNED_AFTER:
        return max(0, largest - footprint)
    above = [peak for peak in finished if peak > footprint]
    if not above:
        return int(max(0.0, rate) * LOOK_AHEAD_S)
    return sum(above) // len(above) - footprint


def growth_ahead(steps: Iterable[Step], look_ahead_s: float = LOOK_AHEAD_S) -> int:
    """What the running steps may add before the next look."""
    return int(sum(max(0.0, s.rate) for s in steps if not s.paused) * look_ahead_s)


def finishable(steps: Sequence[Step], room: int) -> bool:
    """Whether every step can finish, one after another, within ``room`` (smallest need first:
    each one finished gives back its footprint, so any order that works, this one finds)."""
    free = room
    for step in sorted(steps, key=lambda s: s.need):
        if step.need > free:
            return False
        free += step.footprint
    return True


def safe(steps: Sequence[Step], room: int, look_ahead_s: float = LOOK_AHEAD_S) -> bool:
    """Finishable even after the running steps' growth until the next look."""
    return finishable(steps, room - growth_ahead(steps, look_ahead_s))


def to_pause(steps: Sequence[Step], room: int, look_ahead_s: float = LOOK_AHEAD_S) -> list[StepKey]:
    """The running steps to pause, the furthest from its end first (of two as far, the newer),
    until every step is safe; the one nearest its end is never paused."""
    current = list(steps)
    paused: list[StepKey] = []
    running = [s for s in current if not s.paused]
    for furthest in sorted(running, key=lambda s: (-(s.need // NEED_GRAIN), -s.began))[:-1]:
        if safe(current, room, look_ahead_s):
            break
        current = [replace(s, paused=True) if s is furthest else s for s in current]
        paused.append(furthest.key)
    return paused


def to_resume(
    steps: Sequence[Step], room: int, look_ahead_s: float = LOOK_AHEAD_S
) -> StepKey | None:
    """The paused step that may go on now: the one nearest its end (the smallest need; of two
    as near, the older) that keeps every step safe; when nothing runs, the one nearest its
    end whatever the room."""
    paused = sorted((s for s in steps if s.paused), key=lambda s: (s.need // NEED_GRAIN, s.began))
    if not paused:
        return None
    if not any(not s.paused for s in steps):
        return paused[0].key  # nothing runs: one step always goes on
    for candidate in paused:
        resumed = [replace(s, paused=False) if s is candidate else s for s in steps]
        if safe(resumed, room, look_ahead_s):
            return candidate.key
    return None


def admits(steps: Sequence[Step], room: int, new: Step, look_ahead_s: float = LOOK_AHEAD_S) -> bool:
    """Whether a new step (a token) keeps every step safe."""
    return safe([*steps, new], room, look_ahead_s)

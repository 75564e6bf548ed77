"""Whether our running jobs keep every core busy, so that one more would only share them.

A job started while the cores are full of our own CPU-bound jobs finishes no
work sooner: the same cores are shared one more way.  It only holds memory the
while, and under memory pressure it is the likeliest to be paused or stopped,
throwing its work away.  A batch given no count of its own holds its next line
while this says the cores are full; a job whose processes mostly wait (on
memory, disk or the network) leaves them free, and more start.

Each job's rate is its tree's CPU seconds over at least :data:`WINDOW_S`, its
first window too (a shorter one for a start that waits, once tried, started
lines of slow-growing work closer together, and more of them were stopped).
Until its first window has passed the job counts as the busiest window measured
lately past a job's start, a whole core before any, as if CPU bound.  A reading
older than :data:`STALE_S` (launches were held meanwhile, or the job was
suspended) starts a new window at the rate measured before it: a rate averaged
over a pause says nothing of now.  A counter that steps down (a member reaped outside the tree
takes its seconds along) keeps the job's last rate and starts a new window.
A job's counter is read only once its window may have closed, and
:meth:`CoreUse.next_window_in` says when the next one closes, so that a held
line is judged again then.

What is counted is the CPU our jobs got, not what they would take: beside
other CPU-bound work on the machine they get less, and more of them start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from roomkeeper.jobs.handle import Handle

__all__ = [
    "IDLE_SLACK",
    "READ_EVERY_S",
    "SETTLED_S",
    "STALE_S",
    "WINDOW_S",
    "CoreUse",
]

WINDOW_S = 0.5  # a job's CPU rate is measured over at least this long
# The cores are full while less than half a core is left idle by our jobs: a CPU-bound job
# gets a little less than a whole core beside the machine's other work, and two of them on
# two cores must still count as full.
IDLE_SLACK = 0.5
READ_EVERY_S = 0.1  # a job whose CPU could not be read is read again after this long
SETTLED_S = 2.0  # a job's windows from this long after it was first read count for others
RATES_KEPT = 8  # the newest windows' rates, whose busiest an unmeasured job counts as
STALE_S = 2.0  # a reading older than this starts a new window, at the rate measured before it
_PAST_THE_END_S = 0.005  # a held round is tried again this long after a window closes


@dataclass(slots=True)
class _Mark:
    handle: Handle  # the run read (a re-run of the same job is another)
    at: float  # when the job's CPU seconds were read
    cpu: float | None  # what they were then (None: not readable yet)
    rate: float  # cores it kept busy over its last window (as unmeasured until one has passed)
    seen: float  # when this run was first read: its windows count for others after SETTLED_S


class CoreUse:
    """Our running jobs' use of the cores, read from their trees.

    Args:
        clock: monotonic seconds.
        cores: the cores this machine lets us use.
    """

    def __init__(self, clock: Callable[[], float], cores: Callable[[], int]) -> None:
        self._clock = clock
        self._cores = cores
        self._marks: dict[str, _Mark] = {}
        self._rates: deque[float] = deque(maxlen=RATES_KEPT)  # the newest windows' rates

    def busy(self) -> float:
        """Cores our jobs kept busy at the last reading (each job's latest rate)."""
        return sum(mark.rate for mark in self._marks.values())

    def full(self, handles: Mapping[str, Handle]) -> bool:
        """Whether the jobs of ``handles`` (by job id, all on this machine) leave less than
        :data:`IDLE_SLACK` of a core idle.  A job's counter is read only once its window
        has closed (one not readable: every :data:`READ_EVERY_S`), so asking for each line
        of a fast batch reads little."""
        now = self._clock()
        self._marks = {job_id: self._mark(job_id, h, now) for job_id, h in handles.items()}
        return bool(handles) and self.busy() > max(1, self._cores()) - IDLE_SLACK

    def _mark(self, job_id: str, handle: Handle, now: float) -> _Mark:
        mark = self._marks.get(job_id)
        if mark is not None and mark.handle is not handle:
            mark = None  # another run of the job: nothing known of it yet
        if mark is not None and now < _next_read(mark):
            return mark  # its window is open: its counter says nothing new yet
        if mark is not None and now - mark.at > STALE_S:
            # A reading from before a pause (launches held, or the job suspended): the
            # average over it says nothing of now, but the rate before it is the best guess.
            mark = _Mark(handle, now, None, mark.rate, mark.seen)
        try:
            cpu = handle.cpu_seconds()
        except Exception:  # one unreadable tree must not stop every round: as not readable
            cpu = None
        if cpu is None:  # not readable now (being stopped, or sampled): what was last known
            return mark if mark is not None else _Mark(handle, now, None, self._unmeasured(), now)
        if mark is None:
            return _Mark(handle, now, cpu, self._unmeasured(), now)
        if mark.cpu is None or cpu < mark.cpu:
            # A new window: nothing read before it, or seconds left with a member reaped
            # elsewhere.  The rate last known stands meanwhile.
            return _Mark(handle, now, cpu, mark.rate, mark.seen)
        rate = (cpu - mark.cpu) / (now - mark.at)
        if mark.at - mark.seen >= SETTLED_S:  # a start (a shell, an exec, files read) is no guide
            self._rates.append(rate)
        return _Mark(handle, now, cpu, rate, mark.seen)

    def next_window_in(self) -> float:
        """Seconds until the first open window of the jobs last read has closed (when their
        reading may change :meth:`full`'s answer): a few milliseconds past its end, since a
        wait that ends a millisecond early finds it open and waits once more.  A job whose
        window closed but whose counter could not be read (another thread holds its tree,
        a stop for seconds) is tried again after :data:`READ_EVERY_S`, not at once."""
        now = self._clock()
        ends = [_next_read(m) - now for m in self._marks.values()]
        waits = [end if end > 0 else READ_EVERY_S for end in ends]
        return min(waits, default=READ_EVERY_S) + _PAST_THE_END_S

    def _unmeasured(self) -> float:
        """What a job not measured yet counts as: the busiest of the newest windows measured
        past their jobs' start (jobs of one batch are alike more often than not), a whole
        core before any."""
        return min(1.0, max(self._rates)) if self._rates else 1.0


def _next_read(mark: _Mark) -> float:
    """When ``mark``'s job is read next: once its window has closed, or, while its counter
    could not be read, after :data:`READ_EVERY_S`."""
    return mark.at + (READ_EVERY_S if mark.cpu is None else WINDOW_S)

"""Whether our running jobs keep every core busy: each job's rate from its tree's CPU seconds."""

from __future__ import annotations

from roomkeeper.jobs.cores import (
    READ_EVERY_S,
    SETTLED_S,
    STALE_S,
    WINDOW_S,
    CoreUse,
)
from roomkeeper.testing import FakeClock
from tests.fakes import FakeHandle


class _Tree(FakeHandle):
    """A tree whose CPU seconds the test sets (None: unreadable; an exception: broken)."""

    def __init__(self, job_id: str, cpu: float | None = 0.0) -> None:
        super().__init__(job_id)
        self.cpu: float | Exception | None = cpu
        self.reads = 0

    def cpu_seconds(self) -> float | None:
        self.reads += 1
        if isinstance(self.cpu, Exception):
            raise self.cpu
        return self.cpu


def _use(cores: int = 2) -> tuple[CoreUse, FakeClock]:
    clock = FakeClock()
    return CoreUse(clock, lambda: cores), clock


def test_a_job_not_yet_measured_counts_as_a_core_and_then_as_its_rate() -> None:
    use, clock = _use()
    a, b = _Tree("a"), _Tree("b")
    assert use.full({"a": a, "b": b})  # two unmeasured jobs: two cores
    clock.advance(WINDOW_S)
    a.cpu, b.cpu = WINDOW_S, WINDOW_S * 0.2
    assert not use.full({"a": a, "b": b})  # 1.2 cores: more than half a core idle
    assert abs(use.busy() - 1.2) < 1e-9


def test_a_fresh_job_counts_as_a_core_until_its_whole_first_window_has_passed() -> None:
    """A start that waits is not taken at its word early: a fifth of a second idle still
    counts as a whole core (its counter is not even read), and its rate is known once the
    window of every other reading has passed."""
    use, clock = _use(cores=1)
    a = _Tree("a")
    assert use.full({"a": a})  # not measured: a whole core
    assert WINDOW_S < use.next_window_in() < WINDOW_S + 0.01
    clock.advance(0.2)
    a.cpu = 0.2 * 0.05  # it waits, so far
    assert use.full({"a": a})
    assert a.reads == 1
    clock.advance(WINDOW_S - 0.2)
    a.cpu = WINDOW_S * 0.05
    assert not use.full({"a": a})
    assert abs(use.busy() - 0.05) < 1e-9


def test_a_measured_job_starts_a_new_window_after_a_pause_or_a_counter_step_down() -> None:
    """A stale reading or a counter that steps down starts a new window, the rate known
    before it standing meanwhile.  :meth:`CoreUse.next_window_in` says when the first open
    window closes."""
    use, clock = _use(cores=1)
    a = _Tree("a")
    use.full({"a": a})
    clock.advance(WINDOW_S)
    a.cpu = WINDOW_S * 0.05
    use.full({"a": a})
    assert abs(use.busy() - 0.05) < 1e-9
    assert WINDOW_S < use.next_window_in() < WINDOW_S + 0.01
    clock.advance(STALE_S + 1.0)  # launches held meanwhile: a new window from here
    a.cpu = 5.0
    use.full({"a": a})
    clock.advance(0.2)
    a.cpu += 0.2  # CPU bound from now on
    use.full({"a": a})
    assert abs(use.busy() - 0.05) < 1e-9  # its window is still open
    assert a.reads == 3  # and its counter is not read while it is
    clock.advance(WINDOW_S - 0.2)
    a.cpu += WINDOW_S - 0.2
    use.full({"a": a})
    assert abs(use.busy() - 1.0) < 1e-9
    clock.advance(WINDOW_S)
    a.cpu = 0.1  # a member reaped elsewhere took its seconds along: a new window
    use.full({"a": a})
    clock.advance(0.2)
    use.full({"a": a})  # idle since, but the window is still open
    assert abs(use.busy() - 1.0) < 1e-9


def test_a_job_whose_counter_cannot_be_read_is_tried_again_a_moment_later() -> None:
    """While another thread holds a tree (a stop may take seconds), its counter reads as
    None: the held line waits READ_EVERY_S for it, never spins."""
    use, clock = _use(cores=1)
    a = _Tree("a")
    use.full({"a": a})
    clock.advance(WINDOW_S)
    a.cpu = None  # its tree is held elsewhere
    assert use.full({"a": a})  # as last known: a core
    assert READ_EVERY_S <= use.next_window_in() < READ_EVERY_S + 0.01


def test_a_rerun_of_the_same_job_and_a_stale_reading_start_a_new_window() -> None:
    """A job's new run (another handle) never yields a rate from its old run's counter: it
    counts as a job not yet measured.  A reading from before a pause (launches held, or the
    job suspended) starts a new window that keeps the rate measured before it, not one averaged
    over what the job did not do meanwhile."""
    use, clock = _use()
    first = _Tree("a", cpu=0.2)
    use.full({"a": first})
    clock.advance(1.0)
    rerun = _Tree("a", cpu=0.5)  # the same job id, run again after a stop
    use.full({"a": rerun})
    assert use.busy() == 1.0  # unmeasured, nothing measured before: a core
    clock.advance(1.0)
    rerun.cpu = 0.8
    use.full({"a": rerun})
    assert abs(use.busy() - 0.3) < 1e-9  # measured: 0.3 of a core
    busy = _Tree("b", cpu=0.0)  # a CPU-bound job beside it, measured, then gone
    use.full({"a": rerun, "b": busy})
    clock.advance(WINDOW_S)
    rerun.cpu, busy.cpu = 0.8 + 0.3 * WINDOW_S, WINDOW_S
    use.full({"a": rerun, "b": busy})
    assert abs(use.busy() - 1.3) < 1e-9
    clock.advance(STALE_S + 1.0)
    rerun.cpu += 0.1  # it was paused: 0.1 s in three
    use.full({"a": rerun})
    # Stale: a new window, at its own rate before the pause (not a job unmeasured, which
    # would count as the busiest recent window, b's whole core).
    assert abs(use.busy() - 0.3) < 1e-9
    clock.advance(WINDOW_S)
    rerun.cpu += WINDOW_S  # going on, CPU bound
    use.full({"a": rerun})
    assert abs(use.busy() - 1.0) < 1e-9  # measured again in the new window


def test_a_job_not_yet_measured_counts_as_the_busiest_recent_window_past_a_start() -> None:
    """Lines of one batch are alike more often than not: once windows were measured past their
    jobs' first SETTLED_S, a new job counts as the busiest of them, so jobs that mostly wait
    start several at a time, and a CPU-bound kind still counts as a core.  A start (a shell,
    an exec, files read) is no guide: until then a new job counts as a core."""
    use, clock = _use()
    a, b = _Tree("a"), _Tree("b")
    use.full({"a": a, "b": b})
    clock.advance(WINDOW_S)
    a.cpu, b.cpu = WINDOW_S * 0.1, WINDOW_S * 0.2  # starting: they read files
    assert use.full({"a": a, "b": b, "c": _Tree("c"), "d": _Tree("d")})  # 0.3 + 2 cores
    jobs = {"a": a, "b": b}
    clock.advance(SETTLED_S)
    use.full(jobs)
    clock.advance(WINDOW_S)
    a.cpu, b.cpu = a.cpu + WINDOW_S * 0.1, b.cpu + WINDOW_S * 0.2  # settled: they wait on memory
    use.full(jobs)
    jobs |= {"c": _Tree("c"), "d": _Tree("d"), "e": _Tree("e")}
    assert not use.full(jobs)  # 0.1 + 0.2 + 3 x 0.2: not a core and a half
    assert abs(use.busy() - 0.9) < 1e-9
    clock.advance(WINDOW_S)
    a.cpu += WINDOW_S  # a became CPU bound: a new job now counts as a core
    use.full(jobs)
    assert use.full({**jobs, "f": _Tree("f")})
    assert abs(use.busy() - 2.0) < 1e-9  # a's core and f's, counted as a's


def test_a_counter_stepping_down_or_unreadable_keeps_the_last_rate() -> None:
    use, clock = _use()
    a = _Tree("a", cpu=0.0)
    use.full({"a": a})
    clock.advance(1.0)
    a.cpu = 0.3
    use.full({"a": a})
    assert abs(use.busy() - 0.3) < 1e-9
    clock.advance(1.0)
    a.cpu = 0.1  # a member reaped outside the tree took its seconds along
    use.full({"a": a})
    assert abs(use.busy() - 0.3) < 1e-9
    clock.advance(1.0)
    a.cpu = None  # being stopped
    use.full({"a": a})
    assert abs(use.busy() - 0.3) < 1e-9
    clock.advance(1.0)
    a.cpu = OSError("gone")  # a broken tree: as unreadable, never an error out of a round
    use.full({"a": a})
    assert abs(use.busy() - 0.3) < 1e-9


def test_a_counter_is_read_only_once_its_window_has_closed() -> None:
    use, clock = _use(cores=1)
    a, b = _Tree("a"), _Tree("b")
    assert use.full({"a": a, "b": b})
    clock.advance(WINDOW_S)
    a.cpu = WINDOW_S  # a keeps the core busy; b waits on something
    assert use.full({"a": a, "b": b})
    reads = a.reads + b.reads
    clock.advance(0.01)
    b.cpu = 1.0  # not read: its window is open
    assert use.full({"a": a, "b": b})
    assert not use.full({"b": b})  # a went: b, idle when last read, leaves the core free
    clock.advance(READ_EVERY_S)
    assert not use.full({"b": b})
    assert a.reads + b.reads == reads
    clock.advance(WINDOW_S)
    assert use.full({"b": b})  # its window over: b was busy

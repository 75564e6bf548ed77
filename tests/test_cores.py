"""Whether our running jobs keep every core busy: each job's rate from its tree's CPU seconds."""

from __future__ import annotations

from roomkeeper.jobs.cores import STALE_S, WINDOW_S, CoreUse
from roomkeeper.testing import FakeClock
from tests.fakes import FakeHandle


class _Tree(FakeHandle):
    """A tree whose CPU seconds the test sets (None: unreadable; an exception: broken)."""

    def __init__(self, job_id: str, cpu: float | None = 0.0) -> None:
        super().__init__(job_id)
        self.cpu: float | Exception | None = cpu

    def cpu_seconds(self) -> float | None:
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


def test_a_rerun_of_the_same_job_and_a_stale_reading_start_a_new_window() -> None:
    """A job's new run (another handle) or a reading from before a pause never yields a rate
    averaged over what it did not do now: it counts as a core until measured again."""
    use, clock = _use()
    first = _Tree("a", cpu=0.2)
    use.full({"a": first})
    clock.advance(1.0)
    rerun = _Tree("a", cpu=0.5)  # the same job id, run again after a stop
    use.full({"a": rerun})
    assert use.busy() == 1.0  # not (0.5 - 0.2) / 1 s of the first run's counter
    clock.advance(1.0)
    rerun.cpu = 1.5
    use.full({"a": rerun})
    assert abs(use.busy() - 1.0) < 1e-9  # measured: a core
    clock.advance(STALE_S + 1.0)
    rerun.cpu = 1.6  # it was paused: 0.1 s in three
    use.full({"a": rerun})
    assert use.busy() == 1.0  # stale: a new window, counted as a core


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


def test_readings_are_kept_a_moment_unless_a_job_came_or_went() -> None:
    use, clock = _use(cores=1)
    a, b = _Tree("a"), _Tree("b")
    assert use.full({"a": a})
    clock.advance(WINDOW_S)
    a.cpu = 0.0  # it waits on something: no CPU
    assert not use.full({"a": a})
    clock.advance(0.01)
    assert use.full({"a": a, "b": b})  # b came: read at once, and b is unmeasured

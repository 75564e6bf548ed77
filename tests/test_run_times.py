"""How long a job's current run has run and has been suspended, from its history."""

from __future__ import annotations

from roomkeeper.jobs.book import run_times
from roomkeeper.jobs.spec import JobState

RUNNING, SUSPENDED, WAITING = JobState.RUNNING, JobState.SUSPENDED, JobState.WAITING


def history(*moves: tuple[JobState, float]) -> list[tuple[JobState, float]]:
    return list(moves)


def test_a_job_never_started_has_run_nothing() -> None:
    assert run_times(history((WAITING, 0.0)), now=50.0) == (0.0, 0.0)


def test_suspensions_are_left_out_of_the_time_run() -> None:
    """Ran 10 s, frozen 5 s, ran 7 s, frozen since 22 s: at 30 s, 17 s run, 8 s suspended."""
    moves = history(
        (WAITING, 0.0), (RUNNING, 0.0), (SUSPENDED, 10.0), (RUNNING, 15.0), (SUSPENDED, 22.0)
    )
    assert run_times(moves, now=30.0) == (17.0, 8.0)
    assert run_times(moves[:4], now=30.0) == (25.0, 0.0)  # running again: nothing suspended


def test_a_rerun_counts_from_its_own_start() -> None:
    """A run stopped and queued again threw its time away: the re-run starts at nothing."""
    moves = history(
        (WAITING, 0.0),
        (RUNNING, 1.0),
        (SUSPENDED, 40.0),
        (WAITING, 90.0),  # stopped for pressure and queued again
        (RUNNING, 100.0),
        (SUSPENDED, 104.0),
    )
    assert run_times(moves, now=110.0) == (4.0, 6.0)

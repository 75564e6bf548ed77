"""The scheduler's job book: how many finished jobs it keeps, and which it forgets."""

from __future__ import annotations

import threading

from roomkeeper.jobs.book import KEEP_FINISHED, JobBook, JobRecord
from roomkeeper.jobs.spec import Estimate, EstimateSource, JobSpec, JobState


def _book() -> JobBook:
    """A book whose lock is held throughout, as the scheduler holds it around these calls."""
    lock = threading.RLock()
    lock.acquire()
    return JobBook(lock, wall=lambda: 0.0, on_change=None, clock=lambda: 0.0)


def _added(book: JobBook, job_id: str) -> JobRecord:
    job = JobRecord(
        job_id,
        JobSpec(argv=["true"]),
        f"/logs/{job_id}.log",
        0.0,
        None,
        Estimate(0, EstimateSource.DEFAULT),
    )
    book.add(job)
    book.record(job, JobState.WAITING, None)
    return job


def test_finished_jobs_are_kept_up_to_the_bound_however_many_wait() -> None:
    """A queue of thousands waiting does not push out the finished jobs a person may still
    ask about: the bound counts finished jobs alone, and the first to end go first."""
    book = _book()
    waiting = [_added(book, f"w{n}") for n in range(2 * KEEP_FINISHED)]
    finished = [_added(book, f"f{n}") for n in range(KEEP_FINISHED + 5)]
    for job in finished:
        book.finish(job, JobState.EXITED, None)
    assert book.prune()
    assert all(job.id in book for job in waiting)
    assert [job.id in book for job in finished] == [False] * 5 + [True] * KEEP_FINISHED
    assert not book.prune()  # at the bound: nothing more to forget


def test_a_job_that_runs_again_is_not_counted_as_finished() -> None:
    """A finished job moved back to waiting (a re-run) is never forgotten by the bound."""
    book = _book()
    again = _added(book, "again")
    book.finish(again, JobState.STOPPED, None)
    book.record(again, JobState.WAITING, None)
    for n in range(KEEP_FINISHED + 1):
        book.finish(_added(book, f"f{n}"), JobState.EXITED, None)
    assert book.prune()
    assert "again" in book and "f0" not in book and "f1" in book
    assert book.forget("f1") and not book.forget("again")

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
    ask about: the bound counts finished jobs alone, and those that ended first go first,
    whenever they were submitted."""
    book = _book()
    waiting = [_added(book, f"w{n}") for n in range(2 * KEEP_FINISHED)]
    finished = [_added(book, f"f{n}") for n in range(KEEP_FINISHED + 5)]
    for job in reversed(finished):  # the last submitted ends first
        book.finish(job, JobState.EXITED, None)
    assert book.prune()
    assert all(job.id in book for job in waiting)
    assert [job.id in book for job in finished] == [True] * KEEP_FINISHED + [False] * 5
    assert not book.prune()  # at the bound: nothing more to forget


def test_the_bound_never_forgets_a_job_that_left_its_final_state() -> None:
    """Should a job ever leave a final state, it leaves the finished ones too: the bound
    forgets finished jobs only, and forgetting one by hand is refused for a live job."""
    book = _book()
    back = _added(book, "back")
    book.record(back, JobState.EXITED, None)
    book.record(back, JobState.WAITING, None)
    for n in range(KEEP_FINISHED + 1):
        book.finish(_added(book, f"f{n}"), JobState.EXITED, None)
    assert book.prune()
    assert "back" in book and "f0" not in book and "f1" in book
    assert book.forget("f1") and not book.forget("back")

"""A slow disk holds no lock the pressure monitor needs: saves and log fsyncs wait outside them.

Saves are slowest exactly when memory is short, which is when the monitor
must read and act on time.  The gateway here is wired in this process and
never served; its scheduler is driven by the test, its jobs are real trees.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from roomkeeper.gateway.service import Gateway
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from tests.gateways import in_process_gateway

MB = 10**6
SLOW_S = 6.0  # how long the slowed save or fsync takes
ON_TIME_S = 2.0  # what the monitor and the relief bookkeeping keep to meanwhile (busy machine)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway wired in this process over a real journal, never served."""
    (tmp_path / "ws").mkdir()
    with in_process_gateway(
        tmp_path,
        ROOMKEEPER_WORKSPACE=str(tmp_path / "ws"),
        ROOMKEEPER_JOB_DISK_MB="0",
        ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
    ) as built:
        yield built


def _until(predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s"
        time.sleep(0.005)


def _ticking(gateway: Gateway, done: Callable[[], bool]) -> threading.Thread:
    """The scheduler's rounds on a thread of their own, until ``done``."""

    def rounds() -> None:
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            gateway.scheduler.tick()
            time.sleep(0.01)

    thread = threading.Thread(target=rounds, daemon=True)
    thread.start()
    return thread


def test_a_slow_commit_of_a_launch_marker_never_keeps_the_monitor_from_reading(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's commit of a pending marker slowed to 6 s: the pressure monitor's
    readings keep their interval meanwhile, and the job starts once it is saved."""
    journal = gateway.journal
    record_launch = journal.record_launch
    saved: list[float] = []
    marker_saved = threading.Event()

    def slow_record_launch(view: JobView) -> concurrent.futures.Future[None]:
        journal.submit(lambda conn: time.sleep(SLOW_S))  # the marker's group commits after it
        saved.append(time.monotonic())
        write = record_launch(view)
        write.add_done_callback(lambda _: (saved.append(time.monotonic()), marker_saved.set()))
        return write

    monkeypatch.setattr(journal, "record_launch", slow_record_launch)
    monitor = gateway.scheduler.monitor
    monitor.start()
    try:
        job = gateway.scheduler.submit(JobSpec(argv=["sleep", "60"], memory_bytes=10 * MB))
        readings: list[tuple[float, int]] = []
        ticking = _ticking(gateway, lambda: gateway.scheduler.get(job.id).pid is not None)
        while not marker_saved.is_set():
            readings.append((time.monotonic(), monitor.statistics().readings))
            time.sleep(0.005)
        ticking.join(30)
    finally:
        monitor.close()
    assert gateway.scheduler.get(job.id).state is JobState.RUNNING
    began, ended = saved
    counted = [
        at
        for (_, before), (at, count) in itertools.pairwise(readings)
        if count != before and began < at < ended
    ]  # when each reading was seen, within 5 ms
    moments = [began, *counted, ended]
    longest = max(later - earlier for earlier, later in itertools.pairwise(moments))
    assert longest < ON_TIME_S, f"no reading for {longest:.2f} s while the marker was saved"


def test_a_slow_fsync_of_an_ended_jobs_log_never_holds_up_suspend_and_resume(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While an ended job's log is fsynced slowly (6 s), another job is suspended and resumed
    with its state recorded at once; the ended job's outcome is saved only after its log."""
    syncing = threading.Event()
    fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            syncing.set()
            time.sleep(SLOW_S)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    scheduler = gateway.scheduler
    long = scheduler.submit(JobSpec(argv=["sleep", "60"], memory_bytes=10 * MB))
    short = scheduler.submit(JobSpec(argv=["true"], owner="b", memory_bytes=10 * MB))
    scheduler.tick()
    assert scheduler.get(long.id).state is JobState.RUNNING
    ticking = _ticking(gateway, lambda: scheduler.get(short.id).state.final)
    assert syncing.wait(20), "the short job's log was never synced"
    # Logs before the index: its outcome is not saved while its log is being synced.
    assert _saved_state(gateway, short.id) != "exited"
    began = time.monotonic()
    assert scheduler.relief.suspend_for_pressure(long.id)
    suspended_in = time.monotonic() - began
    assert scheduler.get(long.id).state is JobState.SUSPENDED
    began = time.monotonic()
    assert scheduler.relief.resume_after_pressure(long.id)
    resumed_in = time.monotonic() - began
    assert scheduler.get(long.id).state is JobState.RUNNING
    ticking.join(30)
    assert suspended_in < ON_TIME_S, f"suspending took {suspended_in:.2f} s"
    assert resumed_in < ON_TIME_S, f"resuming took {resumed_in:.2f} s"
    _until(lambda: _saved_state(gateway, short.id) == "exited", "the saved outcome")


def _saved_state(gateway: Gateway, job_id: str) -> str | None:
    try:
        row = gateway.journal.job(job_id)
    except sqlite3.Error:
        return None
    return None if row is None else row.state

"""A slow disk holds no lock the pressure monitor needs: saves wait outside them.

Saves are slowest exactly when memory is short, which is when the monitor
must read and act on time.  The gateway here is wired in this process and
never served; its scheduler is driven by the test, its jobs are real trees.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from roomkeeper.gateway.service import Gateway
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.journal.database import Journal

MB = 10**6
SLOW_S = 2.0  # how long the slowed save or fsync takes
ON_TIME_S = 0.5  # what the monitor and the relief bookkeeping must keep to meanwhile


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway wired in this process over a real journal, never served."""
    (tmp_path / "ws").mkdir()
    env = {
        "ROOMKEEPER_HOME": str(tmp_path / "home"),
        "ROOMKEEPER_WORKSPACE": str(tmp_path / "ws"),
        "ROOMKEEPER_JOB_DISK_MB": "0",
        "ROOMKEEPER_DISK_HEADROOM_PERCENT": "0",
        "ROOMKEEPER_CPU_PRESSURE_PERCENT": "100",
    }
    journal = Journal(tmp_path / "home" / "journal.db")
    built = Gateway(home=tmp_path / "home", env=env, token="t" * 32, journal=journal)
    try:
        yield built
    finally:
        built.scheduler.close(grace=0)
        for write in built.durable_jobs.pending_writes():
            write.result(timeout=30)
        built.hooks.close()
        journal.close()


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
    """The journal's commit of a pending marker slowed to 2 s: the pressure monitor's
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

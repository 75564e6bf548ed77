"""Re-runs of restartable work stopped for memory pressure: the grown estimate, the last run."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomkeeper.guard.admission import Rerun
from roomkeeper.guard.packing import FLOOR_BYTES, IDLE_OBSERVE_SECONDS, MemoryPolicy
from roomkeeper.jobs.reruns import is_last_run, rerun_estimate
from tests.fakes import fixture_guard

MB = 10**6
GB = 10**9


def test_a_job_stopped_while_growing_asks_for_more_than_its_peak() -> None:
    """Stopped at 400 MB, growing 100 MB/s after 3 s: its peak plus the growth it would have
    had over as long again; at least twice the 100 MB that failed."""
    grown = rerun_estimate(failed=100 * MB, peak=400 * MB, rate=100 * MB, ran_s=3.0, line=None)
    assert grown == 700 * MB
    burst = rerun_estimate(failed=100 * MB, peak=400 * MB, rate=10 * GB, ran_s=3.0, line=None)
    assert burst == 800 * MB  # one fast burst asks for its peak once more, not the container


def test_a_tree_frozen_when_stopped_within_its_estimate_keeps_it() -> None:
    """Frozen when stopped, within what it was admitted with, it was stopped for the others'
    growth: it keeps the estimate, or its peak and growth if more.  Frozen past it, or
    stopped while it ran, it asks for at least twice it."""

    def again(peak: int, rate: float = 0.0, *, frozen: bool = True) -> int:
        return rerun_estimate(
            failed=300 * MB, peak=peak, rate=rate, ran_s=9.0, line=None, frozen=frozen
        )

    assert again(250 * MB) == 300 * MB
    assert again(250 * MB, rate=10 * MB) == 340 * MB  # 250 + 10 x 9: its forecast is more
    assert again(350 * MB) == 600 * MB  # it outgrew the estimate it was frozen with
    assert again(250 * MB, frozen=False) == 600 * MB


def test_a_job_that_was_not_growing_still_doubles_what_failed() -> None:
    """Stopped while it ran, it keeps at least twice the estimate it was stopped with."""
    assert (
        rerun_estimate(failed=300 * MB, peak=250 * MB, rate=0.0, ran_s=9.0, line=None) == 600 * MB
    )
    assert (
        rerun_estimate(failed=300 * MB, peak=900 * MB, rate=-5.0, ran_s=9.0, line=None) == 900 * MB
    )


def test_the_estimate_never_passes_the_line() -> None:
    """Above the line it would fail as one that can never fit, yet its peak fit under it."""
    assert rerun_estimate(failed=600 * MB, peak=700 * MB, rate=0.0, ran_s=1.0, line=GB) == GB


# Pure arithmetic: only a slow machine (an emulated kernel) makes its inputs slow to draw.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    failed=st.integers(0, 10 * GB),
    peak=st.integers(0, 10 * GB),
    rate=st.floats(-1e9, 1e10, allow_nan=False),
    ran_s=st.floats(0, 1e4, allow_nan=False),
    line=st.one_of(st.none(), st.integers(1, 20 * GB)),
    frozen=st.booleans(),
)
def test_the_estimate_grows_from_the_evidence_and_stays_under_the_line(
    failed: int, peak: int, rate: float, ran_s: float, line: int | None, frozen: bool
) -> None:
    estimate = rerun_estimate(
        failed=failed, peak=peak, rate=rate, ran_s=ran_s, line=line, frozen=frozen
    )
    floor = failed if frozen and peak <= failed else 2 * failed
    assert estimate >= min(max(floor, peak), line or 10**30)
    assert estimate <= max(floor, 2 * peak)
    assert line is None or estimate <= line


def test_only_the_run_after_the_last_allowed_stop_is_the_last() -> None:
    assert [is_last_run(n, 3) for n in range(5)] == [False, False, False, True, True]
    assert not is_last_run(0, 0)  # never stopped: never a re-run


def test_a_last_run_waits_for_the_others_whole_worst_case(tmp_path: Path) -> None:
    """Line 9 GB, used 1 GB: two settled pack jobs of 3 GB hold a floor each, so a 3 GB job
    fits beside them; on its last run it waits, since they may still grow by all of theirs."""
    guard, clock = fixture_guard(tmp_path, used=GB)
    for job in ("a", "b"):
        assert guard.admit(job, memory_bytes=3 * GB, policy=MemoryPolicy.PACK).admit
    clock.advance(IDLE_OBSERVE_SECONDS)
    for job in ("a", "b"):
        guard.report_measured(job, 0)  # observed, and not growing
    assert guard.check(memory_bytes=3 * GB).admit
    last = guard.admit("c", memory_bytes=3 * GB, policy=MemoryPolicy.PACK, worst_case=True)
    assert not last.admit and last.young_reserved_bytes == 6 * GB
    assert "its last run waits for room for its worst case" in last.summary
    assert guard.trials() == []  # never on trial
    guard.release("b")
    alone = guard.admit("c", memory_bytes=3 * GB, policy=MemoryPolicy.PACK, worst_case=True)
    assert alone.admit and guard.trials() == []
    # It holds its whole estimate (strict); the settled pack job beside it, its floor.
    assert guard.statistics().reserved_bytes == 3 * GB + FLOOR_BYTES


def test_a_rerun_is_asked_at_most_at_the_room_it_would_have_alone(tmp_path: Path) -> None:
    """Line 9 GB, used 3 GB of which our live jobs hold 2 GB: a 12 GB forecast is asked at
    8 GB, the room with none of our jobs running, and is never failed as too large; never
    below its peak, though: with 8.5 GB of others' memory it waits for its 2 GB peak."""
    guard, _ = fixture_guard(tmp_path, used=3 * GB)
    judged = guard.admit("b", memory_bytes=12 * GB, rerun=Rerun(peak=GB, ours=2 * GB))
    # It waits for our jobs' 2 GB, not for ever.
    assert (judged.admit, judged.never_fits, judged.estimate_bytes) == (False, False, 8 * GB)
    stated = guard.admit("c", memory_bytes=12 * GB)
    assert stated.never_fits  # a stated size above the line can never fit
    crowded, _ = fixture_guard(tmp_path / "crowded", used=8_500_000_000)
    waits = crowded.admit("d", memory_bytes=4 * GB, rerun=Rerun(peak=2 * GB, ours=0))
    assert (waits.admit, waits.never_fits, waits.estimate_bytes) == (False, False, 2 * GB)

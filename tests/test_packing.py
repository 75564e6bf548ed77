"""Memory policies: strict holds estimate less footprint; pack holds only forecast growth."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from roomkeeper.batch.run import (
    UNCOUNTED_MAX_RUNNING,
    BatchOptions,
    BatchResult,
    BatchSettings,
    run_batch,
)
from roomkeeper.cli import local
from roomkeeper.cli.app import main
from roomkeeper.cli.batch_view import BatchProgress
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.packing import (
    FLOOR_BYTES,
    HORIZON_SECONDS,
    IDLE_OBSERVE_SECONDS,
    OBSERVE_SECONDS,
    REPORTS_KEPT,
    STARTED_BYTES,
    MemoryPolicy,
    Report,
    forecast_bytes,
    growth_slope,
    held_bytes,
    observed,
    trimmed,
)
from roomkeeper.guard.rule import Decision
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerSettings
from tests.fakes import NO_DISK, fixture_guard

MB = 10**6
GB = 10**9


def reports(*points: tuple[float, int]) -> list[Report]:
    return [Report(at, measured) for at, measured in points]


def test_pack_forecasts_the_measured_slope_over_the_horizon() -> None:
    """Growing 100 MB/s, a pack job holds HORIZON_SECONDS of that growth plus the floor."""
    grown = reports((0.0, 0), (1.0, 100 * MB), (2.0, 200 * MB))
    assert growth_slope(grown) == pytest.approx(100 * MB)
    expected = int(100 * MB * HORIZON_SECONDS) + FLOOR_BYTES
    assert forecast_bytes(grown) == expected
    assert held_bytes(MemoryPolicy.PACK, 10 * GB, grown) == expected


def test_pack_never_holds_more_than_strict() -> None:
    """The forecast is capped at estimate - measured: packing only ever reserves less."""
    steep = reports((0.0, 0), (1.0, 400 * MB))
    assert forecast_bytes(steep) > 600 * MB
    assert held_bytes(MemoryPolicy.PACK, GB, steep) == GB - 400 * MB
    past = reports((0.0, 0), (1.0, 2 * GB))
    assert held_bytes(MemoryPolicy.PACK, GB, past) == 0


def test_a_job_that_stopped_growing_holds_only_the_floor() -> None:
    """The slope is taken over the recent reports: old growth is forgotten."""
    flat = reports((0.0, 0), (1.0, 500 * MB), (10.0, 500 * MB), (11.0, 500 * MB))
    assert growth_slope(flat) == 0.0
    assert held_bytes(MemoryPolicy.PACK, 2 * GB, flat) == FLOOR_BYTES
    shrinking = reports((0.0, 0), (5.0, 500 * MB), (6.0, 300 * MB))
    assert held_bytes(MemoryPolicy.PACK, 2 * GB, shrinking) == FLOOR_BYTES


def test_the_slope_uses_the_last_report_older_than_the_window_when_none_is_inside() -> None:
    """Two reports far apart still give a slope (the scheduler may report rarely)."""
    sparse = reports((0.0, 0), (10.0, 100 * MB))
    assert growth_slope(sparse) == pytest.approx(10 * MB)


@given(
    estimate=st.integers(0, 10 * GB),
    points=st.lists(
        st.tuples(st.floats(0, 100, allow_nan=False), st.integers(0, 10 * GB)), max_size=8
    ),
)
def test_strict_is_estimate_less_measured_and_pack_never_more(
    estimate: int, points: list[tuple[float, int]]
) -> None:
    """Strict is exactly today's rule, whatever was reported; pack is never above it."""
    ordered = reports(*sorted(points))
    measured = ordered[-1].measured if ordered else 0
    strict = held_bytes(MemoryPolicy.STRICT, estimate, ordered)
    assert strict == max(0, estimate - measured)
    assert 0 <= held_bytes(MemoryPolicy.PACK, estimate, ordered) <= strict


def test_a_pack_job_holds_strict_until_it_has_been_observed(tmp_path: Path) -> None:
    """Just admitted (or reported within OBSERVE_SECONDS), a pack job has no growth to go by."""
    assert held_bytes(MemoryPolicy.PACK, GB, reports((0.0, 0))) == GB
    early = reports((0.0, 0), (OBSERVE_SECONDS - 0.01, 0))
    assert not observed(early) and held_bytes(MemoryPolicy.PACK, GB, early) == GB
    guard, clock = fixture_guard(tmp_path, used=GB)
    assert guard.admit("a", memory_bytes=3 * GB, policy=MemoryPolicy.PACK).admit
    clock.advance(0.2)
    guard.report_measured("a", 0)  # a burst: the next launch of the same round
    assert guard.statistics().reserved_bytes == 3 * GB


def test_growth_is_observed_from_when_it_began() -> None:
    """OBSERVE_SECONDS count from the first report at STARTED_BYTES, not from admission."""
    began = 0.4  # an idle start: a shell, an interpreter importing its libraries
    grown = reports((0.0, 0), (began, STARTED_BYTES), (began + OBSERVE_SECONDS - 0.01, 50 * MB))
    assert not observed(grown) and held_bytes(MemoryPolicy.PACK, GB, grown) == GB - 50 * MB
    later = [*grown, Report(began + OBSERVE_SECONDS, 60 * MB)]
    assert observed(later) and held_bytes(MemoryPolicy.PACK, GB, later) < GB - 60 * MB


def test_a_job_that_never_grows_is_observed_after_the_idle_wait() -> None:
    """Below STARTED_BYTES, a job is taken as small only IDLE_OBSERVE_SECONDS after admission."""
    idle = reports((0.0, 0), (OBSERVE_SECONDS, 2 * MB), (IDLE_OBSERVE_SECONDS - 0.01, 2 * MB))
    assert not observed(idle) and held_bytes(MemoryPolicy.PACK, GB, idle) == GB - 2 * MB
    waited = [*idle, Report(IDLE_OBSERVE_SECONDS, 2 * MB)]
    assert observed(waited) and held_bytes(MemoryPolicy.PACK, GB, waited) < 2 * FLOOR_BYTES


def test_the_forecast_takes_the_recent_slope_when_it_is_steeper() -> None:
    """A slow start then fast growth: the window's average would forecast too little."""
    slow_then_fast = reports((0.0, 0), (2.0, 20 * MB), (2.5, 220 * MB))
    assert growth_slope(slow_then_fast) == pytest.approx(88 * MB)  # the 3 s window's average
    recent = (220 - 20) * MB / 0.5
    assert forecast_bytes(slow_then_fast) == int(recent * HORIZON_SECONDS) + FLOOR_BYTES


def test_trimming_keeps_the_reports_observation_dates_from() -> None:
    """The admission and the first started report outlive REPORTS_KEPT newer ones."""
    many = reports((0.0, 0), *((0.1 * i, STARTED_BYTES + i) for i in range(1, REPORTS_KEPT + 24)))
    kept = trimmed(many)
    assert len(kept) == REPORTS_KEPT + 2
    assert kept[:2] == many[:2] and kept[2:] == many[-REPORTS_KEPT:]
    assert trimmed(many[:5]) == many[:5]
    # Reported every 10 ms since it began 0.8 s ago: without the pin the oldest kept
    # report (0.4 s back) would be taken as its start, and pack would never judge it.
    count = 2 * REPORTS_KEPT + 1
    fast = reports((0.0, 0), *((10.0 + 0.01 * i, STARTED_BYTES + i * MB) for i in range(count)))
    assert observed(fast) and observed(trimmed(fast))


def test_trimming_keeps_time_order_when_growth_began_among_the_newest() -> None:
    """Idle long enough to be trimmed, then a jump: the newest report stays the newest."""
    idle = reports((0.0, 0), *((0.5 * i, 5 * MB) for i in range(1, 21)))
    jumped = [*idle, Report(10.5, 400 * MB)]
    kept = trimmed(jumped)
    assert kept[-1] == jumped[-1]
    assert held_bytes(MemoryPolicy.PACK, GB, kept) == held_bytes(MemoryPolicy.PACK, GB, jumped)


@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, GB)), min_size=1, max_size=40))
def test_trimming_is_an_ordered_subsequence_with_its_pins(points: list[tuple[float, int]]) -> None:
    """Sorted in, sorted out: the admission, the first started report and the newest kept."""
    ordered = reports(*sorted(points))
    kept = trimmed(ordered)
    assert kept == sorted(kept, key=lambda r: r.at)
    assert kept[0] == ordered[0] and kept[-1] == ordered[-1]
    assert all(r in ordered for r in kept) and len(kept) <= REPORTS_KEPT + 2
    started = [r for r in ordered if r.measured >= STARTED_BYTES]
    assert not started or started[0] in kept
    assert observed(kept) == observed(ordered)


def test_a_job_that_grows_late_is_observed_from_its_growth_not_the_idle_wait() -> None:
    """Started at 1.9 s: judged by its growth at 2.4 s, not at the idle wait's 2 s."""
    late = reports((0.0, 0), (1.9, STARTED_BYTES), (IDLE_OBSERVE_SECONDS + 0.1, 80 * MB))
    assert not observed(late)
    assert observed([*late, Report(1.9 + OBSERVE_SECONDS, 90 * MB)])


def test_the_guard_holds_a_pack_jobs_forecast_and_a_strict_jobs_estimate(
    tmp_path: Path,
) -> None:
    """Admitted alike; young, the pack job holds its forecast, the strict one its estimate."""
    guard, clock = fixture_guard(tmp_path, used=GB)
    assert guard.admit("strict", memory_bytes=3 * GB).admit
    assert guard.admit("pack", memory_bytes=3 * GB, policy=MemoryPolicy.PACK).admit
    assert guard.statistics().reserved_bytes == 6 * GB
    for measured in (50 * MB, 100 * MB):  # 100 MB in its first second, steadily
        clock.advance(0.5)
        guard.report_measured("strict", measured)
        guard.report_measured("pack", measured)
    forecast = int(100 * MB * HORIZON_SECONDS) + FLOOR_BYTES
    assert guard.statistics().reserved_bytes == (3 * GB - 100 * MB) + forecast


def test_packing_admits_what_strict_would_refuse(tmp_path: Path) -> None:
    """Line 9 GB, used 1 GB: after two 3 GB strict jobs a third is refused; after pack, not."""
    strict, _ = fixture_guard(tmp_path / "s", used=GB)
    for job in ("a", "b"):
        assert strict.admit(job, memory_bytes=3 * GB).admit
    assert not strict.admit("c", memory_bytes=3 * GB).admit
    pack, clock = fixture_guard(tmp_path / "p", used=GB)
    for job in ("a", "b"):
        assert pack.admit(job, memory_bytes=3 * GB, policy=MemoryPolicy.PACK).admit
    early = pack.admit("c", memory_bytes=3 * GB, policy=MemoryPolicy.PACK)
    assert early.admit and pack.trials() == ["c"]  # its estimate does not fit yet: on trial
    pack.release("c")
    clock.advance(IDLE_OBSERVE_SECONDS)
    for job in ("a", "b"):
        pack.report_measured(job, 0)  # observed, and not growing
    third = pack.admit("c", memory_bytes=3 * GB, policy=MemoryPolicy.PACK)
    assert third.admit and third.young_reserved_bytes == 2 * FLOOR_BYTES
    assert pack.trials() == []


def test_the_job_asked_about_still_needs_its_whole_estimate(tmp_path: Path) -> None:
    """Pack changes what young jobs hold, not the question: with no job of ours running (none
    to start on trial beside), the new job's estimate must fit."""
    guard, _ = fixture_guard(tmp_path, used=GB)
    assert not guard.admit("big", memory_bytes=8 * GB + 1, policy=MemoryPolicy.PACK).admit
    assert guard.admit("fits", memory_bytes=8 * GB, policy=MemoryPolicy.PACK).admit


def test_batch_packs_unless_strict_and_passes_its_kind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``roomkeeper batch`` runs its lines under pack; ``--strict`` and ``--kind`` reach them."""
    seen: list[BatchOptions] = []

    def fake_run_batch(
        commands: Sequence[str], settings: BatchSettings, **kw: Any
    ) -> list[BatchResult]:
        seen.append(settings.options)
        return []

    monkeypatch.setattr(local, "run_batch", fake_run_batch)
    env = {"ROOMKEEPER_HOME": str(tmp_path / "home")}
    lines = "true\ntrue #kind=own\n"
    for args in ([], ["--strict", "--kind", "all"]):
        result = CliRunner().invoke(main, ["batch", *args, "-"], input=lines, env=env)
        assert result.exit_code == 0, result.output
    assert [o.policy for o in seen] == [MemoryPolicy.PACK, MemoryPolicy.STRICT]
    assert [list(o.kinds) for o in seen] == [[None, "own"], ["all", "own"]]
    assert all(o.sizes is not None for o in seen)  # ROOMKEEPER_HOME's journal


def test_batch_without_a_count_waits_for_free_cores_and_with_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --max-running and no ROOMKEEPER_MAX_RUNNING: at most 8 lines run, and they also
    wait for free cores; either one given is the person's own CPU decision, as parallel -j is."""
    seen: list[BatchSettings] = []

    def fake_run_batch(
        commands: Sequence[str], settings: BatchSettings, **kw: Any
    ) -> list[BatchResult]:
        seen.append(settings)
        return []

    monkeypatch.setattr(local, "run_batch", fake_run_batch)
    monkeypatch.delenv("ROOMKEEPER_MAX_RUNNING", raising=False)
    home = {"ROOMKEEPER_HOME": str(tmp_path / "home")}
    for args, env in (
        ([], home),
        (["--max-running", "3"], home),
        ([], {**home, "ROOMKEEPER_MAX_RUNNING": "3"}),
        ([], {**home, "ROOMKEEPER_MAX_RUNNING": " "}),  # unset in all but name: no count
    ):
        result = CliRunner().invoke(main, ["batch", *args, "-"], input="true\n", env=env)
        assert result.exit_code == 0, result.output
    # Without a count, memory and the cores decide how many run, within the batch's own bound
    # on lines of unknown size.
    assert [(s.until_cores_free, s.max_running) for s in seen] == [
        (True, UNCOUNTED_MAX_RUNNING),
        (False, 3),
        (False, 3),
        (True, UNCOUNTED_MAX_RUNNING),
    ]


@pytest.mark.kernel
def test_run_batch_hands_its_cores_rule_to_its_rounds(tmp_path: Path) -> None:
    """The batch's choice reaches the limits its scheduler's rounds read."""
    seen: list[bool] = []

    def recording(settings: SchedulerSettings, **kw: Any) -> Scheduler:
        seen.append(settings.limits().until_cores_free)
        return Scheduler(settings, **kw)

    progress = BatchProgress(
        1, console=Console(file=io.StringIO()), on_terminal=False, out=io.BytesIO()
    )
    for rule in (True, False):
        run_batch(
            ["true"],
            BatchSettings(logs_dir=tmp_path / "logs", job_memory=MB, until_cores_free=rule),
            progress=progress,
            guard=Guard(env=NO_DISK, workspace=tmp_path),
            scheduler_factory=recording,
        )
    assert seen == [True, False]


class _RecordingGuard(Guard):
    """A real guard that remembers the policy each job was admitted under."""

    policies: dict[str, MemoryPolicy]

    def admit(self, job_id: str, **kw: Any) -> Decision:
        self.policies[job_id] = kw["policy"]
        return super().admit(job_id, **kw)


@pytest.mark.kernel
def test_run_batch_defaults_to_pack(tmp_path: Path) -> None:
    """Without options, every line reaches the guard under the pack policy."""
    guard = _RecordingGuard(env=NO_DISK, workspace=tmp_path)
    guard.policies = {}
    progress = BatchProgress(
        2, console=Console(file=io.StringIO()), on_terminal=False, out=io.BytesIO()
    )
    results = run_batch(
        ["true", "true"],
        BatchSettings(logs_dir=tmp_path / "logs", max_running=2, job_memory=MB, quiet=True),
        progress=progress,
        guard=guard,
    )
    assert [r.succeeded for r in results] == [True, True]
    assert guard.policies == {"1": MemoryPolicy.PACK, "2": MemoryPolicy.PACK}

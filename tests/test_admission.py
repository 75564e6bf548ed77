"""The guard: the admission rule at its boundaries, young reservations, decisions and words."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roomkeeper import Guard, Reason
from roomkeeper.guard.rule import disk_needed, memory_line
from roomkeeper.kernel.resources import (
    DiskReading,
    LimitOrigin,
    MemoryReading,
    MemorySource,
    Resources,
)
from roomkeeper.testing import FakeClock
from tests.fakes import NO_DISK, fixture_guard
from tests.kernel_files import Level, Roots, fixture_roots, v2_tree

MIB = 2**20
GB = 10**9


def guard_for(
    tmp_path: Path, *, limit: int | None, used: int, env: dict[str, str] | None = None
) -> tuple[Guard, FakeClock, Roots]:
    roots = v2_tree(tmp_path / "tree", "/job", {"/job": Level(limit, used + 12345, 12345)})
    clock = FakeClock()
    guard = Guard(
        env={**NO_DISK, **(env or {})},
        proc_root=roots.proc,
        cgroup_root=roots.cgroup,
        workspace=tmp_path,
        clock=clock,
    )
    return guard, clock, roots


def test_exactly_at_the_line_is_admitted_one_byte_over_is_refused(tmp_path: Path) -> None:
    """used + young + estimate == line admits; one byte more refuses for memory."""
    guard, _, _ = guard_for(tmp_path, limit=10 * GB, used=5 * GB)
    line = 10 * GB - GB  # 10 % of 10 GB, under the 8 GB cap
    assert not guard.admit("over", memory_bytes=line - 5 * GB + 1).admit
    at_line = guard.admit("fits", memory_bytes=line - 5 * GB)
    assert at_line.admit and at_line.reason is Reason.OK
    assert at_line.memory_line_bytes == line
    refused = guard.admit("next", memory_bytes=1)
    assert not refused.admit and refused.reason is Reason.MEMORY


def test_young_reservations_of_different_sizes_add_up(tmp_path: Path) -> None:
    """Each admitted job reserves its own estimate; a release gives exactly that back."""
    guard, _, _ = guard_for(tmp_path, limit=10 * GB, used=GB)
    assert guard.admit("a", memory_bytes=GB).admit
    assert guard.admit("b", memory_bytes=3 * GB).admit
    room = 9 * GB - GB - 4 * GB
    assert not guard.admit("c", memory_bytes=room + 1).admit
    guard.release("b")
    assert guard.admit("c", memory_bytes=room + 3 * GB).admit
    stats = guard.statistics()
    assert (stats.young, stats.reserved_bytes) == (2, GB + room + 3 * GB)


def test_reservation_ends_with_the_warmup_window(tmp_path: Path) -> None:
    """A young job stops reserving once ROOMKEEPER_JOB_WARMUP_SECONDS have passed."""
    guard, clock, _ = guard_for(
        tmp_path, limit=10 * GB, used=GB, env={"ROOMKEEPER_JOB_WARMUP_SECONDS": "60"}
    )
    assert guard.admit("a", memory_bytes=8 * GB).admit
    assert not guard.admit("b", memory_bytes=GB).admit
    clock.advance(59.9)
    assert not guard.admit("b", memory_bytes=GB).admit
    clock.advance(0.1)
    assert guard.admit("b", memory_bytes=GB).admit
    assert guard.statistics().young == 1


def test_measured_footprint_is_not_counted_twice(tmp_path: Path) -> None:
    """A young job reserves only max(0, estimate - measured) once its footprint is reported."""
    guard, _, _ = guard_for(tmp_path, limit=10 * GB, used=GB)
    assert guard.admit("a", memory_bytes=4 * GB).admit
    guard.report_measured("a", 3 * GB)
    assert guard.statistics().reserved_bytes == GB
    guard.report_measured("a", 5 * GB)
    assert guard.statistics().reserved_bytes == 0
    guard.report_measured("unknown-id", GB)  # ignored


def test_readmitting_an_id_does_not_count_it_against_itself(tmp_path: Path) -> None:
    """A second admit of a held id is judged in place, not on top of its own reservation."""
    guard, _, _ = guard_for(tmp_path, limit=10 * GB, used=GB)
    assert guard.admit("a", memory_bytes=8 * GB).admit
    assert guard.admit("a", memory_bytes=8 * GB).admit
    assert guard.statistics().reserved_bytes == 8 * GB


@pytest.mark.parametrize(
    ("limit", "line"),
    [
        (80 * GB, 72 * GB),  # 10 % is exactly the 8 GB cap
        (100 * GB, 92 * GB),  # 10 % would be 10 GB: capped at 8 GB
        (4 * GB, 3_600_000_000),
    ],
)
def test_memory_headroom_is_capped_at_8_gb(tmp_path: Path, limit: int, line: int) -> None:
    """line = limit - min(limit x 10 %, 8 GB), in decimal GB; the guard refuses one byte over."""
    assert memory_line(limit, 10) == line
    guard, _, _ = guard_for(tmp_path, limit=limit, used=0)
    assert guard.admit("a", memory_bytes=line).admit
    guard.release("a")
    assert not guard.admit("b", memory_bytes=line + 1).admit


def _resources(free: int, total: int, used: int = GB, limit: int = 100 * GB) -> Resources:
    memory = MemoryReading(MemorySource.CGROUP_V2, used, limit, LimitOrigin.CGROUP, "/job")
    return Resources(
        memory, DiskReading("/w", free, total), None, None, "machine", None, "linux", 0
    )


@pytest.mark.parametrize(
    ("total", "headroom"),
    [(50 * GB, 5 * GB), (100 * GB, 10 * GB), (500 * GB, 10 * GB)],  # capped at 10 GB
)
def test_disk_rule_at_its_boundary(total: int, headroom: int) -> None:
    """free < job disk + min(total x 10 %, 10 GB) refuses; free equal to it admits."""
    job = 2048 * MIB
    assert disk_needed(job, total, 10) == job + headroom
    guard = Guard(env={})
    fits = guard.check(resources=_resources(job + headroom, total))
    assert fits.admit, fits.summary
    short = guard.check(resources=_resources(job + headroom - 1, total))
    assert (short.admit, short.reason) == (False, Reason.DISK)
    assert "no room on disk" in short.summary


def test_memory_is_judged_first_and_one_cause_reported() -> None:
    """With no room for either, the refusal names memory only."""
    decision = Guard(env={}).check(resources=_resources(0, 50 * GB, used=99 * GB))
    assert decision.reason is Reason.MEMORY
    assert "disk" not in decision.summary


def test_real_volume_refuses_a_job_bigger_than_the_disk(tmp_path: Path) -> None:
    """A job asking for more disk than the real volume holds is refused for disk."""
    roots = fixture_roots("cgroup-v2-host")
    guard = Guard(env={}, proc_root=roots.proc, cgroup_root=roots.cgroup, workspace=tmp_path)
    decision = guard.admit("big", memory_bytes=0, disk_bytes=2**60)
    assert decision.reason is Reason.DISK
    assert decision.disk is not None and decision.disk.path == str(tmp_path)


def test_unknown_is_a_refusal(tmp_path: Path) -> None:
    """A reading that cannot be taken refuses with reason unknown, and reserves nothing."""
    guard, _, roots = guard_for(tmp_path, limit=10 * GB, used=GB)
    Path(roots.cgroup, "job", "memory.stat").write_text("garbage\n")
    decision = guard.admit("a")
    assert (decision.admit, decision.reason) == (False, Reason.UNKNOWN)
    assert decision.summary.startswith("measurements unavailable")
    assert guard.statistics().young == 0


def test_guard_off_admits_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ROOMKEEPER_GUARD=off admits without a reading, and the log says the guard is off."""
    guard, _, _ = guard_for(tmp_path, limit=GB, used=GB, env={"ROOMKEEPER_GUARD": "off"})
    with caplog.at_level(logging.INFO, logger="roomkeeper"):
        decision = guard.admit("a", memory_bytes=100 * GB)
    assert (decision.admit, decision.reason) == (True, Reason.OFF)
    assert "guard is off" in caplog.text


def test_not_linux_has_no_container_to_protect() -> None:
    """Off Linux the guard passes with reason no_container and says so in the summary."""
    decision = Guard(env={}, platform="darwin").admit("a", memory_bytes=10**15)
    assert (decision.admit, decision.reason) == (True, Reason.NO_CONTAINER)
    assert "no container to protect" in decision.summary


def test_no_limit_host_is_judged_against_the_machine(tmp_path: Path) -> None:
    """With no cgroup limit, the machine's MemTotal is the limit the rule uses."""
    guard, _, _ = guard_for(tmp_path, limit=None, used=GB)
    decision = guard.admit("a")
    assert decision.admit
    assert decision.memory is not None and decision.memory.source is MemorySource.MEMINFO
    assert "meminfo" in decision.summary


def test_override_that_tries_to_raise_the_limit_is_ignored(tmp_path: Path) -> None:
    """ROOMKEEPER_MEMORY_LIMIT_MB above the kernel's limit changes nothing."""
    guard, _, _ = guard_for(
        tmp_path, limit=4 * GB, used=0, env={"ROOMKEEPER_MEMORY_LIMIT_MB": str(100 * 1024)}
    )
    assert not guard.admit("a", memory_bytes=4 * GB).admit
    lowered, _, _ = guard_for(
        tmp_path / "2", limit=4 * GB, used=0, env={"ROOMKEEPER_MEMORY_LIMIT_MB": "1024"}
    )
    decision = lowered.admit("b", memory_bytes=GB)
    assert not decision.admit and decision.memory_line_bytes == memory_line(MIB * 1024, 10)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    limit=st.integers(GB, 200 * GB),
    used_share=st.floats(0, 1.2),
    young=st.integers(0, 12),
    per_job_mb=st.integers(1, 4096),
)
def test_equal_estimates_are_exactly_the_plain_rule(
    tmp_path_factory: pytest.TempPathFactory,
    limit: int,
    used_share: float,
    young: int,
    per_job_mb: int,
) -> None:
    """With every estimate ROOMKEEPER_JOB_MEMORY_MB, the guard is used + (young + 1) x per_job,
    the next job's default never above a quarter of the line."""
    used = int(limit * used_share)
    per_job = per_job_mb * MIB
    env = {"ROOMKEEPER_JOB_MEMORY_MB": str(per_job_mb), "ROOMKEEPER_GUARD": "off"}
    guard, _, _ = guard_for(tmp_path_factory.mktemp("plain"), limit=limit, used=used, env=env)
    for i in range(young):  # admitted while off: they still reserve
        guard.admit(f"young-{i}")
    guard._env = {**NO_DISK, "ROOMKEEPER_JOB_MEMORY_MB": str(per_job_mb)}  # guard back on
    line = limit - min(limit * 10 // 100, 8 * GB)
    plain_refuses = used + young * per_job + min(per_job, line // 4) > line
    decision = guard.admit("next")
    assert decision.admit is not plain_refuses
    assert len(decision.summary) < 200


@settings(max_examples=200)
@given(
    used=st.integers(0, 10**15),
    limit=st.integers(1, 10**15),
    estimate=st.integers(0, 10**15),
    free=st.integers(0, 10**15),
    total=st.integers(1, 10**15),
)
def test_summaries_stay_short_and_carry_no_path(
    used: int, limit: int, estimate: int, free: int, total: int
) -> None:
    """Every summary is under 200 characters, names no path, and prints decimal GB."""
    guard = Guard(env={})
    memory = MemoryReading(MemorySource.CGROUP_V1, used, limit, LimitOrigin.CGROUP, "/a/b")
    resources = Resources(
        memory, DiskReading("/var/lib/x", free, total), None, None, "m", None, "linux", 0
    )
    decision = guard.check(memory_bytes=estimate, resources=resources)
    assert len(decision.summary) < 200
    assert "/" not in decision.summary
    assert f"{used / GB:.2f}" in decision.summary


def test_statistics_show_the_last_decision_and_counts(tmp_path: Path) -> None:
    """statistics() gives young count, reserved bytes, the last decision and counts by reason."""
    guard, _, _ = guard_for(tmp_path, limit=10 * GB, used=GB)
    guard.admit("a", memory_bytes=GB)
    last = guard.admit("b", memory_bytes=100 * GB)
    stats = guard.statistics()
    assert stats.last_decision == last
    assert stats.decisions == {"ok": 1, "memory": 1}


def test_concurrent_admits_never_share_the_same_room(tmp_path: Path) -> None:
    """Judgement and reservation are one step: threads racing admit exactly what fits."""
    guard, _, _ = guard_for(tmp_path, limit=10 * GB, used=0)  # line 9 GB
    admitted: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(10):
            if guard.admit(f"{n}-{i}", memory_bytes=GB).admit:
                with lock:
                    admitted.append(f"{n}-{i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 9


def test_guard_is_on_is_logged_once_and_again_when_reads_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """'guard is on {reads: ...}' is logged on first use and again when what it reads changes."""
    guard, _, roots = guard_for(tmp_path, limit=10 * GB, used=GB)
    with caplog.at_level(logging.INFO, logger="roomkeeper"):
        for i in range(5):
            guard.admit(f"a{i}", memory_bytes=1)
        Path(roots.cgroup, "job", "memory.max").write_text("max\n")
        guard.admit("b", memory_bytes=1)
        guard.admit("c", memory_bytes=1)
    lines = [r.getMessage() for r in caplog.records if "guard is on" in r.getMessage()]
    assert len(lines) == 2
    assert 'reads: "memory from cgroup v2, limit 10.00 GB from cgroup"' in lines[0]
    assert "from meminfo" in lines[1]


def test_a_repeated_refusal_is_logged_once_per_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same job refused for the same reason round after round: one log line."""
    guard = Guard(env={"ROOMKEEPER_GUARD": "on"}, platform="linux", workspace=tmp_path)
    caplog.set_level("INFO", logger="roomkeeper")
    for _ in range(5):
        assert not guard.admit("big", memory_bytes=2**62).admit
    refusals = [r for r in caplog.records if r.getMessage().startswith("refused big")]
    assert len(refusals) == 1
    assert "even with nothing else running" in refusals[0].getMessage()


def test_with_nothing_stated_a_job_asks_at_most_a_quarter_of_the_line(tmp_path: Path) -> None:
    """In a 1 GiB container the 1 GiB default would never fit anything: with nothing stated or
    learned a job is expected at a quarter of the line, and a default never "never fits"."""
    limit = 2**30
    line = memory_line(limit, 10.0)
    guard, _ = fixture_guard(tmp_path / "empty", used=0, limit=limit)
    assert guard.estimate(None) == line // 4
    decided = guard.check()
    assert (decided.admit, decided.estimate_bytes, decided.never_fits) == (True, line // 4, False)
    assert guard.check(memory_bytes=limit).never_fits  # the submitter's own figure can
    full, _ = fixture_guard(tmp_path / "full", used=line - 10 * MIB, limit=limit)
    waits = full.check()
    assert (waits.admit, waits.reason, waits.never_fits) == (False, Reason.MEMORY, False)


def test_in_a_roomy_container_the_default_is_the_variable(tmp_path: Path) -> None:
    """Where a quarter of the line is more, ROOMKEEPER_JOB_MEMORY_MB (1 GiB by default) wins."""
    guard, _ = fixture_guard(tmp_path, used=0, limit=20 * GB)
    assert guard.estimate(None) == 2**30
    assert guard.check().estimate_bytes == 2**30

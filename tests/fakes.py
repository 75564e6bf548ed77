"""Fakes the scheduler and relief tests share: a launched tree, the ladder's target, a guard on
synthetic kernel files, and the environment that takes disk out of the rule."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Mapping
from pathlib import Path

from roomkeeper.guard.admission import Guard
from roomkeeper.processes.peaks import MemoryPeak, PeakMethod
from roomkeeper.relief.ladder import Live
from roomkeeper.testing import CannotSuspend, FakeClock
from roomkeeper.units import GB
from tests.kernel_files import Level, v2_tree

# A small /tmp must not refuse launches: the disk rule has its own tests.
NO_DISK = {"ROOMKEEPER_JOB_DISK_MB": "0", "ROOMKEEPER_DISK_HEADROOM_PERCENT": "0"}


class FakeHandle(CannotSuspend):
    """A launched tree that ends when the test says so."""

    def __init__(self, job_id: str, footprint: int = 0) -> None:
        self.job_id = job_id
        self.pid = os.getpid()  # a real pid, so the scheduler's pidfd_open works
        self.code: int | None = None
        self.footprint = footprint
        self.stopped_with: float | None = None
        self.closed = False

    def poll(self) -> int | None:
        return self.code

    def cpu_seconds(self) -> float | None:
        return None

    def footprint_bytes(self) -> int:
        return self.footprint

    def peak(self) -> MemoryPeak:
        return MemoryPeak(self.footprint, PeakMethod.SAMPLED)

    def stop(self, grace: float = 5.0) -> int | None:
        self.stopped_with = grace
        self.code = -15
        return self.code

    def close(self) -> None:
        self.closed = True


class FakeTarget:
    """The scheduler's side, recorded."""

    def __init__(self, live: list[Live]) -> None:
        self.live = live
        self.held: list[bool] = []
        self.done: list[tuple[str, str]] = []
        self.stopping = False  # a stopped tree still going, its job no longer listed

    def live_jobs(self) -> list[Live]:
        return list(self.live)

    def hold_for_pressure(self, hold: bool) -> None:
        self.held.append(hold)

    def suspend_for_pressure(self, job_id: str, *, trial: bool = False) -> bool:
        self.done.append(("pause" if trial else "suspend", job_id))
        return True

    def suspend_all_for_pressure(self, job_ids: list[str]) -> list[str]:
        return [j for j in job_ids if self.suspend_for_pressure(j)]

    def resume_after_pressure(self, job_id: str) -> bool:
        self.done.append(("resume", job_id))
        return True

    def stop_in_progress(self) -> bool:
        return self.stopping

    def stop_for_pressure(self, job_id: str, why: str, *, never_fits: bool) -> bool:
        self.done.append(("stop", job_id))
        return True


def fixture_guard(
    tmp_path: Path, used: int, limit: int = 10 * GB, env: Mapping[str, str] = NO_DISK
) -> tuple[Guard, FakeClock]:
    roots = v2_tree(tmp_path / "tree", "/job", {"/job": Level(limit, used + 12345, 12345)})
    clock = FakeClock()
    guard = Guard(
        env=env,
        proc_root=roots.proc,
        cgroup_root=roots.cgroup,
        workspace=tmp_path,
        clock=clock,
    )
    return guard, clock


class FakeLeases:
    """The gateway's leases as the ladder may relieve them, recorded."""

    def __init__(self, leases: list[Live], *, unhooked: tuple[int, int] = (0, 0)) -> None:
        self.leases = leases
        self.unhooked = unhooked
        self.asked: list[str] = []
        self.settled: list[tuple[str, bool, str, int]] = []
        self.hooks: dict[str, concurrent.futures.Future[str]] = {}

    def relievable(self) -> list[Live]:
        return [v for v in self.leases if v.job_id not in self.asked]

    def unrelievable(self) -> tuple[int, int]:
        return self.unhooked

    def relieve(self, lease_id: str, why: str) -> concurrent.futures.Future[str] | None:
        self.asked.append(lease_id)
        self.hooks[lease_id] = concurrent.futures.Future()
        return self.hooks[lease_id]

    def settle(self, lease_id: str, relieved: bool, outcome: str, freed: int) -> None:
        self.settled.append((lease_id, relieved, outcome, freed))

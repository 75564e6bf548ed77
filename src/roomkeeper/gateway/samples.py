"""The Health page's chart: the guard's numbers and the queue's, every two seconds.

Ten minutes of samples are kept in memory, nothing on disk; ``GET /v1/feed``
and ``GET /metrics`` read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from roomkeeper.guard.admission import Guard
from roomkeeper.jobs.scheduler import Scheduler

SAMPLE_EVERY_S = 2.0
SAMPLES_KEPT = 300  # ten minutes at one sample every two seconds


@dataclass(frozen=True, slots=True)
class Sample:
    """One point of the Health page's chart."""

    at: float
    used_bytes: int | None
    limit_bytes: int | None
    line_bytes: int | None
    disk_free_bytes: int | None
    disk_total_bytes: int | None
    running: int
    waiting: int
    baseline_bytes: int | None = None  # used less what our live work explains


class Sampler:
    """Takes the chart's samples and keeps the latest ones.

    Args:
        guard: whose own numbers are read, so the chart's line is the guard's.
        scheduler: whose running and waiting jobs are counted.
        explained: what our live work explains of used memory now (jobs' footprints,
            leases' reservations); the baseline is used less this.
    """

    def __init__(
        self,
        *,
        guard: Guard,
        scheduler: Scheduler,
        explained: Callable[[], int] | None = None,
    ) -> None:
        self._guard = guard
        self._scheduler = scheduler
        self._explained = explained
        self.samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)

    async def loop(self) -> None:
        """Take a sample every SAMPLE_EVERY_S (a timer; runs until cancelled)."""
        while True:
            with contextlib.suppress(Exception):
                self.samples.append(await asyncio.to_thread(self.sample))
            await asyncio.sleep(SAMPLE_EVERY_S)

    def sample(self) -> Sample:
        """One reading for the chart: the guard's own numbers, so the line is the guard's."""
        decision = self._guard.check()
        memory, disk = decision.memory, decision.disk
        stats = self._scheduler.statistics()
        used = memory.used_bytes if memory else None
        baseline = None
        if used is not None and self._explained is not None:
            baseline = max(0, used - self._explained())
        return Sample(
            time.time(),
            memory.used_bytes if memory else None,
            memory.limit_bytes if memory else None,
            decision.memory_line_bytes,
            disk.free_bytes if disk else None,
            disk.total_bytes if disk else None,
            stats.running,
            stats.waiting,
            baseline,
        )

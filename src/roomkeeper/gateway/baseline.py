"""The baseline of the gateway's container, recorded and judged; who grew.

:class:`BaselineKeeper` takes a record of the baseline (used memory less our
running jobs' footprints less what our granted leases reserve) soon after
jobs or leases end, and every few seconds while nothing of ours is live,
and hands it to the pure rule (:mod:`roomkeeper.relief.baseline`).  When the
rule fires, the gateway says ``memory not given back`` (needs-you, the
Health page), logs it with its numbers, and adds a recovery-history entry of
numbers only.  :meth:`BaselineKeeper.grown` ranks the container's processes
that are not our jobs by how much they grew since the gateway started.  Each
half second it also has :class:`~roomkeeper.gateway.lease_growth.LeaseGrowth`
measure the leases that hold a reservation from the container's growth.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping

from roomkeeper.config import read_baseline_settings
from roomkeeper.gateway.lease_growth import SAMPLE_EVERY_S, LeaseGrowth
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.leases import Leases
from roomkeeper.guard.rule import gb
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.kernel.growth import Grown, ProcessGrowth, in_group_named
from roomkeeper.kernel.job_cgroups import JOB_CGROUP_PREFIX
from roomkeeper.relief.baseline import BaselineRecord, BaselineWatch, NotGivenBack

log = logging.getLogger("roomkeeper")

CHECK_EVERY_S = 0.5  # how often endings are looked for
QUIET_EVERY_S = 2.0  # while nothing of ours is live, a record this often


class BaselineKeeper:
    """Records the baseline after endings and at quiet moments; says when it stays up.

    Args:
        guard: whose reading gives used memory and the line.
        scheduler: our running jobs (their footprints) and how many ended.
        leases: what granted leases reserve, and how many ended.
        journal: where the recovery-history entry goes.
        watch: told of every journal write, to report one that fails.
        env: the variables to read (ROOMKEEPER_BASELINE_*).
        clock: monotonic seconds.
        wall: wall-clock seconds.
    """

    def __init__(
        self,
        *,
        guard: Guard,
        scheduler: Scheduler,
        leases: Leases,
        journal: Journal,
        watch: Callable[[concurrent.futures.Future[None]], None],
        env: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._guard = guard
        self._scheduler = scheduler
        self._leases = leases
        self._journal = journal
        self._watch = watch
        self._clock = clock
        self._wall = wall
        self.watch = BaselineWatch(lambda: read_baseline_settings(env))
        self.growth = ProcessGrowth(self._container)
        # The growth our jobs do not explain, given to the holding leases as measured memory.
        self.lease_growth = LeaseGrowth(
            guard=guard,
            scheduler=scheduler,
            leases=leases,
            learn=lambda key, peak: watch(journal.record_peak(key, peak)),
            clock=clock,
        )
        self._endings_seen = 0
        self._quiet_at = float("-inf")

    def _container(self) -> str | None:
        reading = self._guard.memory_reading()
        return None if reading is None else reading.directory

    def take(self) -> BaselineRecord | None:
        """One record now; None where memory cannot be read."""
        reading = self._guard.memory_reading()
        if reading is None:
            return None
        return BaselineRecord(
            at=self._wall(),
            used=reading.used,
            footprints=self._scheduler.local_footprints(),
            leased=self._leases.reserved(),
            line=reading.hold_line,
        )

    def check(self) -> NotGivenBack | None:
        """Record after new endings, or at a quiet moment; what fired, if the rule began to
        hold now (it is logged and kept in the history)."""
        leases = self._leases.counts()
        ended_leases = sum(n for state, n in leases.items() if state != "granted")
        endings = sum(self._scheduler.ended_counts().values()) + ended_leases
        new = endings - self._endings_seen
        quiet = (
            self._clock() - self._quiet_at >= QUIET_EVERY_S
            and leases.get("granted", 0) == 0
            and not self._scheduler.local_sessions()
        )
        if new <= 0 and not quiet:
            return None
        record = self.take()
        if record is None:
            return None
        self._endings_seen = endings
        if new > 0:
            self.watch.ended(new)
        if quiet:
            self._quiet_at = self._clock()
        fired = self.watch.record(record)
        if fired is not None:
            self._say(fired)
        return fired

    def _say(self, fired: NotGivenBack) -> None:
        log.warning(
            "memory not given back: the baseline (used less our live work) is %s GB, up from "
            "%s GB %d endings ago (more than %s GB); the processes that grew are in /v1/status",
            gb(fired.now_bytes),
            gb(fired.then_bytes),
            fired.endings,
            gb(fired.share_bytes),
        )
        numbers = {
            "baseline_bytes": fired.now_bytes,
            "then_bytes": fired.then_bytes,
            "share_bytes": fired.share_bytes,
            "endings": fired.endings,
        }
        event = HistoryEvent(self._wall(), RecoveryCode.MEMORY_NOT_GIVEN_BACK, numbers)
        self._watch(self._journal.record_history(event))

    async def loop(self) -> None:
        """Look for endings and quiet moments, and learn leases' sizes (timers; run until
        cancelled)."""
        await asyncio.gather(self._check_loop(), self._sample_loop())

    async def _check_loop(self) -> None:
        """Look for endings and quiet moments every :data:`CHECK_EVERY_S`."""
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.growth.start)
        while True:
            try:
                await asyncio.to_thread(self.check)
            except Exception:  # the watch must outlive one bad reading
                log.exception("a baseline record failed; trying again shortly")
            try:
                await asyncio.to_thread(self.lease_growth.step)
            except Exception:  # attribution must outlive one bad reading
                log.exception("attributing memory to leases failed; trying again shortly")
            await asyncio.sleep(CHECK_EVERY_S)

    async def _sample_loop(self) -> None:
        """Read the container often while a lease of a kind is granted, to learn what the
        kind takes (a timer; runs until cancelled)."""
        while True:
            try:
                # In memory alone unless a lease of a kind is granted.
                await asyncio.to_thread(self.lease_growth.sample)
            except Exception:  # learning must outlive one bad reading
                log.exception("learning a lease's size failed; trying again shortly")
            await asyncio.sleep(SAMPLE_EVERY_S)

    def grown(self, most: int = 10) -> list[Grown]:
        """The container's processes that are not our jobs, by growth since the start."""
        ours = f"/{JOB_CGROUP_PREFIX}{os.getpid()}-"
        return self.growth.ranking(
            sessions=self._scheduler.local_sessions(),
            leave_out=lambda pid: in_group_named(pid, ours),
            most=most,
        )

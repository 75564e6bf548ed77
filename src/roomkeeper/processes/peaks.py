"""Sampling running trees' memory at the pressure monitor's rate, for peaks that are true.

A job's peak comes from the kernel where it keeps one that means what we
mean (cgroup v2's ``memory.peak``).  Everywhere else it is sampled: one
thread per process visits every running tree that needs it every
:data:`SAMPLE_SECONDS` (the pressure monitor runs at least that
often), so a job is seen while it holds its memory, not only when someone
happens to ask.  The same samples are the footprint the guard's young-job
reservations are told about, so a job's memory is measured one way.

Without a job group a tree's footprint is the sum of its processes'
resident anonymous memory (psutil: resident less file-backed and shared
pages).  File pages are left out because the kernel can give them back, as
"used" leaves out the file cache; shared pages because they would be
counted once per process that maps them.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import psutil

from roomkeeper.kernel.proc import ProcStat, recent_scan

log = logging.getLogger("roomkeeper")

SAMPLE_SECONDS = 0.1  # the pressure monitor's rate: at most 100 ms


class PeakMethod(enum.Enum):
    """How a job's peak memory was taken: every peak says so."""

    # The kernel's high-water mark of the job's v2 group (Linux 5.19): it
    # misses no spike, and counts the file cache the job wrote.
    KERNEL = "memory.peak"
    # The job's v1 group, sampled: usage less file cache (v1's own mark,
    # memory.max_usage_in_bytes, counts the cache).
    SAMPLED_CGROUP = "sampled cgroup"
    # No job group: the tree's processes, sampled and summed (psutil).
    SAMPLED = "sampled"


@dataclass(frozen=True, slots=True)
class MemoryPeak:
    """The highest memory a job's tree held, and how that was taken."""

    bytes: int
    method: PeakMethod

    def describe(self) -> str:
        """The method in words, as the batch summary shows it."""
        return self.method.value


class Sampled(Protocol):
    """A running tree the sampler visits."""

    @property
    def needs_process_table(self) -> bool:
        """Whether its sample needs the machine's process table (no job group)."""
        ...

    def sample(self, table: dict[int, ProcStat] | None) -> bool:
        """Take one sample; False once the tree needs no more (it ended or was closed)."""
        ...


def tree_footprint(processes: Iterable[psutil.Process]) -> int:
    """Resident anonymous memory of ``processes``, summed; those that vanished count 0."""
    total = 0
    for proc in processes:
        try:
            info = proc.memory_info()
        except psutil.Error:
            continue
        # On Linux rss and shared come from /proc/<pid>/statm: shared is the
        # file-backed and shmem part of rss.
        total += max(0, info.rss - getattr(info, "shared", 0))
    return total


class PeakSampler:
    """Samples every registered tree every :data:`SAMPLE_SECONDS` on one daemon thread.

    The thread starts with the first tree and ends when none is left.
    Thread-safe.
    """

    def __init__(self, *, interval: float = SAMPLE_SECONDS) -> None:
        self._interval = interval
        self._lock = threading.Lock()
        self._trees: list[Sampled] = []
        self._thread: threading.Thread | None = None

    def add(self, tree: Sampled) -> None:
        """Sample ``tree`` from now on, until its :meth:`Sampled.sample` says it is done."""
        with self._lock:
            self._trees.append(tree)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="roomkeeper-peaks", daemon=True
                )
                self._thread.start()

    def discard(self, tree: Sampled) -> None:
        """Stop sampling ``tree``; unknown trees are ignored."""
        with self._lock:
            if tree in self._trees:
                self._trees.remove(tree)

    def sampling(self) -> int:
        """How many trees are sampled now."""
        with self._lock:
            return len(self._trees)

    def _run(self) -> None:
        while True:
            with self._lock:
                trees = list(self._trees)
                if not trees:
                    self._thread = None
                    return
            started = time.monotonic()
            # One /proc walk serves every tree without a group (another sampler's walk of
            # this moment too); the monitor's readings measure the members it found.
            table = recent_scan() if any(t.needs_process_table for t in trees) else None
            for tree in trees:
                try:
                    keep = tree.sample(table)
                except Exception:  # one broken tree must not end every other's sampling
                    log.exception("sampling a job's memory failed; its peak is no longer sampled")
                    keep = False
                if not keep:
                    self.discard(tree)
            time.sleep(max(0.0, self._interval - (time.monotonic() - started)))


sampler = PeakSampler()  # the process's one sampler

"""Learned sizes: the key a job's peaks are kept under, and what keeps them.

When a job states no memory estimate, roomkeeper uses what past runs of the
same kind peaked at.  The kind is the job's explicit ``kind`` when
it has one, else a SHA-256 of its argv, its working directory and whether
it is shell text: two runs of the same command in the same place are the
same kind, and the key says nothing of the command (no command text is ever
stored for learning).  The statistic is the maximum of the last
:data:`LAST_RUNS` peaks: robust to a run stopped early, quick to follow a
job that grew.

*Command shapes* (:mod:`roomkeeper.jobs.shapes`): lines that run the same
program and script with other arguments are different kinds, yet alike more
often than not.  Each run that ended by itself also keeps its peak under its
shape (:func:`shape_key`), and a job with nothing stated or learned of its
own is told its shape's typical peak, the median of the shape's last runs
(:func:`typical_size`).  That figure stays a guess: it sizes only the job's
trial (:mod:`roomkeeper.guard.packing`), never what it reserves, so a shape
whose lines differ costs a pause, and the next run of the shape corrects it.

The journal keeps the peaks (``roomkeeper.journal.sizes``); this package
only names the keys and what it needs of the keeper, so ``batch`` and the
gateway learn the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from roomkeeper.guard.packing import MemoryPolicy, typical_peak
from roomkeeper.jobs.shapes import command_shape, shell_shape
from roomkeeper.jobs.spec import JobSpec

LAST_RUNS = 5  # peaks kept per key; the learned size is their maximum
KIND_PREFIX = "kind:"
HASH_PREFIX = "sha256:"
SHAPE_PREFIX = "shape:"


def size_key(spec: JobSpec) -> str:
    """The key ``spec``'s peaks are learned under: its kind, else a hash of argv and cwd.

    A job without a ``cwd`` runs in this process's own directory, which is
    what is hashed.
    """
    if spec.kind is not None:
        return KIND_PREFIX + spec.kind
    what = {"argv": list(spec.argv), "cwd": spec.cwd or os.getcwd(), "shell": spec.shell}
    text = json.dumps(what, sort_keys=True, ensure_ascii=False)
    return HASH_PREFIX + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def spec_shape(spec: JobSpec) -> tuple[str, ...] | None:
    """The command shape of ``spec`` (:mod:`roomkeeper.jobs.shapes`); None for a job with a
    ``kind`` of its own (the kind groups it already) or where no shape can be told."""
    if spec.kind is not None:
        return None
    return shell_shape(spec.argv[0]) if spec.shell else command_shape(spec.argv)


def shape_key(spec: JobSpec) -> str | None:
    """The key the peaks of ``spec``'s command shape are kept under, with its working
    directory (the same program in another tree is other work); None without a shape."""
    shape = spec_shape(spec)
    if shape is None:
        return None
    what = {"shape": list(shape), "cwd": spec.cwd or os.getcwd(), "shell": spec.shell}
    text = json.dumps(what, sort_keys=True, ensure_ascii=False)
    return SHAPE_PREFIX + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def typical_size(peaks: Sequence[int]) -> int | None:
    """The median of a shape's last runs' ``peaks``, as the guard's typical peak is taken
    (:func:`~roomkeeper.guard.packing.typical_peak`); None while too few are kept."""
    return typical_peak(peaks, None)


def sized_by_shape(spec: JobSpec) -> bool:
    """Whether ``spec`` would be told its shape's typical peak: nothing of its own is stated
    or learned, and it may start on trial (``pack``), the only thing that figure sizes."""
    return spec.memory_estimate is None and spec.memory_policy is MemoryPolicy.PACK


def with_shape_size(spec: JobSpec, typical: int | None) -> JobSpec:
    """``spec`` with its shape's typical peak, where :func:`sized_by_shape`."""
    if typical is None or not sized_by_shape(spec):
        return spec
    return replace(spec, shape_bytes=typical)


def with_learned_size(spec: JobSpec, learned: int | None, line: int | None) -> JobSpec:
    """``spec`` with its kind's learned size, when it states none of its own.

    A learned size above the guard's memory line (``line``; None or 0 while
    it is unknown) is asked for at the line: a past run held that much and
    ran, so it is no reason to refuse the job as one that can never fit.
    """
    if spec.memory_bytes is not None or learned is None:
        return spec
    if line is not None and line > 0:
        learned = min(learned, line)
    return replace(spec, learned_bytes=learned)


LEASE_RUNS_TRUSTED = 3
"""Runs of a kind kept before its leases are sized from them, not from the stated default."""
LEAST_RUN_BYTES = 16 << 20
"""A run smaller than this sizes no lease: noise, or memory its work never gave back."""


def lease_size(peaks: list[int], line: int | None = None) -> int | None:
    """The size a lease of a kind is reserved at, from the kind's last runs; None while
    fewer than :data:`LEASE_RUNS_TRUSTED` of at least :data:`LEAST_RUN_BYTES` are kept.

    Nothing can pause a lease's work (it runs in processes roomkeeper did not start), so
    its size must cover the kind's largest run, not the largest seen: the most of the
    runs plus the mean gap between them, ``max + (max - min) / (n - 1)`` (for runs spread
    evenly over a range, the unbiased guess of the range's top).  A job's size needs no such
    margin: the ladder can pause one that outgrows it.

    Above the guard's ``line`` (when known) it is the most of the runs, at most the line:
    a run held that much and ran, and a margin that alone made it never fit would hold
    every lease of the kind back for good.
    """
    runs = [peak for peak in peaks if peak >= LEAST_RUN_BYTES]
    if len(runs) < LEASE_RUNS_TRUSTED:
        return None
    most, least = max(runs), min(runs)
    size = most + (most - least) // (len(runs) - 1)
    if line is not None and line > 0 and size > line:
        return min(most, line)
    return size


class SizeBook(Protocol):
    """What keeps learned sizes (the journal's ``record_peaks`` and ``recent_peaks``)."""

    def record_peaks(self, peaks: Sequence[tuple[str, int]]) -> object:
        """Keep ended runs' peaks, ``(key, bytes)`` oldest first (durable once its future
        resolves)."""
        ...

    def recent_peaks(self, key: str) -> list[int]:
        """The last :data:`LAST_RUNS` peaks under ``key``, newest first."""
        ...


WRITE_EVERY_S = 0.5
"""A run's peaks are written together once the first of them has waited this long."""


class KeptSizes:
    """A run's view of a :class:`SizeBook`: each key's last peaks read once, then kept in step
    with the peaks this run records, so a batch of a thousand lines of one kind reads the
    journal once for them, not once a line.

    What it records is written in one go (:meth:`write`; :meth:`write_due` once the first
    unwritten peak is :data:`WRITE_EVERY_S` old), and only each key's last
    :data:`LAST_RUNS`, the only ones kept: a batch of short lines ends hundreds a second,
    and two transactions a line (its key's and its shape's) slowed the scheduler that
    starts them.  A run killed abruptly loses the peaks of about its last half second (a
    hint lost, never a job).  Peaks another process records meanwhile under the same key
    are seen by the next run.

    Args:
        clock: monotonic seconds, for when the unwritten peaks are due.
    """

    def __init__(self, book: SizeBook, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._book = book
        self._clock = clock
        self._peaks: dict[str, deque[int]] = {}
        self._unwritten: dict[str, deque[int]] = {}  # oldest first, each key's last few
        self._unwritten_since: float | None = None

    def learned_size(self, key: str) -> int | None:
        """The maximum of the last :data:`LAST_RUNS` peaks under ``key``, or None."""
        peaks = self._kept(key)
        return max(peaks) if peaks else None

    def typical_size(self, key: str) -> int | None:
        """The median of the last :data:`LAST_RUNS` peaks under ``key`` (a shape's), or None
        while too few are kept (:func:`typical_size`)."""
        return typical_size(self._kept(key))

    def _kept(self, key: str) -> deque[int]:
        peaks = self._peaks.get(key)
        if peaks is None:
            ours = list(reversed(self._unwritten.get(key, ())))  # newer than the book's
            recent = self._book.recent_peaks(key)[:LAST_RUNS]  # newest first
            peaks = self._peaks[key] = deque((ours + recent)[:LAST_RUNS], maxlen=LAST_RUNS)
        return peaks

    def record_peak(self, key: str, peak_bytes: int) -> None:
        """Keep one ended run's peak under ``key``, here now and in the book with the next
        write."""
        peak = max(0, int(peak_bytes))
        unwritten = self._unwritten.get(key)
        if unwritten is None:
            unwritten = self._unwritten[key] = deque(maxlen=LAST_RUNS)
        unwritten.append(peak)
        if self._unwritten_since is None:
            self._unwritten_since = self._clock()
        peaks = self._peaks.get(key)
        if peaks is not None:
            peaks.appendleft(peak)

    def write_due(self) -> object | None:
        """:meth:`write`, once the first unwritten peak is :data:`WRITE_EVERY_S` old."""
        since = self._unwritten_since
        if since is None or self._clock() - since < WRITE_EVERY_S:
            return None
        return self.write()

    def write(self) -> object | None:
        """Hand every unwritten peak to the book in one write; its future (durable once it
        resolves), or None when nothing was unwritten."""
        if not self._unwritten:
            return None
        peaks = [(key, peak) for key, kept in self._unwritten.items() for peak in kept]
        self._unwritten = {}
        self._unwritten_since = None
        return self._book.record_peaks(peaks)

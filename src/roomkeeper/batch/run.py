"""``roomkeeper batch``: a memory-aware ``parallel`` that reads the container's real limit.

Each non-empty line is one command, run with ``/bin/sh -c``.  The whole
batch is one owner, so the per-owner caps do not apply, and lines are fed
to the scheduler as room frees, so a file of any length never meets the
waiting bound.  Needs no server.

Every line is restartable, as GNU parallel treats its lines: when the
relief ladder stops one for memory pressure it runs again with an
estimate grown from its run (:mod:`roomkeeper.jobs.reruns`; at most
ROOMKEEPER_PRESSURE_RETRIES times).
Each suspension and stop is printed as it happens, one line above the
progress bar, and counted in the summary.

With ``--worktree REPO`` each line runs in its own git worktree of REPO, on
the branch ``roomkeeper/batch-<run>-<line>`` (:class:`BatchWorktrees`); the
registry of those worktrees is a journal in ROOMKEEPER_HOME, which the caller
(the ``batch`` command) opens and hands over as callables.

Packing and learned sizes: every line runs under the ``pack``
memory policy unless the caller asks for ``strict``, and a batch without
``--job-memory`` asks for each line what past runs of its kind peaked at
(the highest of the last five).  A line's kind is the batch's ``--kind``,
or its own, written as a shell comment at its end (``make test
#kind=unit-tests``: the shell ignores it, so the file still runs under
``parallel``), or else a hash of the line and the directory.  A line of no
kind that nothing was learned of is expected to grow, on trial, to what
lines of its command shape typically peaked at (the same program and
script with other arguments, in this batch or an earlier one).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from roomkeeper.config import QueueSettings, read_batch_cpu_settings
from roomkeeper.errors import UsageError
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.jobs.queue import Limits, batch_limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerListeners, SchedulerParts, SchedulerSettings
from roomkeeper.jobs.sizes import (
    KeptSizes,
    SizeBook,
    shape_key,
    size_key,
    sized_by_shape,
    with_learned_size,
    with_shape_size,
)
from roomkeeper.jobs.spec import EstimateSource, JobSpec, JobState, JobView, validate_kind
from roomkeeper.jobserver.meter import JobserverStatistics
from roomkeeper.processes.peaks import PeakMethod
from roomkeeper.relief.ladder import PressureReason
from roomkeeper.relief.monitor import MonitorStatistics
from roomkeeper.units import format_bytes, format_gb
from roomkeeper.worktrees.request import WorktreeRequest
from roomkeeper.worktrees.service import BRANCH_PREFIX, Worktrees

STOP_GRACE_ON_INTERRUPT = 2.0
SHOW_EVERY_S = 0.1  # the counts shown are at most this old (the last ones always shown)
# Lines submitted ahead of their start, at most: enough for one round to start several, few
# enough that a line is sized (its learned size read) close to when it starts.
LINES_READY = 8
# A batch given no count runs as many lines as memory and the cores allow, at most this many.
# Lines of unknown size that grow for a minute look small to a few seconds' forecast: with no
# bound, twenty agent turns of 0.85 GB started at once in a 6 GiB group and the relief ladder
# then suspended and stopped them over and over (a run three times as long as 7 at once).
UNCOUNTED_MAX_RUNNING = 8
# A line's own kind: a shell comment at its very end, "#kind=NAME" (or "# kind=NAME").
_LINE_KIND = re.compile(r"(?:^|\s)#\s*kind=(\S*)\s*$")


@dataclass(frozen=True, slots=True)
class BatchResult:
    """How one line ended."""

    line: int
    command: str
    state: JobState
    exit_code: int | None
    wall_seconds: float
    peak_bytes: int | None
    log_path: str
    peak_method: PeakMethod | None = None  # how peak_bytes was taken
    estimate_bytes: int | None = None  # the memory estimate it was admitted with
    estimate_source: EstimateSource = EstimateSource.DEFAULT
    jobserver: JobserverStatistics | None = None  # its jobserver's last round, when it had one
    shape_bytes: int | None = None  # its command shape's typical peak, which sized its trial

    @property
    def succeeded(self) -> bool:
        """Exited by itself with status 0."""
        return self.state is JobState.EXITED and self.exit_code == 0


def tokens_text(pool: JobserverStatistics) -> str:
    """A line's jobserver in a few words: tokens out, the step estimate, why no more."""
    return (
        f"{pool.tokens_out} token(s) out, step {format_gb(pool.step_bytes)} "
        f"({pool.step_source.value}), {pool.summary}"
    )


def read_commands(lines: Sequence[str]) -> list[str]:
    """The non-empty lines, without their line ends (each is shell text)."""
    return [line.rstrip("\r\n") for line in lines if line.strip()]


def line_kind(command: str, number: int) -> str | None:
    """The kind a batch line names at its end (``... #kind=NAME``), or None.

    Raises:
        UsageError: the line ends in ``#kind=`` with no valid name; the message
            gives the line's number and the way to write one.
    """
    found = _LINE_KIND.search(command)
    if found is None:
        return None
    try:
        return validate_kind(found.group(1))
    except UsageError as err:
        raise UsageError(
            f"line {number}: {err}; write it at the end of the line, as in "
            "'make test #kind=unit-tests'",
            name="kind",
        ) from None


def line_kinds(commands: Sequence[str], default: str | None) -> list[str | None]:
    """Each line's kind: its own, else ``default`` (every line is checked before any runs)."""
    return [line_kind(c, i + 1) or default for i, c in enumerate(commands)]


class BatchReporter(Protocol):
    """Where a batch tells a person what happens: each job's output, events, counts.

    The ``roomkeeper batch`` command gives a progress bar
    (:class:`roomkeeper.cli.batch_view.BatchProgress`); ``pressure`` is set to
    the pressure monitor's counts once the batch has ended.
    """

    pressure: MonitorStatistics | None

    def output(self, data: bytes) -> None:
        """Print one job's output, unaltered."""

    def note(self, text: str) -> None:
        """Say one thing that happened (a suspension, a stop)."""

    def update(self, *, done: int, running: int, waiting: int, reason: str) -> None:
        """Show counts and the guard's current reason."""


@dataclass(frozen=True, slots=True)
class BatchWorktrees:
    """One git worktree per line, and where the worktrees are registered.

    Attributes:
        repo: the repository every line gets a tree of.
        run_id: this run's name, in every branch (``roomkeeper/batch-<run>-<line>``).
        service: makes the worktrees and prunes finished ones.
        register: saves a line's tree as its own before the line starts (durable on return).
        follow: records each change of a line's state against its tree.
    """

    repo: str
    run_id: str
    service: Worktrees
    register: Callable[[JobView], None]
    follow: Callable[[JobView], None]

    def request(self, line: int) -> WorktreeRequest:
        """The tree line ``line`` (1-based) asks for."""
        return WorktreeRequest(self.repo, f"{BRANCH_PREFIX}batch-{self.run_id}-{line}")


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How a batch sizes its lines.

    Attributes:
        policy: the memory policy every line runs under (``pack`` unless ``--strict``).
        kinds: each line's kind (None: a hash of the line and the directory).
        sizes: where learned sizes are read and each line's peak is kept; None learns nothing.
        jobserver: every line runs with a jobserver of its own (``--jobserver``).
    """

    policy: MemoryPolicy = MemoryPolicy.PACK
    kinds: Sequence[str | None] = ()
    sizes: SizeBook | None = None
    jobserver: bool = False


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How one batch runs its lines: the command's options, read once, passed whole.

    Attributes:
        logs_dir: where each line's output goes (``N.log``).
        max_running: how many lines run at once at most.
        job_memory: each line's memory estimate; None: its learned size or the default.
        timeout_s: each line's deadline in seconds; None: none.
        quiet: keep each line's output in its log only, printing none of it.
        options: how the lines are sized (policy, kinds, learned sizes).
        until_cores_free: hold the next line while the running ones keep every core busy
            (:mod:`roomkeeper.jobs.cores`): a batch given no count of its own.
    """

    logs_dir: Path
    max_running: int = QueueSettings().max_running
    job_memory: int | None = None
    timeout_s: float | None = None
    quiet: bool = False
    options: BatchOptions = field(default_factory=BatchOptions)
    until_cores_free: bool = False


def run_batch(
    commands: Sequence[str],
    settings: BatchSettings,
    *,
    progress: BatchReporter,
    guard: Guard | None = None,
    scheduler_factory: Callable[..., Scheduler] = Scheduler,
    worktrees: BatchWorktrees | None = None,
) -> list[BatchResult]:
    """Run every command as memory allows, print each job's output as it ends.

    Ctrl-C (KeyboardInterrupt) stops every running tree before it propagates.
    With ``worktrees``, each line runs in its own git worktree.
    """
    guard = guard if guard is not None else Guard()
    _clear_old_logs(settings.logs_dir, len(commands))
    events: queue.Queue[JobView] = queue.Queue()
    parts = SchedulerParts(guard=guard)
    listeners = SchedulerListeners(on_change=events.put)
    if worktrees is not None:

        def changed(view: JobView) -> None:
            worktrees.follow(view)
            events.put(view)

        parts = replace(
            parts, prepare=worktrees.service.prepare, reclaim_disk=worktrees.service.reclaim
        )
        listeners = SchedulerListeners(on_change=changed, before_launch=worktrees.register)
    scheduler = scheduler_factory(
        SchedulerSettings(logs_dir=settings.logs_dir, limits=lambda: _limits(settings)),
        parts=parts,
        listeners=listeners,
    )
    run = _BatchRun(
        commands, scheduler, events, settings, progress=progress, guard=guard, worktrees=worktrees
    )
    # The handler stays while the trees are stopped: a second Ctrl-C then exits at once.
    with _interrupts() as interrupted:
        try:
            scheduler.start()
            while not run.done and not interrupted.is_set():
                run.feed()
                run.collect()
                run.show()
                run.write_sizes(due_only=True)
            if interrupted.is_set():
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            run.write_sizes()  # before the stop's wait, which a second Ctrl-C cuts short
            scheduler.close(grace=STOP_GRACE_ON_INTERRUPT)
            run.collect_rest()
            raise
        finally:
            # Handed over before and after closing: closing may raise, or bring last ends.
            run.write_sizes()  # the journal's close waits for both to be durable
            scheduler.close(grace=STOP_GRACE_ON_INTERRUPT)
            progress.pressure = scheduler.pressure_statistics()
            run.write_sizes()
    if interrupted.is_set():  # Ctrl-C while the last trees were being closed: still 130
        raise KeyboardInterrupt
    return run.results()


@contextlib.contextmanager
def _interrupts() -> Iterator[threading.Event]:
    """Ctrl-C as an event the batch's loop looks at, not an exception raised anywhere.

    A KeyboardInterrupt can land inside a lock's ``with`` or a join and leave
    the scheduler unable to close; so the first SIGINT only sets the event (the
    loop sees it within its 0.2 s wait, and closing has its own deadline), and a
    second one exits at once with 130 (each tree's lifeline kills it when we go).
    Outside the main thread no handler can be set: KeyboardInterrupt stays as it is.
    """
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if interrupted.is_set():
            os.write(2, b"roomkeeper batch: interrupted again; exiting now\n")
            os._exit(130)
        interrupted.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _clear_old_logs(logs_dir: Path, lines: int) -> None:
    """Empty an earlier batch's ``N.log`` for each of this batch's lines.

    Logs are opened for appending (a line run again after a stop keeps its
    first attempt's output), so a ``--logs DIR`` used before would otherwise
    print the earlier batch's output as this one's.  Like ``parallel
    --results``, a new run of line N replaces line N's log.

    A log of ours (a plain file we own, with no other name) is emptied, not
    removed: removing and creating an inode per line is the dearer path on
    file systems that delay reusing freed inodes (ext4 without a journal took
    about 1 ms a line).  Anything else by that name (a link, a pipe, a file
    linked elsewhere or someone else's) is removed, never followed or emptied.
    Two batches given one ``--logs`` at once write into each other's logs.

    Raises:
        UsageError: an ``N.log`` could not be removed (a folder by that name, no
            write access to the folder); nothing has started.
    """
    for line in range(1, lines + 1):
        path = logs_dir / f"{line}.log"
        try:
            facts = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise _unusable_log(path, err) from err
        if not _emptied_in_place(path, facts):
            _remove_log(path)


def _emptied_in_place(path: Path, facts: os.stat_result) -> bool:
    """Truncate ``path`` when it is a plain file of ours with no other name (``facts``, its
    ``lstat``) and still the same file once open; whether it was."""
    if not (stat.S_ISREG(facts.st_mode) and facts.st_nlink == 1 and facts.st_uid == os.geteuid()):
        return False
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:  # gone, replaced meanwhile, or not writable: removed instead
        return False
    try:
        if not os.path.samestat(os.fstat(fd), facts):
            return False
        os.ftruncate(fd, 0)
        return True
    finally:
        os.close(fd)


def _remove_log(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as err:
        raise _unusable_log(path, err) from err


def _unusable_log(path: Path, err: OSError) -> UsageError:
    return UsageError(
        f"cannot replace the old log {str(path)!r}: {err.strerror}; remove it, or give "
        "another folder with --logs DIR",
        name="--logs",
        value=str(path.parent),
    )


def _limits(settings: BatchSettings) -> Limits:
    nice, cpu_percent = read_batch_cpu_settings()  # the gateway's two defaults do not apply
    return batch_limits(settings.max_running, nice, cpu_percent, settings.until_cores_free)


class _BatchRun:
    """One batch under way: the lines fed so far, and how each one that ended ended."""

    def __init__(
        self,
        commands: Sequence[str],
        scheduler: Scheduler,
        events: queue.Queue[JobView],
        settings: BatchSettings,
        *,
        progress: BatchReporter,
        guard: Guard,
        worktrees: BatchWorktrees | None = None,
    ) -> None:
        self._worktrees = worktrees
        self._commands = commands
        self._settings = settings
        self._options = settings.options
        self._guard = guard
        # Each submitted line's learned-size key and command-shape key (if any).
        self._keys: dict[str, tuple[str, str | None]] = {}
        # Both keys of each text and kind seen: a batch repeats lines, and a shape's parse
        # costs tens of microseconds a short line (about 1 ms for 4 KB of text).
        self._keys_of: dict[tuple[str, str | None], tuple[str, str | None]] = {}
        book = settings.options.sizes
        self._sizes = KeptSizes(book) if book is not None else None
        self._line: int | None = None  # the guard's memory line, read once for learned sizes
        self._scheduler = scheduler
        self._events = events
        self._progress = progress
        self._results: dict[str, BatchResult] = {}
        self._next_line = 0  # index of the first line not yet submitted
        self._tokens: dict[str, JobserverStatistics] = {}  # each line's jobserver, last seen
        self._shown_at = -SHOW_EVERY_S  # when the counts were last shown (monotonic)

    @property
    def done(self) -> bool:
        """Whether every line has ended."""
        return len(self._results) >= len(self._commands)

    def feed(self) -> None:
        """Submit lines as room frees: keep a few lines ready, never the whole file."""
        waiting = self._scheduler.waiting()
        ready = max(2, min(self._settings.max_running, LINES_READY))
        while self._next_line < len(self._commands) and waiting < ready:
            job_id = str(self._next_line + 1)
            self._scheduler.submit(self._spec(self._next_line, job_id), job_id=job_id)
            self._next_line += 1
            waiting += 1

    def _spec(self, index: int, job_id: str) -> JobSpec:
        """Line ``index``'s job: its kind, the batch's policy, and its learned size if any."""
        kinds = self._options.kinds
        spec = JobSpec(
            argv=[self._commands[index]],
            owner="batch",
            memory_bytes=self._settings.job_memory,
            timeout_s=self._settings.timeout_s,
            shell=True,
            memory_policy=self._options.policy,
            kind=kinds[index] if index < len(kinds) else None,
            worktree=self._worktrees.request(index + 1) if self._worktrees else None,
            restartable=True,  # as GNU parallel treats its lines
            jobserver=self._options.jobserver,
        )
        sizes = self._sizes
        if sizes is None:
            return spec
        # Kept whatever sizes the line: each run tells of its kind and its shape.
        key, shape = self._keys[job_id] = self._keys_of.get(
            (spec.argv[0], spec.kind)
        ) or self._both_keys(spec)
        if spec.memory_bytes is not None:
            return spec
        learned = sizes.learned_size(key)
        if learned is not None or shape is None or not sized_by_shape(spec):
            return with_learned_size(spec, learned, self._memory_line() if learned else None)
        return with_shape_size(spec, sizes.typical_size(shape))

    def _both_keys(self, spec: JobSpec) -> tuple[str, str | None]:
        """``spec``'s learned-size key and command-shape key, kept for its text and kind."""
        keys = self._keys_of[(spec.argv[0], spec.kind)] = (size_key(spec), shape_key(spec))
        return keys

    def _memory_line(self) -> int | None:
        """The guard's memory line, read once per batch (None while it is unknown)."""
        if self._line is None:
            self._line = self._guard.check(memory_bytes=0).memory_line_bytes
        return self._line

    def write_sizes(self, *, due_only: bool = False) -> None:
        """Hand the peaks learned since the last write to the journal (``due_only``: only
        once the oldest of them waited :data:`~roomkeeper.jobs.sizes.WRITE_EVERY_S`)."""
        if self._sizes is None:
            return
        if due_only:
            self._sizes.write_due()
        else:
            self._sizes.write()

    def collect(self) -> None:
        """Wait a little for a change, then record every job that ended."""
        with contextlib.suppress(queue.Empty):
            self._record(self._events.get(timeout=0.2))

    def collect_rest(self) -> None:
        """Record what already ended, without waiting (after an interrupt)."""
        while not self._events.empty():
            self._record(self._events.get())

    def show(self) -> None:
        """Show counts and the guard's current reason; lines not yet fed count as waiting.

        At most every :data:`SHOW_EVERY_S`, and at the end: a batch of short lines ends
        hundreds a second, and counting them all for each would slow the scheduler that
        runs them (its lock) more than anyone could read the counts.
        """
        pools = self._scheduler.jobserver_statistics()
        self._tokens.update(pools)  # every time: a line's pool is gone once it ends
        now = time.monotonic()
        if now - self._shown_at < SHOW_EVERY_S and not self.done:
            return
        self._shown_at = now
        stats = self._scheduler.statistics()
        reason = stats.waiting_reason.value if stats.waiting_reason else "ok"
        if pools:
            reason += "; " + "; ".join(f"line {j}: {tokens_text(p)}" for j, p in pools.items())
        self._progress.update(
            done=len(self._results),
            running=stats.running,
            waiting=stats.waiting + len(self._commands) - self._next_line,
            reason=reason,
        )

    def results(self) -> list[BatchResult]:
        """How each line that ended ended, in line order."""
        ended = (str(i + 1) for i in range(len(self._commands)))
        return [self._results[job_id] for job_id in ended if job_id in self._results]

    def _record(self, view: JobView) -> None:
        """Record ``view`` and every change already queued behind it; print what ended."""
        pending = [view]
        while True:
            try:
                pending.append(self._events.get_nowait())
            except queue.Empty:
                break
        for v in pending:
            self._say_relief(v)
            if not v.state.final or v.id in self._results:
                continue
            wall = (v.ended_at - v.started_at) if v.ended_at and v.started_at else 0.0
            self._results[v.id] = BatchResult(
                line=int(v.id),
                command=self._commands[int(v.id) - 1],
                state=v.state,
                exit_code=v.exit_code,
                wall_seconds=wall,
                peak_bytes=v.peak_bytes,
                log_path=v.log_path,
                peak_method=v.peak_method,
                estimate_bytes=v.estimate_bytes,
                estimate_source=v.estimate_source,
                jobserver=self._tokens.pop(v.id, None),
                shape_bytes=v.spec.shape_bytes,
            )
            self._learn(v)
            if not self._settings.quiet:
                with contextlib.suppress(OSError):
                    self._progress.output(Path(v.log_path).read_bytes())

    def _say_relief(self, view: JobView) -> None:
        """One line for each suspension, resume and stop of the relief ladder, as it happens."""
        previous = view.history[-2].state if len(view.history) > 1 else None
        resumed = view.state is JobState.RUNNING and previous is JobState.SUSPENDED
        if (
            view.reason not in (PressureReason.MEMORY_PRESSURE, PressureReason.ON_TRIAL)
            and not resumed
        ):
            return
        line = f"roomkeeper batch: line {view.id}"
        if view.state is JobState.SUSPENDED and view.reason is PressureReason.ON_TRIAL:
            self._progress.note(f"{line} paused on trial: older lines' growth needs the room")
        elif view.state is JobState.SUSPENDED:
            self._progress.note(f"{line} suspended for memory pressure (nothing lost)")
        elif resumed:
            self._progress.note(f"{line} resumed")
        elif view.state is JobState.WAITING and view.reason is PressureReason.MEMORY_PRESSURE:
            peak = format_bytes(view.peak_bytes) if view.peak_bytes is not None else "unknown"
            estimate = (  # the re-run's, grown from the stopped run
                format_bytes(view.estimate_bytes) if view.estimate_bytes is not None else "unknown"
            )
            self._progress.note(
                f"{line} stopped for memory pressure (output kept); it runs again with an "
                f"estimate of {estimate} (its peak: {peak})"
            )
        elif view.state is JobState.STOPPED and view.reason is PressureReason.MEMORY_PRESSURE:
            why = view.error or "it has no runs left"
            self._progress.note(f"{line} stopped for memory pressure (output kept): {why}")

    def _learn(self, view: JobView) -> None:
        """Keep an ended line's peak under its key, and under its shape's once it ran to its
        own end, for the next batch (and the next line)."""
        keys = self._keys.pop(view.id, None)
        if self._sizes is None or keys is None or view.peak_bytes is None:
            return
        key, shape = keys
        self._sizes.record_peak(key, view.peak_bytes)
        if shape is not None and view.state is JobState.EXITED:  # what a run cut short held
            self._sizes.record_peak(shape, view.peak_bytes)  # would pull the median down


def default_logs_dir(home: Path) -> Path:
    """A fresh folder for one batch's logs under ROOMKEEPER_HOME/batch/."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return home / "batch" / f"{stamp}-{os.getpid()}"

"""``roomkeeper batch``: a memory-aware ``parallel`` that reads the container's real limit.

Each non-empty line is one command, run with ``/bin/sh -c``.  The whole
batch is one owner, so the per-owner caps do not apply, and lines are fed
to the scheduler as room frees, so a file of any length never meets the
waiting bound.  Needs no server.

Every line is restartable, as GNU parallel treats its lines: when the
relief ladder stops one for memory pressure it runs again with its
observed peak as its estimate (at most ROOMKEEPER_PRESSURE_RETRIES times).
Each suspension and stop is printed as it happens, one line above the
progress bar, and counted in the summary.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from roomkeeper.config import read_queue_settings
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.rule import Reason
from roomkeeper.jobs.monitor import MonitorStatistics
from roomkeeper.jobs.queue import Limits, batch_limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.spec import JobSpec, JobState, JobView, PeakMethod
from roomkeeper.units import format_bytes

STOP_GRACE_ON_INTERRUPT = 2.0


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

    @property
    def succeeded(self) -> bool:
        """Exited by itself with status 0."""
        return self.state is JobState.EXITED and self.exit_code == 0


def read_commands(lines: Sequence[str]) -> list[str]:
    """The non-empty lines, without their line ends (each is shell text)."""
    return [line.rstrip("\r\n") for line in lines if line.strip()]


class BatchProgress:
    """Progress for a person: a bar on a terminal, plain lines on stderr otherwise."""

    def __init__(self, total: int, *, console: Console, on_terminal: bool, out: BinaryIO) -> None:
        self._total = total
        self._console = console
        self._out = out
        self._done = 0
        self.pressure: MonitorStatistics | None = None  # the monitor's counts, once it ended
        self._bar: Progress | None = None
        if on_terminal:
            self._bar = Progress(
                TextColumn("[bold]roomkeeper batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task("batch", total=total, status="")

    def __enter__(self) -> BatchProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def output(self, data: bytes) -> None:
        """Print one job's output, unaltered, above the bar."""
        if not data:
            return
        if self._bar is not None:
            # Take the bar down, write the bytes as they are, put the bar back below.
            self._bar.stop()
            self._out.write(data)
            self._out.flush()
            self._bar.start()
        else:
            self._out.write(data)
            self._out.flush()

    def note(self, text: str) -> None:
        """Say one thing that happened (a suspension, a stop) on its own line above the bar."""
        if self._bar is not None:
            self._console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def update(self, *, done: int, running: int, waiting: int, reason: str) -> None:
        """Show counts and the guard's current reason."""
        status = f"running {running}, waiting {waiting}, guard: {reason}"
        if self._bar is not None:
            self._bar.update(self._task, completed=done, status=status)
        elif done != self._done:
            print(f"roomkeeper batch: {done}/{self._total} done, {status}", file=sys.stderr)
        self._done = done


def run_batch(
    commands: Sequence[str],
    *,
    logs_dir: Path,
    job_memory: int | None,
    max_running: int,
    timeout_s: float | None,
    quiet: bool,
    progress: BatchProgress,
    guard: Guard | None = None,
    scheduler_factory: Callable[..., Scheduler] = Scheduler,
) -> list[BatchResult]:
    """Run every command as memory allows, print each job's output as it ends.

    Ctrl-C (KeyboardInterrupt) stops every running tree before it propagates.
    """
    events: queue.Queue[JobView] = queue.Queue()
    scheduler = scheduler_factory(
        logs_dir=logs_dir,
        guard=guard,
        limits=lambda: _limits(max_running),
        on_change=events.put,
    )
    run = _BatchRun(
        commands,
        scheduler,
        events,
        job_memory=job_memory,
        max_running=max_running,
        timeout_s=timeout_s,
        quiet=quiet,
        progress=progress,
    )
    try:
        scheduler.start()
        while not run.done:
            run.feed()
            run.collect()
            run.show()
    except KeyboardInterrupt:
        scheduler.close(grace=STOP_GRACE_ON_INTERRUPT)
        run.collect_rest()
        raise
    finally:
        scheduler.close(grace=STOP_GRACE_ON_INTERRUPT)
        progress.pressure = scheduler.pressure_statistics()
    return run.results()


def _limits(max_running: int) -> Limits:
    settings = read_queue_settings()  # nice and CPU pressure still follow the variables
    return batch_limits(max_running, settings.worker_nice, settings.cpu_pressure_percent)


class _BatchRun:
    """One batch under way: the lines fed so far, and how each one that ended ended."""

    def __init__(
        self,
        commands: Sequence[str],
        scheduler: Scheduler,
        events: queue.Queue[JobView],
        *,
        job_memory: int | None,
        max_running: int,
        timeout_s: float | None,
        quiet: bool,
        progress: BatchProgress,
    ) -> None:
        self._commands = commands
        self._scheduler = scheduler
        self._events = events
        self._job_memory = job_memory
        self._max_running = max_running
        self._timeout_s = timeout_s
        self._quiet = quiet
        self._progress = progress
        self._results: dict[str, BatchResult] = {}
        self._next_line = 0  # index of the first line not yet submitted

    @property
    def done(self) -> bool:
        """Whether every line has ended."""
        return len(self._results) >= len(self._commands)

    def feed(self) -> None:
        """Submit lines as room frees: keep a few lines ready, never the whole file."""
        waiting = self._scheduler.statistics().waiting
        while self._next_line < len(self._commands) and waiting < max(2, self._max_running):
            self._scheduler.submit(
                JobSpec(
                    argv=[self._commands[self._next_line]],
                    owner="batch",
                    memory_bytes=self._job_memory,
                    timeout_s=self._timeout_s,
                    shell=True,
                    restartable=True,  # as GNU parallel treats its lines
                ),
                job_id=str(self._next_line + 1),
            )
            self._next_line += 1
            waiting += 1

    def collect(self) -> None:
        """Wait a little for a change, then record every job that ended."""
        with contextlib.suppress(queue.Empty):
            self._record(self._events.get(timeout=0.2))

    def collect_rest(self) -> None:
        """Record what already ended, without waiting (after an interrupt)."""
        while not self._events.empty():
            self._record(self._events.get())

    def show(self) -> None:
        """Show counts and the guard's current reason; lines not yet fed count as waiting."""
        stats = self._scheduler.statistics()
        self._progress.update(
            done=len(self._results),
            running=stats.running,
            waiting=stats.waiting + len(self._commands) - self._next_line,
            reason=stats.waiting_reason.value if stats.waiting_reason else "ok",
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
            )
            if not self._quiet:
                with contextlib.suppress(OSError):
                    self._progress.output(Path(v.log_path).read_bytes())

    def _say_relief(self, view: JobView) -> None:
        """One line for each suspension, resume and stop of the relief ladder, as it happens."""
        previous = view.history[-2].state if len(view.history) > 1 else None
        resumed = view.state is JobState.RUNNING and previous is JobState.SUSPENDED
        if view.reason is not Reason.MEMORY_PRESSURE and not resumed:
            return
        line = f"roomkeeper batch: line {view.id}"
        if view.state is JobState.SUSPENDED:
            self._progress.note(f"{line} suspended for memory pressure (nothing lost)")
        elif resumed:
            self._progress.note(f"{line} resumed")
        elif view.state is JobState.WAITING and view.reason is Reason.MEMORY_PRESSURE:
            peak = format_bytes(view.peak_bytes) if view.peak_bytes is not None else "unknown"
            self._progress.note(
                f"{line} stopped for memory pressure (output kept); it runs again with its "
                f"peak {peak} as its estimate"
            )
        elif view.state is JobState.STOPPED and view.reason is Reason.MEMORY_PRESSURE:
            why = view.error or "it has no runs left"
            self._progress.note(f"{line} stopped for memory pressure (output kept): {why}")


def pressure_line(stats: MonitorStatistics) -> str:
    """The relief ladder's counts and reaction times on one line (bench_swarm reads it)."""

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f} ms"

    return (
        f"memory pressure: holds {stats.holds}, suspensions {stats.suspensions}, "
        f"stops {stats.stops}, re-runs {stats.reruns}, reaction p50 "
        f"{ms(stats.reaction_p50_s)}, max {ms(stats.reaction_max_s)}"
    )


def summary_table(
    results: Sequence[BatchResult], elapsed: float, pressure: MonitorStatistics | None = None
) -> str:
    """The closing table: command, exit code, wall time, peak memory of its tree and how taken.

    Plain text, not a rich table: a batch may have thousands of lines, and
    the table must not cost more than running them did.
    """
    failed = sum(1 for r in results if not r.succeeded)
    rows = [("#", "command", "exit", "wall", "peak memory")]
    for r in results:
        exit_text = str(r.exit_code) if r.state is JobState.EXITED else r.state.value
        if r.state is not JobState.EXITED and r.exit_code is not None:
            exit_text += f" ({r.exit_code})"
        command = r.command if len(r.command) <= 60 else r.command[:59] + "…"
        peak = format_bytes(r.peak_bytes) if r.peak_bytes is not None else "-"
        if r.peak_bytes is not None and r.peak_method is not None:
            peak += f" ({r.peak_method.value})"  # memory.peak, sampled cgroup, sampled
        rows.append((str(r.line), command, exit_text, f"{r.wall_seconds:.2f} s", peak))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [f"roomkeeper batch: {len(results)} commands, {failed} failed, {elapsed:.1f} s"]
    if pressure is not None:
        lines.append(pressure_line(pressure))
    for row in rows:
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 1 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines)


def default_logs_dir(home: Path) -> Path:
    """A fresh folder for one batch's logs under ROOMKEEPER_HOME/batch/."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return home / "batch" / f"{stamp}-{os.getpid()}"

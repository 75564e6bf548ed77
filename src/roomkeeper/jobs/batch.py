"""``roomkeeper batch``: a memory-aware ``parallel`` that reads the container's real limit.

Each non-empty line is one command, run with ``/bin/sh -c``.  The whole
batch is one owner, so the per-owner caps do not apply, and lines are fed
to the scheduler as room frees, so a file of any length never meets the
waiting bound.  Needs no server.
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
from roomkeeper.jobs.queue import Limits, batch_limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
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
    results: dict[str, BatchResult] = {}
    next_line = 0
    try:
        scheduler.start()
        while len(results) < len(commands):
            waiting = scheduler.statistics().waiting
            # Feed as room frees: keep a few lines ready, never the whole file.
            while next_line < len(commands) and waiting < max(2, max_running):
                scheduler.submit(
                    JobSpec(
                        argv=[commands[next_line]],
                        owner="batch",
                        memory_bytes=job_memory,
                        timeout_s=timeout_s,
                        shell=True,
                    ),
                    job_id=str(next_line + 1),
                )
                next_line += 1
                waiting += 1
            with contextlib.suppress(queue.Empty):
                view = events.get(timeout=0.2)
                _drain(view, events, results, commands, quiet, progress)
            stats = scheduler.statistics()
            progress.update(
                done=len(results),
                running=stats.running,
                waiting=stats.waiting + len(commands) - next_line,
                reason=stats.waiting_reason.value if stats.waiting_reason else "ok",
            )
    except KeyboardInterrupt:
        scheduler.close(grace=STOP_GRACE_ON_INTERRUPT)
        while not events.empty():
            _drain(events.get(), events, results, commands, quiet, progress)
        raise
    finally:
        scheduler.close(grace=STOP_GRACE_ON_INTERRUPT)
    return [results[str(i + 1)] for i in range(len(commands)) if str(i + 1) in results]


def _limits(max_running: int) -> Limits:
    settings = read_queue_settings()  # nice and CPU pressure still follow the variables
    return batch_limits(max_running, settings.worker_nice, settings.cpu_pressure_percent)


def _drain(
    view: JobView,
    events: queue.Queue[JobView],
    results: dict[str, BatchResult],
    commands: Sequence[str],
    quiet: bool,
    progress: BatchProgress,
) -> None:
    pending = [view]
    while True:
        try:
            pending.append(events.get_nowait())
        except queue.Empty:
            break
    for v in pending:
        if not v.state.final or v.id in results:
            continue
        wall = (v.ended_at - v.started_at) if v.ended_at and v.started_at else 0.0
        results[v.id] = BatchResult(
            int(v.id), commands[int(v.id) - 1], v.state, v.exit_code, wall, v.peak_bytes, v.log_path
        )
        if not quiet:
            with contextlib.suppress(OSError):
                progress.output(Path(v.log_path).read_bytes())


def summary_table(results: Sequence[BatchResult], elapsed: float) -> str:
    """The closing table: command, exit code, wall time, peak memory of its tree.

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
        rows.append((str(r.line), command, exit_text, f"{r.wall_seconds:.2f} s", peak))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [f"roomkeeper batch: {len(results)} commands, {failed} failed, {elapsed:.1f} s"]
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

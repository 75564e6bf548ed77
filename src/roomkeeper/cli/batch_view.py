"""What ``roomkeeper batch`` shows a person: a progress bar, and the summary table at the end."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import BinaryIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from roomkeeper.batch.run import BatchResult
from roomkeeper.jobs.spec import EstimateSource, JobState
from roomkeeper.jobserver.meter import JobserverStatistics
from roomkeeper.relief.monitor import MonitorStatistics
from roomkeeper.units import format_bytes


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


def pressure_line(stats: MonitorStatistics) -> str:
    """The relief ladder's counts and reaction times on one line (bench_swarm reads it)."""

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f} ms"

    return (
        f"memory pressure: holds {stats.holds}, suspensions {stats.suspensions}, "
        f"stops {stats.stops}, re-runs {stats.reruns}, reaction p50 "
        f"{ms(stats.reaction_p50_s)}, max {ms(stats.reaction_max_s)}; "
        f"trial pauses {stats.trial_pauses}"
    )


def summary_table(
    results: Sequence[BatchResult], elapsed: float, pressure: MonitorStatistics | None = None
) -> str:
    """The closing table: command, exit code, wall time, peak memory of its tree and how taken,
    and the estimate it was admitted with and where that came from (stated, learned, default,
    re-run), with its command shape's typical peak where that sized its trial.

    Plain text, not a rich table: a batch may have thousands of lines, and
    the table must not cost more than running them did.
    """
    failed = sum(1 for r in results if not r.succeeded)
    pools = any(r.jobserver is not None for r in results)
    rows: list[tuple[str, ...]] = [
        ("#", "command", "exit", "wall", "peak memory", "estimate", *(["jobserver"] * pools))
    ]
    for r in results:
        exit_text = str(r.exit_code) if r.state is JobState.EXITED else r.state.value
        if r.state is not JobState.EXITED and r.exit_code is not None:
            exit_text += f" ({r.exit_code})"
        command = r.command if len(r.command) <= 60 else r.command[:59] + "…"
        peak = format_bytes(r.peak_bytes) if r.peak_bytes is not None else "-"
        if r.peak_bytes is not None and r.peak_method is not None:
            peak += f" ({r.peak_method.value})"  # memory.peak, sampled cgroup, sampled
        estimate = "-"
        if r.estimate_bytes is not None:
            guessed = r.shape_bytes is not None and r.estimate_source is EstimateSource.DEFAULT
            shape = f"; shape {format_bytes(r.shape_bytes or 0)}" if guessed else ""
            estimate = f"{format_bytes(r.estimate_bytes)} ({r.estimate_source.value}{shape})"
        cells = (str(r.line), command, exit_text, f"{r.wall_seconds:.2f} s", peak, estimate)
        rows.append((*cells, *([_pool_text(r.jobserver)] * pools)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"roomkeeper batch: {len(results)} commands, {failed} failed, {elapsed:.1f} s"]
    if pressure is not None:
        lines.append(pressure_line(pressure))
    for row in rows:
        lines.append(
            "  ".join(
                cell.ljust(w) if i in (1, 6) else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines)


def _pool_text(pool: JobserverStatistics | None) -> str:
    """A line's jobserver at its end: the most steps at once, the step estimate, tokens lost
    and minted again, and the last round's reason ("no_room" when the guard refused)."""
    if pool is None:
        return "-"
    text = (
        f"most {pool.most_steps} steps at once, step {format_bytes(pool.step_bytes)} "
        f"({pool.step_source.value}), {pool.minted} minted"
    )
    if pool.lost:
        text += f", {pool.lost} lost and minted again"
    if pool.unread:
        text += f", {pool.unread} unread byte(s) taken out"
    return f"{text}; last: {pool.reason.value}"

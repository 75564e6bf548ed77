"""Commands that need no gateway: ``probe`` (one reading and the guard's answer) and
``batch`` (a memory-aware ``parallel``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import click
from rich.console import Console
from rich.table import Table

from roomkeeper.batch.run import (
    UNCOUNTED_MAX_RUNNING,
    BatchOptions,
    BatchSettings,
    BatchWorktrees,
    default_logs_dir,
    line_kinds,
    read_commands,
    run_batch,
)
from roomkeeper.cli.batch_view import BatchProgress, summary_table
from roomkeeper.cli.options import parse_kind_option, parse_size_option
from roomkeeper.cli.worktrees import batch_worktrees, prune, reap
from roomkeeper.config import (
    max_running_given,
    read_batch_cpu_settings,
    read_queue_settings,
    read_settings,
)
from roomkeeper.errors import RoomkeeperError, UsageError
from roomkeeper.gateway.home import open_journal
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.guard.rule import Decision
from roomkeeper.journal.database import Journal
from roomkeeper.kernel.parsers import Pressure
from roomkeeper.kernel.resources import Resources, read_resources
from roomkeeper.paths import home_dir, writable_dir
from roomkeeper.units import format_gb, parse_duration


def _pressure_json(p: Pressure | None) -> dict[str, Any] | None:
    if p is None:
        return None
    lines = {"some": p.some, "full": p.full}
    return {
        name: None
        if line is None
        else {
            "avg10": line.avg10,
            "avg60": line.avg60,
            "avg300": line.avg300,
            "total_us": line.total_us,
        }
        for name, line in lines.items()
    }


def probe_report(resources: Resources, decision: Decision) -> dict[str, Any]:
    """The JSON object ``roomkeeper probe --json`` prints."""
    memory, disk = resources.memory, resources.disk
    return {
        "platform": resources.platform,
        "memory": {
            "source": memory.source.value,
            "used_bytes": memory.used_bytes,
            "limit_bytes": memory.limit_bytes,
            "limit_origin": memory.limit_origin.value,
            "group": memory.group,
            "line_bytes": decision.memory_line_bytes,
            "unknown_reason": memory.unknown_reason,
        },
        "pressure": {
            "source": resources.pressure_source,
            "memory": _pressure_json(resources.memory_pressure),
            "cpu": _pressure_json(resources.cpu_pressure),
        },
        "load_per_core": resources.load_per_core,
        "disk": {
            "path": disk.path,
            "free_bytes": disk.free_bytes,
            "total_bytes": disk.total_bytes,
            "unknown_reason": disk.unknown_reason,
        },
        "decision": {
            "admit": decision.admit,
            "reason": decision.reason.value,
            "summary": decision.summary,
            "estimate_bytes": decision.estimate_bytes,
        },
    }


def _pressure_text(p: Pressure | None) -> str:
    if p is None:
        return "not available"
    text = f"some {p.some.avg10:.2f}/{p.some.avg60:.2f}/{p.some.avg300:.2f}"
    if p.full is not None:
        text += f", full {p.full.avg10:.2f}/{p.full.avg60:.2f}/{p.full.avg300:.2f}"
    return text + " % (avg10/60/300)"


def _probe_table(resources: Resources, decision: Decision, headroom_percent: float) -> Table:
    memory, disk = resources.memory, resources.disk
    table = Table(title="roomkeeper probe", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("reading")
    line = decision.memory_line_bytes
    if memory.used_bytes is not None and memory.limit_bytes is not None and line is not None:
        table.add_row("memory source", memory.source.value)
        if memory.group:
            table.add_row("cgroup", memory.group)
        table.add_row("memory used", format_gb(memory.used_bytes))
        table.add_row(
            "memory limit", f"{format_gb(memory.limit_bytes)} from {memory.limit_origin.value}"
        )
        table.add_row(
            "headroom line", f"{format_gb(line)} (limit - min({headroom_percent:g} %, 8 GB))"
        )
    else:
        table.add_row("memory", f"unknown: {memory.unknown_reason}")
    table.add_row(
        f"memory pressure ({resources.pressure_source})", _pressure_text(resources.memory_pressure)
    )
    table.add_row("cpu pressure", _pressure_text(resources.cpu_pressure))
    if resources.load_per_core is not None:
        table.add_row("load per core", f"{resources.load_per_core:.2f}")
    if disk.free_bytes is not None and disk.total_bytes is not None:
        table.add_row(
            "disk",
            f"{format_gb(disk.free_bytes)} free of {format_gb(disk.total_bytes)} at {disk.path}",
        )
    else:
        table.add_row("disk", f"unknown at {disk.path}: {disk.unknown_reason}")
    verdict = "[green]admit[/green]" if decision.admit else "[red]refuse[/red]"
    table.add_row(
        f"one more job ({format_gb(decision.estimate_bytes)})",
        f"{verdict} ({decision.reason.value}): {decision.summary}",
    )
    return table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Write one JSON object to stdout.")
@click.option(
    "--memory",
    callback=parse_size_option,
    metavar="SIZE",
    help="Judge a job of this size (600M, 1.5G); default ROOMKEEPER_JOB_MEMORY_MB.",
)
@click.option(
    "--disk",
    callback=parse_size_option,
    metavar="SIZE",
    help="Judge a job needing this much disk; default ROOMKEEPER_JOB_DISK_MB.",
)
def probe(as_json: bool, memory: int | None, disk: int | None) -> None:
    """Show what roomkeeper reads, and whether one more job fits now."""
    home_dir()  # ROOMKEEPER_HOME is created on first use
    settings = read_settings()
    resources = read_resources(settings=settings)
    decision = Guard().check(memory_bytes=memory, disk_bytes=disk, resources=resources)
    if as_json:
        click.echo(json.dumps(probe_report(resources, decision)))
        return
    Console(soft_wrap=False).print(
        _probe_table(resources, decision, settings.memory_headroom_percent)
    )


@click.command()
@click.argument("file", type=click.File("r"), default="-")
@click.option(
    "--job-memory",
    callback=parse_size_option,
    metavar="SIZE",
    help="Memory each command is expected to hold (600M, 1.5G); default ROOMKEEPER_JOB_MEMORY_MB.",
)
@click.option(
    "--max-running",
    type=click.IntRange(min=1),
    default=None,
    help=(
        "Run at most N at once; default ROOMKEEPER_MAX_RUNNING; without either, at most 8, and "
        "a line also waits while the running ones keep every core busy. Memory may allow fewer."
    ),
)
@click.option(
    "--timeout",
    "timeout_text",
    metavar="DURATION",
    default=None,
    help="Deadline per command from when it was queued (90s, 5m, 1.5h).",
)
@click.option(
    "--logs",
    "logs",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep each command's output here; default ROOMKEEPER_HOME/batch/<time>-<pid>/.",
)
@click.option("--quiet", is_flag=True, help="Do not print the commands' output (logs are kept).")
@click.option(
    "--worktree",
    "worktree_repo",
    metavar="REPO",
    default=None,
    help="Run each line in its own git worktree of REPO (registered in ROOMKEEPER_HOME).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Young commands reserve their whole estimate (default: only their measured growth).",
)
@click.option(
    "--kind",
    callback=parse_kind_option,
    metavar="NAME",
    help="Learn sizes under this name for lines that name no kind of their own (#kind=NAME).",
)
@click.option(
    "--jobserver",
    is_flag=True,
    help="Give each line a jobserver metered by memory: make, ninja and cargo in it start "
    "a step only when another fits (an explicit -j is removed, and said).",
)
def batch(
    file: TextIO,
    job_memory: int | None,
    max_running: int | None,
    timeout_text: str | None,
    logs: Path | None,
    quiet: bool,
    worktree_repo: str | None,
    strict: bool,
    kind: str | None,
    jobserver: bool,
) -> None:
    """Run each line of FILE (or stdin) as a shell command, as memory allows.

    Each command's output is printed, unaltered and in one piece, when it
    ends; a summary table goes to stderr. Exits 0 only when every command
    exited 0. Ctrl-C stops every running command's whole tree.

    Without --job-memory each line is expected to take what past runs of its
    kind peaked at (kept in ROOMKEEPER_HOME): its own kind, written at the end
    of the line as a shell comment ('make test #kind=unit-tests'), else
    --kind, else a hash of the line and the directory.
    """
    timeout_s = None
    if timeout_text is not None:
        try:
            timeout_s = parse_duration(timeout_text, name="--timeout")
        except UsageError as err:
            raise click.BadParameter(str(err), param_hint="--timeout") from err
    commands = read_commands(file.readlines())
    if not commands:
        click.echo("roomkeeper batch: no commands to run (every line was empty)", err=True)
        return
    kinds = line_kinds(commands, kind)  # a bad "#kind=" fails here, before anything runs
    read_batch_cpu_settings()  # its words for a bad nice or CPU percentage, before the gateway's
    # A count given is the person's CPU decision, as parallel -j is; without one, lines also
    # wait while the running ones keep every core busy.
    counted = max_running is not None or max_running_given()
    if max_running is None:
        max_running = read_queue_settings().max_running if counted else UNCOUNTED_MAX_RUNNING
    logs_dir = writable_dir(
        logs if logs is not None else default_logs_dir(home_dir()),
        what="the logs directory",
        fix="choose another with --logs DIR (or ROOMKEEPER_HOME=DIR)",
    )
    with _learned_sizes() as journal:
        if worktree_repo is not None and journal is None:
            raise UsageError(
                "--worktree needs the journal in ROOMKEEPER_HOME (it registers each line's tree), "
                "and it did not open: fix ROOMKEEPER_HOME or run without --worktree"
            )
        worktrees = batch_worktrees(worktree_repo, journal) if worktree_repo and journal else None
        policy = MemoryPolicy.STRICT if strict else MemoryPolicy.PACK
        settings = BatchSettings(
            logs_dir=logs_dir,
            max_running=max_running,
            job_memory=job_memory,
            timeout_s=timeout_s,
            quiet=quiet,
            options=BatchOptions(policy=policy, kinds=kinds, sizes=journal, jobserver=jobserver),
            until_cores_free=not counted,
        )
        _run_batch_lines(commands, settings, worktrees)


def _run_batch_lines(
    commands: list[str], settings: BatchSettings, worktrees: BatchWorktrees | None
) -> None:
    """Run the lines, print the summary, exit non-zero unless every line exited 0."""
    err_console = Console(stderr=True)
    started = time.monotonic()
    on_terminal = sys.stderr.isatty()
    interrupted = False
    with BatchProgress(
        len(commands),
        console=err_console,
        on_terminal=on_terminal,
        out=sys.stdout.buffer,
    ) as progress:
        try:
            results = run_batch(commands, settings, progress=progress, worktrees=worktrees)
        except KeyboardInterrupt:
            interrupted = True
            results = []
    if interrupted:
        err_console.print("roomkeeper batch: interrupted; every running command was stopped")
        sys.exit(130)
    click.echo(summary_table(results, time.monotonic() - started, progress.pressure), err=True)
    click.echo(f"logs kept in {settings.logs_dir}", err=True)
    if not all(r.succeeded for r in results):
        sys.exit(1)


@contextlib.contextmanager
def _learned_sizes() -> Iterator[Journal | None]:
    """The journal in ROOMKEEPER_HOME, where learned sizes are kept; None when it cannot open.

    A batch that cannot learn still runs: it says why once, and sizes its
    lines by --job-memory or the default.  Closing waits for the peaks
    recorded to be durable.
    """
    try:
        journal = open_journal(home_dir(), os.environ)
    except (OSError, sqlite3.Error, RoomkeeperError) as err:
        click.echo(
            f"roomkeeper batch: learned sizes are off: the journal did not open ({err})", err=True
        )
        yield None
        return
    try:
        yield journal
    finally:
        journal.close()


COMMANDS: tuple[click.Command, ...] = (probe, batch, prune, reap)

"""``roomkeeper journal check`` and ``roomkeeper journal recover``: the journal's own health.

Both work on ROOMKEEPER_HOME's ``journal.db`` directly, without a gateway:
recovery replaces the file, so it refuses while a gateway or its supervisor
runs for that home.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import click
import psutil

from roomkeeper.errors import RoomkeeperError
from roomkeeper.gateway.recovery import logs_without_records
from roomkeeper.journal.database import SCHEMA
from roomkeeper.journal.integrity import ALL_TABLES, check_journal, job_ids_in, recover_journal
from roomkeeper.journal.lock import held_alone
from roomkeeper.paths import home_dir
from roomkeeper.supervisor.records import find_supervisor


def _journal_path() -> tuple[Path, Path]:
    home = home_dir(create=False)
    return home, home / "journal.db"


def _running_here(home: Path) -> str | None:
    """What runs for ``home`` (the supervisor or a gateway), said as text; None if nothing."""
    supervisor = find_supervisor(home)
    if supervisor is not None:
        return f"roomkeeper's supervisor (pid {supervisor.pid})"
    try:
        info = json.loads((home / "gateway.json").read_text())
        process = psutil.Process(int(info["pid"]))
        if abs(process.create_time() - float(info["started"])) < 0.01:
            return f"a roomkeeper gateway (pid {process.pid})"
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass
    return None


@click.group()
def journal() -> None:
    """Check the journal (ROOMKEEPER_HOME/journal.db), or save what can be read of a damaged one."""


@journal.command()
def check() -> None:
    """Check the journal for damage, and its job logs for jobs it has no record of.

    Exits 0 when the journal is whole and every log has its record, 1 otherwise.
    """
    home, path = _journal_path()
    if not path.exists():
        click.echo(f"no journal at {path} yet: nothing to check")
        return
    try:
        problems = check_journal(path)
    except sqlite3.OperationalError as err:
        raise RoomkeeperError(f"the journal {path} could not be read: {err}") from err
    if problems:
        click.echo(f"the journal {path} is damaged:")
        for problem in problems:
            click.echo(f"  {problem}")
        click.echo("stop roomkeeper, then run `roomkeeper journal recover`")
        raise SystemExit(1)
    lost = logs_without_records(job_ids_in(path), home / "logs")
    if lost:
        click.echo(
            f"the journal {path} is whole, but {len(lost)} job log(s) have no record in it "
            f"(written before a crash whose last journal writes were lost): "
            + ", ".join(p.name for p in lost[:10])
            + (" …" if len(lost) > 10 else "")
        )
        raise SystemExit(1)
    click.echo(f"the journal {path} is whole")


@journal.command()
def recover() -> None:
    """Save what can be read of a damaged journal into a new one; keep the damaged file.

    The damaged file (with its WAL) is renamed ``journal.db.damaged-<time>``
    beside the new one.  Refused while roomkeeper runs for this home, or any process
    holds the journal open.
    """
    home, path = _journal_path()
    running = _running_here(home)
    if running is not None:
        raise RoomkeeperError(
            f"{running} is using {path}; stop it first (`roomkeeper stop`), then recover"
        )
    if not path.exists():
        raise RoomkeeperError(f"there is no journal at {path}: nothing to recover")
    with held_alone(path):  # refused while any process holds it open, a gateway first
        report = recover_journal(path, SCHEMA)
    click.echo(f"the damaged journal is kept at {report.damaged}")
    click.echo(f"a new journal is at {report.journal}; rows saved:")
    for table, rows in sorted(report.saved.items()):
        if rows:
            click.echo(f"  {table}: {rows}")
    if not any(report.saved.values()):
        click.echo("  none")
    if ALL_TABLES in report.lost:
        click.echo("lost: the list of tables could not be read, so no row could be found")
    for table, count in sorted(report.lost.items()):
        if table == ALL_TABLES:
            continue
        how_many = "an unknown number of rows" if count is None else f"about {count} row(s)"
        click.echo(f"lost from {table}: {how_many} (the damaged pages)")
    if not report.lost:
        click.echo("lost: nothing that could be counted (every table was read to its end)")


COMMANDS: tuple[click.Command, ...] = (journal,)

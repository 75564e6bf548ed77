"""The commands that run and stop the service: ``serve`` (the gateway under its supervisor),
``gateway`` (the gateway alone) and ``stop`` (both, found from ROOMKEEPER_HOME).

The commands that send requests to a running gateway are in :mod:`roomkeeper.cli.remote`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx
import psutil

from roomkeeper.cli.client import connect
from roomkeeper.cli.ports import check_port_free
from roomkeeper.config import read_gateway_settings
from roomkeeper.errors import NoGatewayError, UsageError
from roomkeeper.paths import home_dir

STOP_WAIT_S = 30.0
"""Long enough for the supervisor's own stop: the gateway's deadline, then SIGKILL at 15 s."""


def _port(value: int | None) -> int:
    return value if value is not None else read_gateway_settings().port


@click.command()
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Loopback port; default ROOMKEEPER_PORT (8765).",
)
@click.option(
    "--socket",
    "socket_path",
    default=None,
    help="Listen on this Unix socket instead (ROOMKEEPER_SOCKET).",
)
def serve(port: int | None, socket_path: str | None) -> None:
    """Run the gateway under its supervisor: HTTP API on loopback, the Health page, /metrics.

    The supervisor starts ``roomkeeper gateway`` as its child, watches its
    heartbeats, recovers in stages and restarts it within a budget.
    """
    socket_path = socket_path or os.environ.get("ROOMKEEPER_SOCKET") or None
    chosen = _port(port)
    _check_port_free(chosen, socket_path)
    _check_journal()
    from roomkeeper.supervisor.service import run_supervisor

    sys.exit(run_supervisor(chosen, socket_path))


def _check_journal() -> None:
    """Refuse to start over a damaged journal: say which file and what to run, start nothing."""
    from roomkeeper.journal.integrity import JournalDamagedError, check_journal

    path = home_dir(create=False) / "journal.db"
    with contextlib.suppress(OSError, sqlite3.OperationalError):  # the gateway reports those
        problems = check_journal(path)
        if problems:
            raise JournalDamagedError(path, problems)


@click.command()
@click.option(
    "--port", type=click.IntRange(0, 65535), default=None, help="Loopback port; default 8765."
)
@click.option("--socket", "socket_path", default=None, help="Listen on this Unix socket instead.")
def gateway(port: int | None, socket_path: str | None) -> None:
    """Run the gateway alone, for development: no watchdog (use `serve` for that)."""
    socket_path = socket_path or os.environ.get("ROOMKEEPER_SOCKET") or None
    chosen = _port(port)
    from roomkeeper.api.serve import run_gateway
    from roomkeeper.ipc import ENV_FD

    if os.environ.get("ROOMKEEPER_SUPERVISE") == "1" and not os.environ.get(ENV_FD):
        # A service manager still starts the bare gateway: take on supervision, once.
        from roomkeeper.supervisor.service import adopt

        _check_port_free(chosen, socket_path)
        sys.exit(adopt(chosen, socket_path))
    if not os.environ.get(ENV_FD):
        _check_port_free(chosen, socket_path)
        click.echo(
            "roomkeeper gateway: running alone, with no watchdog (roomkeeper serve adds one)",
            err=True,
        )
    _run(lambda: run_gateway(chosen, socket_path))


def _run(start: Any) -> None:
    from roomkeeper.ipc import EXIT_CANNOT_START
    from roomkeeper.journal.integrity import JournalDamagedError

    try:
        start()
    except UsageError as err:
        raise click.UsageError(str(err)) from None
    except JournalDamagedError as err:
        # A restart would find the same file: the supervisor stops on this status.
        click.echo(f"roomkeeper gateway: cannot start: {err}", err=True)
        sys.exit(EXIT_CANNOT_START)


def _check_port_free(port: int, socket_path: str | None) -> None:
    if socket_path is not None:
        return
    try:
        check_port_free(port)
    except UsageError as err:
        raise click.UsageError(str(err)) from None


@click.command()
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=STOP_WAIT_S,
    show_default=True,
    help="Seconds to wait for roomkeeper to exit; 0 asks and returns at once.",
)
def stop(wait_s: float) -> None:
    """Stop roomkeeper, the gateway and its supervisor: not a crash, so nothing restarts it.

    When no gateway answers (the supervisor is waiting to restart one, or the
    gateway is stuck), the supervisor is asked directly and stops both.
    """
    from roomkeeper.supervisor.records import find_supervisor

    home = home_dir(create=False)
    supervisor = find_supervisor(home)
    waiting_for = [] if supervisor is None else [supervisor]
    why_not = None
    try:
        client = connect()
        try:
            gateway = _recorded_gateway(home)
            client.post("/v1/shutdown", timeout=10).raise_for_status()
        finally:
            client.close()
        waiting_for += [] if gateway is None else [gateway]
        click.echo("roomkeeper: stopping")
    except (NoGatewayError, httpx.HTTPError) as err:
        why_not = str(err) or type(err).__name__
    if why_not is not None:
        if supervisor is None:
            raise click.ClickException(why_not)
        with contextlib.suppress(psutil.NoSuchProcess):
            supervisor.terminate()  # psutil checks that the pid still names this process
        click.echo(
            f"roomkeeper: no gateway answered; stopping its supervisor (pid {supervisor.pid})"
        )
    if wait_s == 0:
        return
    alive = _wait_gone(waiting_for, wait_s)
    if alive:
        pids = ", ".join(str(p.pid) for p in alive)
        raise click.ClickException(
            f"still stopping after {wait_s:g} s (pid {pids}); the stop goes on without this command"
        )
    click.echo("roomkeeper: stopped")


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited; those still alive after ``timeout`` seconds.

    A zombie counts as gone: it has exited, and only its parent (not us) can reap it.
    """
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _recorded_gateway(home: Path) -> psutil.Process | None:
    """The gateway process named in ``home/gateway.json`` (it answered just now)."""
    try:
        return psutil.Process(int(json.loads((home / "gateway.json").read_text())["pid"]))
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None


COMMANDS: tuple[click.Command, ...] = (serve, gateway, stop)

"""The gateway's commands: ``serve``, and ``run``, ``status``, ``jobs``, ``output``, ``cancel``
against a running gateway (found, with its token, from ROOMKEEPER_HOME)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import httpx
import psutil
from rich.console import Console
from rich.table import Table

from roomkeeper.cli import main, parse_size_option
from roomkeeper.client import NoGatewayError, connect
from roomkeeper.config import read_gateway_settings
from roomkeeper.errors import UsageError
from roomkeeper.paths import home_dir
from roomkeeper.units import format_gb, parse_duration

STOP_WAIT_S = 30.0
"""Long enough for the supervisor's own stop: the gateway's deadline, then SIGKILL at 15 s."""

EXIT_CODES = {"failed": 127, "timed_out": 124, "expired": 124, "cancelled": 130, "stopped": 143}


def _port(value: int | None) -> int:
    return value if value is not None else read_gateway_settings().port


@main.command()
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
    from roomkeeper.supervisor import run_supervisor

    sys.exit(run_supervisor(chosen, socket_path))


@main.command()
@click.option(
    "--port", type=click.IntRange(0, 65535), default=None, help="Loopback port; default 8765."
)
@click.option("--socket", "socket_path", default=None, help="Listen on this Unix socket instead.")
def gateway(port: int | None, socket_path: str | None) -> None:
    """Run the gateway alone, for development: no watchdog (use `serve` for that)."""
    socket_path = socket_path or os.environ.get("ROOMKEEPER_SOCKET") or None
    chosen = _port(port)
    from roomkeeper.gateway_main import run_gateway
    from roomkeeper.ipc import ENV_FD

    if os.environ.get("ROOMKEEPER_SUPERVISE") == "1" and not os.environ.get(ENV_FD):
        # A service manager still starts the bare gateway: take on supervision, once.
        from roomkeeper.supervisor import adopt

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
    try:
        start()
    except UsageError as err:
        raise click.UsageError(str(err)) from None


def _check_port_free(port: int, socket_path: str | None) -> None:
    if socket_path is not None:
        return
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise click.UsageError(
                f"port {port} on 127.0.0.1 is in use (another gateway?); "
                "choose another with --port or ROOMKEEPER_PORT"
            ) from None
        raise
    finally:
        probe.close()


def _console() -> Console:
    # Piped output is for grep and scripts: do not squeeze tables into 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=200)


@contextlib.contextmanager
def _client() -> Iterator[httpx.Client]:
    try:
        client = connect()
    except NoGatewayError as err:
        raise click.ClickException(str(err)) from None
    try:
        yield client
    except httpx.HTTPError as err:
        raise click.ClickException(
            f"the gateway stopped answering ({type(err).__name__}: {err}); "
            "`roomkeeper status` tells whether it is still running"
        ) from None
    finally:
        client.close()


def _check(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        body = response.json()
        detail = body.get("detail") or body.get("summary") or body
    except ValueError:
        detail = response.text
    raise click.ClickException(f"the gateway answered {response.status_code}: {detail}")


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--owner", default="cli", show_default=True, help="Who the job is for.")
@click.option(
    "--memory", callback=parse_size_option, metavar="SIZE", help="Memory estimate (600M, 1.5G)."
)
@click.option(
    "--timeout", "timeout_text", metavar="DURATION", help="Deadline from submission (90s, 5m)."
)
@click.option("--detach", is_flag=True, help="Print the job id and return at once.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    owner: str, memory: int | None, timeout_text: str | None, detach: bool, command: tuple[str, ...]
) -> None:
    """Submit COMMAND (after --) as a job, stream its output, exit with its exit code."""
    timeout_s = None
    if timeout_text is not None:
        try:
            timeout_s = parse_duration(timeout_text, name="--timeout")
        except UsageError as err:
            raise click.BadParameter(str(err), param_hint="--timeout") from None
    body = {
        "argv": list(command),
        "owner": owner,
        "cwd": os.getcwd(),
        "memory_bytes": memory,
        "timeout_s": timeout_s,
    }
    with _client() as client:
        job = _check(client.post("/v1/jobs", json={k: v for k, v in body.items() if v is not None}))
        job_id = job["id"]
        if detach:
            click.echo(job_id)
            return
        try:
            final = _follow(client, job_id)
        except KeyboardInterrupt:
            with contextlib.suppress(httpx.HTTPError):
                client.delete(f"/v1/jobs/{job_id}")
            click.echo(f"roomkeeper: cancelled job {job_id}", err=True)
            sys.exit(130)
    state = final["state"]
    if state != "exited":
        click.echo(
            f"roomkeeper: job {job_id} ended {state}"
            + (f": {final['error']}" if final.get("error") else ""),
            err=True,
        )
        sys.exit(EXIT_CODES.get(state, 1))
    sys.exit(final["exit_code"] if 0 <= final["exit_code"] < 256 else 1)


def _follow(client: httpx.Client, job_id: str) -> dict[str, Any]:
    said = None
    while True:
        job = _check(client.get(f"/v1/jobs/{job_id}"))
        if job["state"] != "waiting":
            break
        if job["reason"] != said:
            said = job["reason"]
            click.echo(f"roomkeeper: job {job_id} waits ({said})", err=True)
        time.sleep(0.3)
    with client.stream(
        "GET", f"/v1/jobs/{job_id}/output", params={"follow": "true"}, timeout=None
    ) as response:
        for chunk in response.iter_bytes():
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    return dict(_check(client.get(f"/v1/jobs/{job_id}")))


@main.command()
def status() -> None:
    """The guard's reading, the queue per owner, and leases."""
    with _client() as client:
        s = _check(client.get("/v1/status"))
    table = Table(title="roomkeeper status", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    mem = s["memory"]
    if mem["used_bytes"] is not None:
        used, limit = format_gb(mem["used_bytes"]), format_gb(mem["limit_bytes"])
        table.add_row("memory", f"{used} used of {limit} ({mem['source']})")
    guard = s["guard"]
    table.add_row(
        "guard",
        f"{'admit' if guard['admit'] else 'refuse'} ({guard['reason']}): {guard['summary']}",
    )
    q = s["queue"]
    table.add_row("jobs", f"{q['running']} running, {q['waiting']} waiting")
    for owner, counts in q["by_owner"].items():
        table.add_row(f"  {owner}", f"{counts['running']} running, {counts['waiting']} waiting")
    table.add_row("leases", ", ".join(f"{k} {v}" for k, v in s["leases"].items()) or "none")
    _console().print(table)


@main.command()
@click.option("--owner", default=None, help="Only this owner's jobs.")
@click.option(
    "--state", default=None, help="Only jobs in this state (waiting, running, exited...)."
)
def jobs(owner: str | None, state: str | None) -> None:
    """List jobs, newest first."""
    params = {k: v for k, v in {"owner": owner, "state": state}.items() if v}
    with _client() as client:
        rows = _check(client.get("/v1/jobs", params=params))
    table = Table(title=f"roomkeeper jobs ({len(rows)})", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("owner", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("reason / exit", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("command", overflow="ellipsis", no_wrap=True, max_width=40)
    for j in rows:
        detail = j["reason"] or ("" if j["exit_code"] is None else f"exit {j['exit_code']}")
        if j["state"] == "uncertain":
            last = (j.get("last_output") or "").strip().splitlines()
            detail = f"last output: {last[-1][:40]}" if last else "no output"
        started = (
            time.strftime("%H:%M:%S", time.localtime(j["started_at"])) if j["started_at"] else ""
        )
        table.add_row(j["id"], j["owner"], j["state"], detail, started, " ".join(j["argv"]))
    if state in (None, "uncertain"):
        with _client() as client:
            calls = _check(client.get("/v1/calls", params={"state": "uncertain"}))
        for c in calls:
            started = time.strftime("%H:%M:%S", time.localtime(c["created_at"]))
            table.add_row(c["id"], c["owner"], "uncertain", f"call {c['kind']}", started, "")
    _console().print(table)


@main.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the job ends.")
def output(job_id: str, follow: bool) -> None:
    """Print a job's kept output, unaltered."""
    with (
        _client() as client,
        client.stream(
            "GET", f"/v1/jobs/{job_id}/output", params={"follow": str(follow).lower()}, timeout=None
        ) as response,
    ):
        if not response.is_success:
            response.read()
            _check(response)
        for chunk in response.iter_bytes():
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()


@main.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a waiting job, or stop a running job's whole tree."""
    with _client() as client:
        job = _check(client.delete(f"/v1/jobs/{job_id}"))
    click.echo(f"job {job['id']}: {job['state']}")


@main.command()
@click.argument("job_id")
@click.option("--succeeded", "resolution", flag_value="succeeded", help="It did what it should.")
@click.option("--failed", "resolution", flag_value="failed", help="It did not.")
@click.option("--rerun", "resolution", flag_value="rerun", help="Run it again now.")
def resolve(job_id: str, resolution: str | None) -> None:
    """Settle an uncertain job or call (in flight at a crash): --succeeded, --failed or --rerun."""
    if resolution is None:
        raise click.UsageError("say how it ended: --succeeded, --failed or --rerun")
    with _client() as client:
        answer = client.post(f"/v1/jobs/{job_id}/resolve", json={"resolution": resolution})
        if answer.status_code == 404:  # not a job: a registered call
            answer = client.post(f"/v1/calls/{job_id}/resolve", json={"resolution": resolution})
        job = _check(answer)
    click.echo(
        f"job {job['id']}: {job['state']}"
        + (f" ({job.get('resolution')})" if job.get("resolution") else "")
    )


@main.command()
def history() -> None:
    """Recovery history: when, what (a reason code), and numbers; nothing else."""
    with _client() as client:
        events = _check(client.get("/v1/history"))
    table = Table(title=f"roomkeeper history ({len(events)})", title_justify="left")
    for column in ("when", "what", "numbers"):
        table.add_column(column)
    for e in events:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
        numbers = ", ".join(f"{k} {v:g}" for k, v in e["numbers"].items())
        table.add_row(when, e["code"], numbers)
    _console().print(table)


@main.command()
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
    from roomkeeper.supervisor_records import find_supervisor

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
            f"still stopping after {wait_s:g} s (pid {pids}); run `roomkeeper stop` again to wait"
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


@main.command()
def restart() -> None:
    """Ask the supervisor for a fast restart of the gateway."""
    with _client() as client:
        _check(client.post("/v1/restart"))
    click.echo("roomkeeper: restarting")


@main.command()
def repair() -> None:
    """Leave recovery mode once the gateway is stably responsive and has headroom."""
    with _client() as client:
        answer = _check(client.post("/v1/repair", timeout=30))
    click.echo(("repaired: " if answer["repaired"] else "not repaired: ") + answer["why"])
    if not answer["repaired"]:
        sys.exit(1)

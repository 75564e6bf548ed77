"""The commands that send requests to a running gateway (found, with its token, from
ROOMKEEPER_HOME): ``run``, ``status``, ``jobs``, ``output``, ``cancel``, ``resolve``,
``history``, ``restart`` and ``repair``.

The commands that run and stop the service itself are in :mod:`roomkeeper.cli.service`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import click
import httpx
from rich.console import Console
from rich.table import Table

from roomkeeper.cli.client import connect
from roomkeeper.cli.options import parse_kind_option, parse_size_option
from roomkeeper.cli.worktrees import parse_worktree
from roomkeeper.errors import NoGatewayError, UsageError
from roomkeeper.units import format_bytes, format_gb, parse_duration

JOBS_SHOWN = 100  # roomkeeper jobs, by default
PAGE_MAX = 1000  # the API's largest page

EXIT_CODES = {"failed": 127, "timed_out": 124, "expired": 124, "cancelled": 130, "stopped": 143}


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


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--owner", default="cli", show_default=True, help="Who the job is for.")
@click.option(
    "--memory", callback=parse_size_option, metavar="SIZE", help="Memory estimate (600M, 1.5G)."
)
@click.option(
    "--timeout", "timeout_text", metavar="DURATION", help="Deadline from submission (90s, 5m)."
)
@click.option("--detach", is_flag=True, help="Print the job id and return at once.")
@click.option(
    "--worktree",
    "worktree_text",
    metavar="REPO[:BRANCH]",
    default=None,
    help="Run in a git worktree of REPO of its own, on BRANCH (default roomkeeper/<job id>).",
)
@click.option(
    "--kind",
    callback=parse_kind_option,
    metavar="NAME",
    help="Learn its size under this name (default: a hash of the command and directory).",
)
@click.option(
    "--pack",
    is_flag=True,
    help="Reserve only its measured growth while young (memory policy pack; default strict).",
)
@click.option(
    "--jobserver",
    is_flag=True,
    help="Give it a jobserver metered by memory: make, ninja and cargo in it start a step "
    "only when another fits (an explicit -j is removed, and said).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    owner: str,
    memory: int | None,
    timeout_text: str | None,
    detach: bool,
    worktree_text: str | None,
    kind: str | None,
    pack: bool,
    jobserver: bool,
    command: tuple[str, ...],
) -> None:
    """Submit COMMAND (after --) as a job, stream its output, exit with its exit code.

    Without --memory its estimate is what past runs of the same kind peaked at.
    """
    timeout_s = None
    if timeout_text is not None:
        try:
            timeout_s = parse_duration(timeout_text, name="--timeout")
        except UsageError as err:
            raise click.BadParameter(str(err), param_hint="--timeout") from None
    body: dict[str, Any] = {
        "argv": list(command),
        "owner": owner,
        "cwd": os.getcwd(),
        "memory_bytes": memory,
        "timeout_s": timeout_s,
        "kind": kind,
        "memory_policy": "pack" if pack else None,
        "jobserver": True if jobserver else None,
    }
    if worktree_text is not None:
        tree = parse_worktree(worktree_text)
        del body["cwd"]  # the job runs inside its tree
        body["worktree"] = {"repo": tree.repo, **({"branch": tree.branch} if tree.branch else {})}
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
                client.post(f"/v1/jobs/{job_id}/cancel")
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


@click.command()
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


@click.command()
@click.option("--owner", default=None, help="Only this owner's jobs.")
@click.option(
    "--state", default=None, help="Only jobs in this state (waiting, running, exited...)."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=JOBS_SHOWN,
    show_default=True,
    help="Show at most this many (the newest).",
)
@click.option("--all", "every", is_flag=True, help="Show every job, page after page.")
def jobs(owner: str | None, state: str | None, limit: int, every: bool) -> None:
    """List jobs, newest first."""
    params = {k: v for k, v in {"owner": owner, "state": state}.items() if v}
    with _client() as client:
        rows, more = _pages(client, "/v1/jobs", params, None if every else limit)
    title = f"roomkeeper jobs ({len(rows)}{', more: --all or --limit' if more else ''})"
    table = Table(title=title, title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("owner", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("reason / exit", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("estimate", no_wrap=True)
    table.add_column("command", overflow="ellipsis", no_wrap=True, max_width=40)
    for j in rows:
        detail = j["reason"] or ("" if j["exit_code"] is None else f"exit {j['exit_code']}")
        if j["state"] == "uncertain":
            last = (j.get("last_output") or "").strip().splitlines()
            detail = f"last output: {last[-1][:40]}" if last else "no output"
        started = (
            time.strftime("%H:%M:%S", time.localtime(j["started_at"])) if j["started_at"] else ""
        )
        table.add_row(
            j["id"], j["owner"], j["state"], detail, started, _estimate(j), " ".join(j["argv"])
        )
    if state in (None, "uncertain"):
        with _client() as client:
            calls = _check(client.get("/v1/calls", params={"state": "uncertain"}))
        for c in calls:
            started = time.strftime("%H:%M:%S", time.localtime(c["created_at"]))
            table.add_row(c["id"], c["owner"], "uncertain", f"call {c['kind']}", started, "", "")
    _console().print(table)


def _pages(
    client: httpx.Client, path: str, params: dict[str, Any], most: int | None
) -> tuple[list[dict[str, Any]], bool]:
    """Items of a paged list, following its next-page cursors until ``most`` (None: all);
    and whether more were left."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        size = PAGE_MAX if most is None else min(PAGE_MAX, most - len(items))
        query = {**params, "limit": size, **({"cursor": cursor} if cursor else {})}
        answer = client.get(path, params=query)
        items += _check(answer)
        cursor = answer.headers.get("X-Next-Cursor")
        if cursor is None:
            return items, False
        if most is not None and len(items) >= most:
            return items, True


def _estimate(job: dict[str, Any]) -> str:
    """A job's memory estimate and where it came from, with its command shape's typical peak
    where it has one: ``1.1 GB (learned), pack``, ``1.1 GB (default; shape 80.0 MB), pack``."""
    size = job.get("estimate_bytes")
    if size is None:
        return ""  # a job recorded before estimates were
    shape, source = job.get("shape_bytes"), job.get("estimate_source") or "default"
    shape_text = ""
    if isinstance(shape, int) and source == "default":  # a re-run's size is its own run's
        shape_text = f"; shape {format_bytes(shape)}"
    text = f"{format_bytes(size)} ({source}{shape_text})"
    return text + (", pack" if job.get("memory_policy") == "pack" else "")


@click.command()
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


@click.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a waiting job, or stop a running job's whole tree."""
    with _client() as client:
        job = _check(client.post(f"/v1/jobs/{job_id}/cancel"))
    click.echo(f"job {job['id']}: {job['state']}")


@click.command()
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


@click.command()
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


@click.command()
def restart() -> None:
    """Ask the supervisor for a fast restart of the gateway."""
    with _client() as client:
        _check(client.post("/v1/restart"))
    click.echo("roomkeeper: restarting")


@click.command()
def repair() -> None:
    """Leave recovery mode once the gateway is stably responsive and has headroom."""
    with _client() as client:
        answer = _check(client.post("/v1/repair", timeout=30))
    click.echo(("repaired: " if answer["repaired"] else "not repaired: ") + answer["why"])
    if not answer["repaired"]:
        sys.exit(1)


COMMANDS: tuple[click.Command, ...] = (
    run,
    status,
    jobs,
    output,
    cancel,
    resolve,
    history,
    restart,
    repair,
)

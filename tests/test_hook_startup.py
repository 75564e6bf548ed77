"""`roomkeeper hook` starts light: a tool starts one per tool call, many at once, so its
process imports the client's transport and nothing of the web framework, the gateway or
the other commands; and the `roomkeeper` command finds each command where it lives."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click

from roomkeeper.cli import app

# What only the gateway's side needs: none of it may load in a hook process.
HEAVY = (
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "roomkeeper.api.app",
    "roomkeeper.api.agent_hooks",
    "roomkeeper.api.models",
    "roomkeeper.api.responses",
    "roomkeeper.gateway",
    "roomkeeper.guard",
    "roomkeeper.journal",
    "roomkeeper.jobs",
    "roomkeeper.cli.local",
    "roomkeeper.cli.remote",
    "roomkeeper.cli.service",
    "roomkeeper.cli.journal",
)


# ``python -m roomkeeper *argv``, writing every module loaded by its end to a file.
PROBE = (
    "import atexit, json, runpy, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write(json.dumps(sorted(sys.modules))))\n"
    "sys.argv[0] = 'roomkeeper'\n"
    "runpy.run_module('roomkeeper', run_name='__main__', alter_sys=True)\n"
)


def imported_by(argv: list[str], tmp_path: Path, stdin: str) -> tuple[int, str, set[str]]:
    """Run ``python -m roomkeeper *argv``: its exit status, its stderr, and every module
    loaded when it exited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(ROOMKEEPER_HOME=str(tmp_path / "home"), ROOMKEEPER_SOCKET=str(tmp_path / "no.sock"))
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stderr, set(json.loads(out.read_text()))


def test_a_hook_process_imports_no_web_framework_gateway_or_other_command(
    tmp_path: Path,
) -> None:
    """``roomkeeper hook claude-code`` run to its end (blocked: no gateway) loads neither
    FastAPI nor pydantic nor the gateway, guard, journal or any other command."""
    code, said, modules = imported_by(["hook", "claude-code"], tmp_path, '{"x": 1}')
    assert code == 2, said
    assert "blocked" in said and "no answer from the roomkeeper gateway" in said, said
    assert "roomkeeper.cli.hook" in modules  # the probe sees the imports it should
    heavy = sorted(m for m in modules if m.startswith(HEAVY))
    assert heavy == [], f"a hook process imports what only the gateway needs: {heavy}"


def test_every_command_is_found_where_the_map_says() -> None:
    """The command map names each command of each command module, and nothing else."""
    found = {}
    for home in sorted(set(app.HOMES.values())):
        for command in importlib.import_module(f"roomkeeper.cli.{home}").COMMANDS:
            found[command.name] = home
    assert found == app.HOMES


def test_the_help_lists_every_command() -> None:
    """``roomkeeper --help`` lists every command the map names, each with its summary."""
    with click.Context(app.main) as ctx:
        text = app.main.get_help(ctx)
        shown = [n for n in app.HOMES if not getattr(app.main.get_command(ctx, n), "hidden", 1)]
    assert len(shown) == len(app.HOMES) - 1  # reap, an alias of prune, is hidden
    for name in shown:
        assert f"\n  {name} " in text, name

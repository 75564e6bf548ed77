"""``roomkeeper hook claude-code`` and ``roomkeeper hook codex``: commands to name in those
tools' hook settings, so that subagents start only when there is memory for them.

Each reads one hook event (JSON) from stdin, hands it to the gateway's
``/v1/agent-hooks/<tool>`` (:mod:`roomkeeper.api.agent_hooks` judges it), and writes
the tool's answer to stdout: nothing when the call may go on (the tool's own
permission rules still apply), else the ``hookSpecificOutput`` decision.

It starts light, as a process a tool starts for every tool call must: it loads the
client's transport and the routes' terms (:mod:`roomkeeper.api.hook_terms`), never the
API's models, the gateway or the other commands.

It fails closed: both tools let a call through when a hook exits with anything but
0 or 2, so every failure here (no gateway, bad input, a refusal of the gateway, a
bug) exits 2 with its reason on stderr, which the tool shows the model.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from roomkeeper.api.hook_terms import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TTL_S,
    DEFAULT_WAIT_S,
    MAX_MEMORY_MB,
    MAX_TTL_S,
    MAX_WAIT_S,
    MODES,
)
from roomkeeper.client.agent_hooks import agent_hook
from roomkeeper.client.discovery import settings_from_env
from roomkeeper.client.transport import Transport
from roomkeeper.units import parse_size

BLOCK = 2  # the exit status both tools read as "blocked", with stderr as the reason
MAX_EVENT_BYTES = 4 << 20


def _options(command: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "--mode",
                type=click.Choice(["wait", "deny", "defer"]),
                default="wait",
                show_default=True,
                help="wait: hold the call until room (at most --wait); deny: refuse at once, "
                "saying why; defer: Claude Code -p only, the call is asked again on --resume.",
            ),
            click.option(
                "--memory",
                default=f"{DEFAULT_MEMORY_MB}M",
                show_default=True,
                help="Each call's estimate when the gateway has learned none for its kind.",
            ),
            click.option(
                "--wait",
                "wait_s",
                type=click.FloatRange(0, MAX_WAIT_S),
                default=DEFAULT_WAIT_S,
                show_default=True,
                help="Seconds wait mode holds a call; keep it under the hook's timeout.",
            ),
            click.option(
                "--ttl",
                "ttl_s",
                type=click.FloatRange(1, MAX_TTL_S),
                default=DEFAULT_TTL_S,
                show_default=True,
                help="Seconds a lease lives unreleased (a crashed tool's lease ends by it).",
            ),
            click.option("--bash", is_flag=True, help="Gate Bash calls too, not only subagents."),
        ]
    ):
        command = option(command)
    return command


def _run(tool: str, mode: str, memory: str, wait_s: float, ttl_s: float, bash: bool) -> None:
    if mode not in MODES[tool]:
        # Refused before any event is read: a setting the tool cannot act on is a mistake
        # in the hook's settings, and every call would otherwise be blocked for it.
        click.echo(
            f"roomkeeper hook {tool}: blocked, --mode {mode} is not one of {tool}'s modes "
            f"({', '.join(MODES[tool])}): mode defer is Claude Code's (-p mode) only; Codex "
            "hooks take allow, deny or ask, so use --mode wait or deny",
            err=True,
        )
        sys.exit(BLOCK)
    try:
        memory_mb = max(1, parse_size(memory) >> 20)
        if memory_mb > MAX_MEMORY_MB:
            raise ValueError(f"--memory must be at most {MAX_MEMORY_MB} MiB (got {memory})")
        raw = sys.stdin.buffer.read(MAX_EVENT_BYTES + 1)
        if len(raw) > MAX_EVENT_BYTES:
            raise ValueError(f"the hook event on stdin is over {MAX_EVENT_BYTES} bytes")
        event = json.loads(raw or b"null")
        if not isinstance(event, dict):
            raise ValueError("stdin must hold the hook event, a JSON object")
        settings = {"mode": mode, "memory_mb": memory_mb, "wait_s": wait_s, "ttl_s": ttl_s}
        # The event goes as the tool sent it: the gateway's route checks it and the
        # query (a 422 is a typed error here, so it blocks like any other failure).
        transport = Transport(settings_from_env())
        try:
            answer = agent_hook(transport, tool, event, bash=bash, **settings)
        finally:
            transport.close()
    except Exception as err:  # every failure blocks: a crash must not let the call through
        click.echo(f"roomkeeper hook {tool}: blocked, could not judge this call: {err}", err=True)
        sys.exit(BLOCK)
    if answer:
        click.echo(json.dumps(answer))


@click.group("hook")
def hook() -> None:
    """Memory admission for coding agents' subagents, named in their hook settings."""


@hook.command("claude-code")
@_options
def claude_code(mode: str, memory: str, wait_s: float, ttl_s: float, bash: bool) -> None:
    """A Claude Code hook (PreToolUse, PostToolUse, SubagentStop): the event on stdin."""
    _run("claude-code", mode, memory, wait_s, ttl_s, bash)


@hook.command("codex")
@_options
def codex(mode: str, memory: str, wait_s: float, ttl_s: float, bash: bool) -> None:
    """A Codex hook (PreToolUse, PostToolUse): the event on stdin; modes wait and deny."""
    _run("codex", mode, memory, wait_s, ttl_s, bash)


COMMANDS = [hook]

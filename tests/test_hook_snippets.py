"""The hook settings in ``contrib/`` are the ones the README shows, they parse as their
tools read them, and every command in them is one ``roomkeeper`` accepts."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest

from roomkeeper.cli.app import main

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = ["claude-code-settings.json", "claude-code-http-settings.json", "codex-config.toml"]


def parsed(name: str) -> dict[str, Any]:
    text = (ROOT / "contrib" / name).read_text()
    return tomllib.loads(text) if name.endswith(".toml") else dict(json.loads(text))


def handlers(settings: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for groups in settings["hooks"].values() for g in groups for h in g["hooks"]]


@pytest.mark.parametrize("name", SNIPPETS)
def test_the_readme_shows_each_snippet_as_it_is(name: str) -> None:
    """Each contrib snippet is in the README word for word, in a fenced block."""
    text = (ROOT / "contrib" / name).read_text().strip()
    fence = "toml" if name.endswith(".toml") else "json"
    assert f"```{fence}\n{text}\n```" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", SNIPPETS)
def test_each_snippet_s_hooks_are_ones_roomkeeper_answers(name: str) -> None:
    """Every command hook runs an accepted ``roomkeeper hook`` command; every http hook
    posts to the gateway's agent-hook route with the token from the environment."""
    settings = parsed(name)
    assert {"PreToolUse", "PostToolUse"} <= set(settings["hooks"])
    for handler in handlers(settings):
        if handler["type"] == "command":
            argv = shlex.split(handler["command"])
            assert argv[:2] == ["roomkeeper", "hook"]
            group = main.get_command(main.make_context("roomkeeper", ["hook"]), "hook")
            assert isinstance(group, click.Group)
            command = group.get_command(click.Context(group), argv[2])
            assert command is not None, f"no command roomkeeper hook {argv[2]}"
            command.make_context(argv[2], argv[3:])  # raises on an unknown option or value
        else:
            assert handler["type"] == "http"
            assert "/v1/agent-hooks/claude-code" in handler["url"]
            assert handler["headers"]["Authorization"] == "Bearer $ROOMKEEPER_TOKEN"
            assert handler["allowedEnvVars"] == ["ROOMKEEPER_TOKEN"]
    pre = settings["hooks"]["PreToolUse"][0]["hooks"][0]
    assert pre.get("timeout", 0) >= 600  # wait mode holds a call up to 540 s

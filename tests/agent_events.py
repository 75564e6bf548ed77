"""Hook events exactly as Claude Code and Codex send them, and a swarm of real subagents
driven through ``roomkeeper hook`` as those tools drive it.

The shapes pinned here are what the hooks rely on, as the tools document them:

- Claude Code (command hooks get the event on stdin; ``http`` hooks POST it as the
  body): every event has ``session_id``, ``transcript_path``, ``cwd`` and
  ``hook_event_name``; ``PreToolUse`` and ``PostToolUse`` add ``tool_name``,
  ``tool_input`` (the ``Agent`` tool's: ``description``, ``prompt``,
  ``subagent_type``, ``run_in_background``; ``Bash``'s: ``command``) and
  ``tool_use_id``; ``SubagentStop`` adds ``agent_id`` and ``agent_type``.  A hook's
  answer: exit 0 with nothing on stdout is no decision; exit 0 with
  ``{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision":
  "deny" | "defer", "permissionDecisionReason": ...}}`` decides; exit 2 blocks with
  stderr as the reason; any other exit lets the call through.
- Codex (``[[hooks.PreToolUse]]`` command hooks in ``config.toml``): the same common
  fields (``session_id``, ``cwd``, ``hook_event_name``, ``model``), ``tool_name``
  (``Bash``), ``tool_input.command`` and ``tool_use_id``; ``permissionDecision``
  ``deny`` in ``hookSpecificOutput``, or exit 2, blocks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.cgroups import MemoryBox


def claude_pre_agent(
    use_id: str,
    *,
    session: str = "sess-1",
    background: bool = False,
    agent_type: str = "general-purpose",
) -> dict[str, Any]:
    """Claude Code's PreToolUse of its subagent tool."""
    return {
        "session_id": session,
        "transcript_path": "/home/u/.claude/projects/p/sess-1.jsonl",
        "cwd": "/home/u/p",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": "Agent",
        "tool_input": {
            "description": "look into the parser",
            "prompt": "Find where the parser reads sizes.",
            "subagent_type": agent_type,
            "run_in_background": background,
        },
        "tool_use_id": use_id,
    }


def claude_post(pre: dict[str, Any]) -> dict[str, Any]:
    """The PostToolUse that follows ``pre`` (same ``tool_use_id``)."""
    return {**pre, "hook_event_name": "PostToolUse", "tool_response": {"content": "done"}}


def claude_subagent_stop(session: str, agent_type: str) -> dict[str, Any]:
    """Claude Code's SubagentStop of a subagent of ``agent_type``."""
    return {
        "session_id": session,
        "transcript_path": "/home/u/.claude/projects/p/sess-1.jsonl",
        "cwd": "/home/u/p",
        "hook_event_name": "SubagentStop",
        "stop_hook_active": False,
        "agent_id": "a1b2c3",
        "agent_type": agent_type,
        "agent_transcript_path": "/home/u/.claude/projects/p/sess-1/subagents/a1b2c3.jsonl",
    }


def codex_pre_bash(use_id: str, command: str, session: str = "thread-1") -> dict[str, Any]:
    """Codex's PreToolUse of a shell command."""
    return {
        "session_id": session,
        "transcript_path": None,
        "cwd": "/home/u/p",
        "hook_event_name": "PreToolUse",
        "model": "gpt-5-codex",
        "turn_id": "turn-1",
        "tool_name": "Bash",
        "tool_input": {"command": command},
        "tool_use_id": use_id,
    }


def run_hook(
    env: dict[str, str], tool: str, event: dict[str, Any], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``roomkeeper hook TOOL ARGS`` with ``event`` on stdin, as the tool runs it."""
    return subprocess.run(
        [sys.executable, "-m", "roomkeeper", "hook", tool, *args],
        input=json.dumps(event),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def decision(done: subprocess.CompletedProcess[str]) -> str:
    """``allow`` (exit 0, nothing said), the permissionDecision said, or ``exit N``."""
    if done.returncode != 0:
        return f"exit {done.returncode}"
    if not done.stdout.strip():
        return "allow"
    return str(json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"])


GROW = "import sys, time\nx = b'\\x01' * (int(sys.argv[1]) << 20)\ntime.sleep(float(sys.argv[2]))"


@dataclass
class Swarm:
    """Subagents started through the hook: each a real process in the box that takes its
    memory for a while, then its PostToolUse.

    The first wave's PreToolUse is asked through ``roomkeeper hook claude-code`` (a
    command hook); calls asked again later, and every PostToolUse, go through ``http``,
    the gateway's route for Claude Code's ``http`` hook type (the same judge, without a
    process per event).

    Attributes:
        live: subagents running now; most: the most at once.
        answers: each call's first answer; exits: each subagent process's exit status.
    """

    box: MemoryBox
    env: dict[str, str]
    http: httpx.Client
    mb: int = 300
    hold_s: float = 0.8
    agent_type: str = "general-purpose"
    live: int = 0
    most: int = 0
    answers: dict[str, str] = field(default_factory=dict)
    exits: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, use_id: str, *args: str) -> str:
        """One subagent call through the command: its PreToolUse; when allowed, the
        subagent and its PostToolUse."""
        pre = claude_pre_agent(use_id, agent_type=self.agent_type)
        said = decision(run_hook(self.env, "claude-code", pre, "--memory", f"{self.mb}M", *args))
        return self._went(pre, said)

    def call_http(self, use_id: str, mode: str) -> str:
        """One subagent call through the http hook route, asked as ``call`` asks."""
        pre = claude_pre_agent(use_id, agent_type=self.agent_type)
        route = "/v1/agent-hooks/claude-code"
        answer = self.http.post(route, params={"mode": mode, "memory_mb": self.mb}, json=pre)
        assert answer.status_code == 200, answer.text
        found = answer.json().get("hookSpecificOutput", {})
        said = str(found.get("permissionDecision", "allow"))
        return self._went(pre, said)

    def _went(self, pre: dict[str, Any], said: str) -> str:
        """Note the call's first answer; when allowed, run its subagent, then post its
        PostToolUse to the http route (a PostToolUse through the command is tested on its
        own; here a process per end would only slow the swarm down)."""
        with self.lock:
            self.answers.setdefault(str(pre["tool_use_id"]), said)
        if said == "allow":
            self._subagent()
            done = self.http.post("/v1/agent-hooks/claude-code", json=claude_post(pre))
            assert done.status_code == 200, done.text
        return said

    def _subagent(self) -> None:
        with self.lock:
            self.live += 1
            self.most = max(self.most, self.live)
        try:
            grow = [sys.executable, "-c", GROW, str(self.mb), str(self.hold_s)]
            # On v2 a gateway in the box gives its children the controller, and no process
            # may join the box itself; on v1 a kill counts only in its own group: the box.
            argv = self.box.argv(grow, leaf="work" if self.box.version == 2 else None)
            code = subprocess.run(argv, check=False, timeout=120).returncode
        finally:
            with self.lock:
                self.live -= 1
        with self.lock:
            self.exits.append(code)

    def wave(self, ids: list[str], ask: Callable[[str], str]) -> dict[str, str]:
        """Every call of ``ids`` at once, each asked by ``ask(id)``; each one's answer."""
        said: dict[str, str] = {}
        threads = [threading.Thread(target=lambda i=i: said.__setitem__(i, ask(i))) for i in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return said

    def until_all_done(self, ids: list[str], mode: str, rounds: int = 20) -> int:
        """A first wave of every call through the command, then waves of the calls not yet
        allowed (a denied or deferred call asked again, as a model or ``claude -p
        --resume`` would) through the http route, until all ran; the waves it took."""
        pending = list(ids)
        for n in range(1, rounds + 1):
            if n == 1:
                said = self.wave(pending, lambda i: self.call(i, "--mode", mode))
            else:
                said = self.wave(pending, lambda i: self.call_http(i, mode))
            pending = [i for i in pending if said[i] != "allow"]
            if not pending:
                return n
            time.sleep(0.2)
        raise AssertionError(f"{len(pending)} calls never ran in {rounds} waves")

"""Memory admission for coding agents' subagents, through the agents' own hooks.

``POST /v1/agent-hooks/claude-code`` and ``POST /v1/agent-hooks/codex`` take a hook
event's JSON exactly as the tool sends it (Claude Code's ``http`` hook type posts it
here itself; ``roomkeeper hook claude-code`` and ``roomkeeper hook codex`` forward
what their stdin holds) and answer exactly what the tool reads back:

- ``PreToolUse`` of a gated tool (the subagent tool: Claude Code's ``Agent``, formerly
  ``Task``, Codex's ``spawn_agent``; ``Bash`` too when asked) takes a lease keyed by the
  event's ``tool_use_id``, for the memory learned for its ``subagent_type`` or command,
  else the stated default.  Granted, the answer is ``{}``: no decision, so the tool's
  own permission rules still apply (roomkeeper never grants a permission).  Refused,
  it is ``hookSpecificOutput.permissionDecision`` ``deny`` with a reason the model can
  act on (the memory needed and the memory free), or ``defer`` in ``defer`` mode.
- ``PostToolUse`` with the same ``tool_use_id`` releases that lease, unless the call
  started a background subagent, whose lease ``SubagentStop`` releases (the oldest of
  that session and ``agent_type``).
- Anything else is answered ``{}``.

A lease left behind (the tool crashed before its ``PostToolUse``) ends by its ttl.
Any failure to judge a ``PreToolUse`` is answered ``deny``, never a silent pass: an
``http`` hook that gets no 2xx lets the call through, so a refusal must be a 2xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Request, params

from roomkeeper.api.health_first import pause_of
from roomkeeper.api.hook_terms import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TTL_S,
    DEFAULT_WAIT_S,
    MAX_MEMORY_MB,
    MAX_TTL_S,
    MAX_WAIT_S,
    CodexMode,
    Mode,
    Tool,
)
from roomkeeper.api.responses import HookAnswerOut
from roomkeeper.errors import AlreadyEndedError, RoomkeeperError, UnknownJobError
from roomkeeper.gateway.service import Gateway
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import LeaseState
from roomkeeper.guard.rule import Decision

MemoryMb = Annotated[int, Query(ge=1, le=MAX_MEMORY_MB)]
WaitS = Annotated[float, Query(ge=0, le=MAX_WAIT_S)]
TtlS = Annotated[float, Query(gt=0, le=MAX_TTL_S)]

SUBAGENT_TOOLS: dict[str, frozenset[str]] = {
    "claude-code": frozenset({"Agent", "Task"}),
    "codex": frozenset({"spawn_agent"}),
}
"""Each tool's subagent tool names: always gated."""
PREFIX = {"claude-code": "cc", "codex": "codex"}
BACKGROUND = "bg"
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9.:@-]")
_NO_DECISION: dict[str, Any] = {}


def name_of(text: str, limit: int = 120) -> str:
    """``text`` as a lease id or session may hold it: other characters as ``-``, bounded."""
    return _NOT_IN_A_NAME.sub("-", text)[:limit] or "-"


def agent_hook_routes(gateway: Gateway, auth: Sequence[params.Depends]) -> APIRouter:
    """``/v1/agent-hooks/claude-code`` and ``/v1/agent-hooks/codex`` for ``gateway``,
    behind ``auth``.

    Two routes, not one with the tool in the path: each declares the modes its tool
    reads, so the document admits ``defer`` only where a tool has it (Claude Code's
    ``-p`` mode; Codex answers allow, deny or ask), and what it admits is answered.
    """
    router = APIRouter()

    @router.post(
        "/v1/agent-hooks/claude-code",
        dependencies=auth,
        response_model=HookAnswerOut,
        response_model_exclude_unset=True,
    )
    async def claude_code_hook(
        request: Request,
        event: Annotated[dict[str, Any], Body()],
        mode: Mode = "wait",
        memory_mb: MemoryMb = DEFAULT_MEMORY_MB,
        wait_s: WaitS = DEFAULT_WAIT_S,
        ttl_s: TtlS = DEFAULT_TTL_S,
        bash: bool = False,
    ) -> dict[str, Any]:
        """Answer one Claude Code hook event as Claude Code reads a hook's answer."""
        settings = HookSettings(mode, memory_mb << 20, wait_s, ttl_s, bash)
        return await HookJudge(gateway, "claude-code", settings).answer(event, request)

    @router.post(
        "/v1/agent-hooks/codex",
        dependencies=auth,
        response_model=HookAnswerOut,
        response_model_exclude_unset=True,
    )
    async def codex_hook(
        request: Request,
        event: Annotated[dict[str, Any], Body()],
        mode: CodexMode = "wait",
        memory_mb: MemoryMb = DEFAULT_MEMORY_MB,
        wait_s: WaitS = DEFAULT_WAIT_S,
        ttl_s: TtlS = DEFAULT_TTL_S,
        bash: bool = False,
    ) -> dict[str, Any]:
        """Answer one Codex hook event as Codex reads a hook's answer (no ``defer``)."""
        settings = HookSettings(mode, memory_mb << 20, wait_s, ttl_s, bash)
        return await HookJudge(gateway, "codex", settings).answer(event, request)

    return router


@dataclass(frozen=True, slots=True)
class HookSettings:
    """How a hook judges.

    Attributes:
        mode: ``wait`` for room (at most ``wait_s``), ``deny`` at once, or ``defer``.
        memory_bytes: the estimate when none is learned for the call's kind.
        wait_s: the longest ``wait`` holds a call.
        ttl_s: the lease's life unreleased.
        bash: whether ``Bash`` calls are gated too.
    """

    mode: Mode
    memory_bytes: int
    wait_s: float
    ttl_s: float
    bash: bool


class HookJudge:
    """One event's answer for one tool's hook settings."""

    def __init__(self, gateway: Gateway, tool: Tool, settings: HookSettings) -> None:
        self._gateway = gateway
        self._tool = tool
        self._settings = settings

    async def answer(self, event: Mapping[str, Any], request: Request) -> dict[str, Any]:
        """The tool's answer to ``event``: ``{}`` for no decision, else its decision."""
        name = event.get("hook_event_name")
        if name == "PreToolUse" and self._gated(event):
            try:
                return await self._admit(event, request)
            except (RoomkeeperError, ValueError, TypeError, KeyError) as err:
                # Fails closed: a call roomkeeper could not judge does not pass.
                return self._refusal("deny", f"roomkeeper could not judge this call: {err}")
        if name == "PostToolUse" and self._gated(event) and not _background(event):
            await self._end(self._lease_id(event))
        elif name == "SubagentStop":
            await self._end_background(event)
        return _NO_DECISION

    def _gated(self, event: Mapping[str, Any]) -> bool:
        tool_name = event.get("tool_name")
        if tool_name in SUBAGENT_TOOLS[self._tool]:
            return True
        return self._settings.bash and tool_name == "Bash"

    def _lease_id(self, event: Mapping[str, Any]) -> str:
        """``cc:<tool_use_id>``; a background subagent's names its agent type too, for its
        ``SubagentStop`` to find."""
        use_id = event.get("tool_use_id")
        if not isinstance(use_id, str) or not use_id:
            raise ValueError("the event has no tool_use_id (a string) to key its lease by")
        prefix = PREFIX[self._tool]
        if _background(event):
            return f"{prefix}-{BACKGROUND}:{name_of(_agent_type(event), 60)}:{name_of(use_id)}"
        return f"{prefix}:{name_of(use_id)}"

    def _kind(self, event: Mapping[str, Any]) -> str:
        """The learned-size kind: ``agent-<subagent_type>``, or ``bash-<program>``."""
        if event.get("tool_name") == "Bash":
            command = _tool_input(event).get("command")
            words = command.split() if isinstance(command, str) else []
            return f"bash-{name_of(words[0].rsplit('/', 1)[-1], 60) if words else '-'}"
        return f"agent-{name_of(_agent_type(event), 60)}"

    async def _admit(self, event: Mapping[str, Any], request: Request) -> dict[str, Any]:
        kind = self._kind(event)
        session = event.get("session_id")
        asked = LeaseTerms(
            owner=self._tool,
            ttl_s=self._settings.ttl_s,
            session=name_of(session) if isinstance(session, str) and session else None,
            kind=kind,
        )
        wait = self._settings.wait_s if self._settings.mode == "wait" else 0.0
        leases = self._gateway.durable_leases
        lease, decision, _ = await leases.grant(
            self._lease_id(event),
            asked,
            wait_s=wait,
            pause=pause_of(request.scope),
            default_memory=self._settings.memory_bytes,
        )
        if lease is not None:
            return _NO_DECISION
        assert decision is not None
        terms = await asyncio.to_thread(leases.learned, asked)
        learned = terms.memory_bytes is not None
        estimate = decision.estimate_bytes  # what the last try asked
        source = "learned for" if learned else "the stated default for"
        why = _no_room(decision, estimate, f"{source} {kind}", wait)
        return self._refusal("defer" if self._settings.mode == "defer" else "deny", why)

    def _refusal(self, decision: Literal["deny", "defer"], reason: str) -> dict[str, Any]:
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": decision,
                "permissionDecisionReason": reason,
            }
        }

    async def _end(self, lease_id: str) -> None:
        """End the lease; one already ended (its ttl, a repeated event) or never granted is
        no error."""
        with contextlib.suppress(UnknownJobError, AlreadyEndedError):
            await self._gateway.durable_leases.end(lease_id)

    async def _end_background(self, event: Mapping[str, Any]) -> None:
        """End the oldest background lease of the event's session and agent type."""
        prefix = f"{PREFIX[self._tool]}-{BACKGROUND}:{name_of(_agent_type(event), 60)}:"
        session = event.get("session_id")
        session = name_of(session) if isinstance(session, str) and session else None
        held = [
            v
            for v in self._gateway.leases.views()
            if v.state is LeaseState.GRANTED
            and v.id.startswith(prefix)
            and v.terms.session == session
        ]
        if held:
            await self._end(min(held, key=lambda v: v.granted_at).id)


def _tool_input(event: Mapping[str, Any]) -> Mapping[str, Any]:
    found = event.get("tool_input")
    return found if isinstance(found, Mapping) else {}


def _background(event: Mapping[str, Any]) -> bool:
    return _tool_input(event).get("run_in_background") is True


def _agent_type(event: Mapping[str, Any]) -> str:
    """The subagent's type: ``subagent_type`` of the tool's input, ``agent_type`` of a
    ``SubagentStop``, else ``general-purpose`` (the tool's own default)."""
    found = _tool_input(event).get("subagent_type") or event.get("agent_type")
    return found if isinstance(found, str) and found else "general-purpose"


def _no_room(decision: Decision, estimate: int, source: str, waited_s: float) -> str:
    """Why the call may not start, in words a model can act on: needed, free, what to do."""
    free = None
    if decision.memory is not None and decision.memory_line_bytes is not None:
        used = decision.memory.used_bytes
        if used is not None:
            free = max(0, decision.memory_line_bytes - used - decision.young_reserved_bytes)
    free_text = "unknown" if free is None else f"{free >> 20} MiB"
    waited = f" after waiting {waited_s:g} s" if waited_s else ""
    return (
        f"roomkeeper: not enough memory for this call{waited}: it needs {estimate >> 20} MiB "
        f"({source}), {free_text} is free ({decision.summary}). Wait for running subagents "
        "to finish before starting another, or do this work without a subagent."
    )

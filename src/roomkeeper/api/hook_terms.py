"""The terms of the agent-hook routes: the tools, each tool's modes, the defaults and the
bounds of their query.

Plain Python, no web framework: ``roomkeeper hook`` (a process a tool starts for every
tool call) reads them without loading the API, and :mod:`roomkeeper.api.agent_hooks`
declares its routes from them, so the command and the routes cannot drift apart.
"""

from __future__ import annotations

from typing import Literal, get_args

Tool = Literal["claude-code", "codex"]
Mode = Literal["wait", "deny", "defer"]
CodexMode = Literal["wait", "deny"]
"""Codex's hooks answer allow, deny or ask: it has no ``defer``."""
MODES: dict[str, tuple[str, ...]] = {"claude-code": get_args(Mode), "codex": get_args(CodexMode)}
"""Each tool's modes, as its route declares them."""

DEFAULT_MEMORY_MB = 1024
"""The estimate of a subagent the gateway has learned nothing about, in MiB."""
DEFAULT_WAIT_S = 540.0
"""How long ``wait`` mode holds a call: safely under the 600 s a Claude Code hook may take."""
DEFAULT_TTL_S = 3600.0
"""How long a hook's lease lives unreleased: its subagent cannot heartbeat, so the ttl covers
its whole run, and a lease a crashed tool left behind ends by it."""

MAX_MEMORY_MB = 2**23
"""The largest estimate a call may state, in MiB (8 TiB); the least is 1."""
MAX_WAIT_S = 590.0
"""The longest ``wait`` mode may hold a call: under the 600 s a Claude Code hook may take."""
MAX_TTL_S = 86400.0
"""The longest a hook's lease may live unreleased (a day); it must be more than 0."""

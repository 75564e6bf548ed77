"""Where roomkeeper keeps its state: ROOMKEEPER_HOME and the workspace volume."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def home_dir(env: Mapping[str, str] | None = None, *, create: bool = True) -> Path:
    """ROOMKEEPER_HOME, else ``$XDG_STATE_HOME/roomkeeper``, else ``~/.local/state/roomkeeper``.

    Args:
        env: the environment to read; ``os.environ`` when omitted.
        create: make the directory (mode 0700) if it does not exist yet; it
            holds the journal and, later, the gateway's token.
    """
    env = os.environ if env is None else env
    if env.get("ROOMKEEPER_HOME"):
        path = Path(env["ROOMKEEPER_HOME"]).expanduser()
    elif env.get("XDG_STATE_HOME"):
        path = Path(env["XDG_STATE_HOME"]).expanduser() / "roomkeeper"
    else:
        path = Path(env.get("HOME") or Path.home()).expanduser() / ".local/state/roomkeeper"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def workspace_dir(env: Mapping[str, str] | None = None) -> Path:
    """ROOMKEEPER_WORKSPACE, else ``ROOMKEEPER_HOME/workspace``: the volume the guard judges.

    DESIGN.md's default is ROOMKEEPER_HOME itself; we use a folder inside it
    (the same volume, so the guard judges the same disk) because the
    gateway's token lies in ROOMKEEPER_HOME and must never lie under the
    workspace, where an agent's tool command could find it.  The workspace
    is not created here: a directory that does not exist yet is judged at
    its nearest existing parent (see :func:`roomkeeper.resources.read_disk`).
    """
    env = os.environ if env is None else env
    if env.get("ROOMKEEPER_WORKSPACE"):
        return Path(env["ROOMKEEPER_WORKSPACE"]).expanduser()
    return home_dir(env, create=False) / "workspace"

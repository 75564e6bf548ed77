"""ROOMKEEPER_HOME as the gateway keeps it: the token, the journal, and ``gateway.json``.

``gateway.json`` records the running gateway (its pid, boot id, and where it
listens) for the CLI; a clean stop removes it, so one left behind at start
means the previous run did not stop cleanly.  The token must not lie under
ROOMKEEPER_WORKSPACE, where managed jobs work, so that an agent's tool command
does not find the keys by accident.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import psutil

from roomkeeper.config import read_gateway_settings, read_journal_synchronous
from roomkeeper.errors import UsageError
from roomkeeper.journal.database import Journal
from roomkeeper.paths import write_private

RUN_RECORD = "gateway.json"


def require_token_outside_workspace(home: Path, workspace: Path) -> None:
    """Refuse a workspace that contains the token.

    Raises:
        UsageError: ROOMKEEPER_WORKSPACE contains ROOMKEEPER_HOME's token.
    """
    token_path = (home / "token").resolve()
    if token_path.is_relative_to(workspace.resolve()):
        raise UsageError(
            f"ROOMKEEPER_WORKSPACE ({workspace}) contains the gateway's token "
            f"({token_path}); choose a workspace outside ROOMKEEPER_HOME",
            name="ROOMKEEPER_WORKSPACE",
        )


def open_journal(home: Path, env: Mapping[str, str]) -> Journal:
    """The journal at ROOMKEEPER_HOME/journal.db, with the variables' settings."""
    return Journal(
        home / "journal.db",
        synchronous=read_journal_synchronous(env),
        history_max_events=read_gateway_settings(env).history_max_events,
    )


def unclean_stop_pid(home: Path) -> int | None:
    """The previous gateway's pid if it did not stop cleanly, else None.

    Its pid names the job cgroups that run may have left.  Read it before this
    run writes its own record.
    """
    with contextlib.suppress(OSError, ValueError):
        return int(json.loads((home / RUN_RECORD).read_text())["pid"])
    return None


def write_run_record(home: Path, *, boot_id: str, port: int | None, socket: str | None) -> None:
    """Say in ROOMKEEPER_HOME that this process serves, and where it listens."""
    info = {
        "pid": os.getpid(),
        # With the pid, the start time names this process even after the pid is reused;
        # the CLI checks both (and the boot id /health answers) before it sends the token.
        "started": psutil.Process().create_time(),
        "boot_id": boot_id,
        "port": port,
        "socket": socket,
    }
    # Atomic: a client or the next start never reads half of it.
    write_private(home / RUN_RECORD, json.dumps(info))


def remove_run_record(home: Path) -> None:
    """The clean stop's last word: no record left behind means no crash to recover from."""
    with contextlib.suppress(OSError):
        (home / RUN_RECORD).unlink()

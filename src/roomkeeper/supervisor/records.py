"""What the supervisor writes down for others: its event log and its pid record.

Every stage is a log line on stderr and a JSON line in
``ROOMKEEPER_HOME/recovery/supervisor.log`` (``at`` wall clock, ``mono``
monotonic, ``event``, ``gen`` = the launch number, and codes and numbers
only), so the stages can be read in order with their timestamps.

``ROOMKEEPER_HOME/supervisor.json`` names the running supervisor (pid and
start time), so that ``roomkeeper stop`` reaches it when no gateway answers;
:mod:`roomkeeper.supervisor.service` writes it and removes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from roomkeeper.paths import write_private

log = logging.getLogger("roomkeeper")

EVENT_LOG = "supervisor.log"
RECORD_NAME = "supervisor.json"
"""ROOMKEEPER_HOME/supervisor.json: the running supervisor's pid and start time, so that
``roomkeeper stop`` reaches it when no gateway answers (in a backoff or a cooldown)."""
EVENT_LOG_MAX_BYTES = 1024 * 1024


class EventLog:
    """Stages as JSON lines (``ROOMKEEPER_HOME/recovery/supervisor.log``) and as log lines."""

    def __init__(self, path: Path | None, clock: Callable[[], float]) -> None:
        self.path = path
        self.clock = clock

    def __call__(self, event: str, message: str | None = None, **fields: Any) -> None:
        """Record ``event``; ``message``, when given, also goes to stderr."""
        if message is not None:
            log.warning("supervisor: %s", message)
        if self.path is None:
            return
        line = json.dumps({"at": time.time(), "mono": self.clock(), "event": event, **fields})
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.path.exists() and self.path.stat().st_size > EVENT_LOG_MAX_BYTES:
                os.replace(self.path, self.path.with_suffix(".log.1"))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, (line + "\n").encode())  # one write: a line is never interleaved
            finally:
                os.close(fd)


def read_events(home: Path) -> list[dict[str, Any]]:
    """The supervisor's recorded events, oldest first (for tests and the curious)."""
    path = home / "recovery" / EVENT_LOG
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    # A reader can race the writer: the last line is only whole once its newline is there.
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _start_time(process: psutil.Process) -> float:
    return round(process.create_time(), 2)


def find_supervisor(home: Path) -> psutil.Process | None:
    """The supervisor recorded in ``home``, if that very process still runs.

    The pid must name a live process that started when the record says
    (a reused pid is someone else's process and is never returned).
    """
    try:
        record = json.loads((home / RECORD_NAME).read_text())
        process = psutil.Process(int(record["pid"]))
        if _start_time(process) == float(record["started"]):
            return process
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass
    return None


def write_record(home: Path) -> None:
    """Record this process as the supervisor of ``home`` (best effort)."""
    me = psutil.Process()
    with contextlib.suppress(OSError):  # without it, `roomkeeper stop` needs a gateway
        write_private(
            home / RECORD_NAME,
            json.dumps({"pid": me.pid, "started": _start_time(me)}),
        )


def remove_record(home: Path) -> None:
    """Remove the record if it is still ours (another supervisor may have replaced it)."""
    found = find_supervisor(home)
    if found is not None and found.pid == os.getpid():
        with contextlib.suppress(OSError):
            (home / RECORD_NAME).unlink()

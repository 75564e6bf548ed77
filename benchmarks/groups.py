"""Removing a benchmark's memory groups: whatever is left in them is ours, and killed; and
ending on a SIGTERM (a timeout's) as on Ctrl-C, so that the removal runs."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path


def remove_group(group: Path, deadline_s: float = 30.0) -> list[Path]:
    """SIGKILL what is left in ``group`` and its children, then remove them, children first.

    Returns the directories still there after ``deadline_s`` (none when all went).
    """
    deadline = time.monotonic() + deadline_s
    inner = sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    stuck: list[Path] = []
    for directory in [*inner, group]:
        while True:
            with contextlib.suppress(OSError):
                (directory / "cgroup.kill").write_text("1")  # v2 only
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                directory.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    stuck.append(directory)
                    break
                time.sleep(0.1)
    return stuck


def end_on_sigterm(signum: int, _frame: object) -> None:
    """A SIGTERM handler: exit through ``finally`` blocks (those that remove groups), and take
    no second signal meanwhile."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(128 + signum)

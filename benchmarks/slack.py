"""Memory slack: the time-averaged share of the line left unused while work waits to start.

A contender that leaves room unused while jobs wait is slower than it had to be; one that
fills the line while jobs wait is not.  The meter samples a contender's group every
:data:`EVERY_S`: what the group uses (as roomkeeper's guard counts it: usage less what the
kernel can take back) and which of the swarm's jobs have started (a ``grow.py`` process
naming the job's done file, seen anywhere in the group's tree).  While fewer than all have
started, each sample adds the unused share of the line, ``max(0, line - used) / line``.
It also keeps the highest use sampled (:attr:`SlackMeter.highest`): how close to its limit
a contender ran (a static count that lost nothing may still have run within a few per cent).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from roomkeeper.kernel.cgroup_hierarchy import group_used_bytes

EVERY_S = 0.1


class SlackMeter:
    """Samples one contender's group on a thread of its own, from :meth:`start` to :meth:`stop`.

    Args:
        jobs: how many jobs the swarm has.
        line: the memory line the slack is a share of (bytes).
        version: the cgroup version of the group.
    """

    def __init__(self, jobs: int, line: int, version: int) -> None:
        self._jobs = jobs
        self._line = line
        self._version = version
        self._started: set[str] = set()
        self._unused = 0.0  # share-seconds of the line left unused while work waited
        self._waited = 0.0  # seconds work waited
        self.highest = 0  # the most the group was seen using (bytes, as the guard counts)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, group: Path) -> None:
        self._thread = threading.Thread(target=self._run, args=(group,), daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """The slack (0 to 1), None when no job ever waited to start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self._unused / self._waited if self._waited > 0 else None

    def _run(self, group: Path) -> None:
        last = time.monotonic()
        while not self._stop.wait(EVERY_S):
            self._see_started(group)
            try:
                used = group_used_bytes(str(group), self._version)
            except (OSError, ValueError):
                continue  # the group is going away
            self.highest = max(self.highest, used)
            now = time.monotonic()
            if len(self._started) < self._jobs:
                self._unused += max(0, self._line - used) / self._line * (now - last)
                self._waited += now - last
            last = now

    def _see_started(self, group: Path) -> None:
        for directory, _, files in os.walk(group):
            if "cgroup.procs" not in files:
                continue
            with contextlib.suppress(OSError):
                pids = Path(directory, "cgroup.procs").read_text().split()
                for pid in pids:
                    self._see(pid)

    def _see(self, pid: str) -> None:
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            for index, arg in enumerate(args):
                if arg.endswith(b"grow.py") and len(args) > index + 4:
                    self._started.add(args[index + 4].decode("utf-8", "replace"))
                    return

"""Kernel notifications that wake the pressure monitor at once, where the kernel has them.

- cgroup v1: a threshold on ``memory.usage_in_bytes``, armed through
  ``cgroup.event_control`` with an eventfd (cgroup-v1/memory.rst, "Memory
  thresholds"): the eventfd becomes readable each time usage crosses the
  threshold, either way.  Usage counts the file cache, so it crosses before
  the non-reclaimable "used" does: a wake-up, never a reading.
- cgroup v2: a PSI trigger written to the group's ``memory.pressure``
  (Documentation/accounting/psi.rst, Linux 5.2; an unprivileged writer needs
  a window that is a multiple of 2 s since 6.4, root any), raised as
  POLLPRI; and ``memory.events``, whose changes (``high``, ``max``,
  ``oom``) kernfs announces as POLLPRI on an open file.

Where none can be armed (no permission, a host without the files) the
monitor falls back to plain polling, and says so once.  :class:`Notifier`
holds what was armed; the text written to the kernel is made by pure
functions.  The directory is a parameter, so tests arm fixture files and
real child groups alike.
"""

from __future__ import annotations

import contextlib
import os
import select
from dataclasses import dataclass

PSI_STALL_US = 100_000  # 100 ms of full stall ...
PSI_WINDOW_US = 2_000_000  # ... within a 2 s window (the smallest an unprivileged writer may use)


def threshold_line(event_fd: int, usage_fd: int, threshold_bytes: int) -> str:
    """What ``cgroup.event_control`` takes to arm one usage threshold (v1)."""
    if threshold_bytes < 0:
        raise ValueError(f"a threshold must be >= 0 bytes (got {threshold_bytes})")
    return f"{event_fd} {usage_fd} {threshold_bytes}"


def psi_trigger_line(kind: str, stall_us: int, window_us: int) -> str:
    """What a PSI file takes to arm a trigger: ``some|full STALL_US WINDOW_US``."""
    if kind not in ("some", "full"):
        raise ValueError(f"a PSI trigger is 'some' or 'full' (got {kind!r})")
    if not 0 < stall_us <= window_us:
        raise ValueError(f"the stall must be > 0 and <= the window (got {stall_us}, {window_us})")
    return f"{kind} {stall_us} {window_us}"


@dataclass(frozen=True, slots=True)
class Armed:
    """One armed notification: the fd to poll, the events it raises, and what it is."""

    fd: int
    events: int
    what: str  # in words, for the "monitor wakes on" line
    clear: str  # how a wake-up is cleared: "eventfd" or "reread"


class Notifier:
    """The notifications armed on one group; closed with :meth:`close`.

    Not thread-safe: the monitor's thread owns it.
    """

    def __init__(self) -> None:
        self.armed: list[Armed] = []
        self.failures: list[str] = []  # what could not be armed, and why
        self._keep: list[int] = []  # fds the kernel needs open for a threshold (usage files)

    def arm_v1_thresholds(self, directory: str, thresholds: list[int]) -> None:
        """Arm one eventfd per threshold on ``memory.usage_in_bytes`` of a v1 group."""
        for threshold in thresholds:
            event_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            try:
                usage_fd = os.open(f"{directory}/memory.usage_in_bytes", os.O_RDONLY | os.O_CLOEXEC)
                self._keep.append(usage_fd)
                control = os.open(f"{directory}/cgroup.event_control", os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(control, threshold_line(event_fd, usage_fd, threshold).encode())
                finally:
                    os.close(control)
            except OSError as err:
                os.close(event_fd)
                self.failures.append(f"v1 threshold: {err.strerror or err}")
                return
            self.armed.append(Armed(event_fd, select.POLLIN, f"usage >= {threshold}", "eventfd"))

    def arm_v2(self, directory: str) -> None:
        """Arm a PSI ``full`` trigger on ``memory.pressure`` and watch ``memory.events`` (v2)."""
        try:
            fd = os.open(f"{directory}/memory.pressure", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                os.write(fd, psi_trigger_line("full", PSI_STALL_US, PSI_WINDOW_US).encode() + b"\0")
            except OSError:
                os.close(fd)
                raise
            self.armed.append(Armed(fd, select.POLLPRI, "PSI full trigger", "none"))
        except OSError as err:
            self.failures.append(f"PSI trigger: {err.strerror or err}")
        try:
            fd = os.open(f"{directory}/memory.events", os.O_RDONLY | os.O_CLOEXEC)
            os.read(fd, 4096)  # read once: kernfs raises POLLPRI on the next change
            self.armed.append(Armed(fd, select.POLLPRI, "memory.events", "reread"))
        except OSError as err:
            self.failures.append(f"memory.events: {err.strerror or err}")

    def register(self, poller: select.poll) -> None:
        """Register every armed fd with ``poller``."""
        for armed in self.armed:
            poller.register(armed.fd, armed.events)

    def clear(self, fd: int) -> str | None:
        """Clear a wake-up on ``fd``; what it was, None for an fd that is not ours."""
        for armed in self.armed:
            if armed.fd != fd:
                continue
            with contextlib.suppress(OSError):
                if armed.clear == "eventfd":
                    os.eventfd_read(fd)
                elif armed.clear == "reread":
                    os.lseek(fd, 0, os.SEEK_SET)
                    os.read(fd, 4096)
            return armed.what
        return None

    def describe(self) -> str:
        """What wakes the monitor, in words."""
        if not self.armed:
            return "polling only (" + ("; ".join(self.failures) or "nothing to arm") + ")"
        return ", ".join(a.what for a in self.armed)

    def close(self) -> None:
        """Close every fd (the kernel drops a v1 threshold when its eventfd closes)."""
        for fd in [a.fd for a in self.armed] + self._keep:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.armed, self._keep = [], []

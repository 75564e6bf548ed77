"""The host the readings are taken on: where its kernel files are, and whether it has them.

The platform seam (the platform choice is made once):
:class:`Platform` is the one place the Linux test is written, and a reader
is handed its answer instead of testing ``sys.platform`` again.

The roots are defaults, not fixed paths: every reader takes them as
parameters, so tests point it at captured trees (``tests/kernel_fixtures``).
Defined once here, at the bottom of the package, so that the lifeline
helper (:mod:`roomkeeper.processes.lifeline`) can share them without loading the
readers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

PROC_ROOT = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True, slots=True)
class Platform:
    """The platform readings are taken on, and whether it has the kernel's files.

    Linux has cgroups, ``/proc/meminfo`` and PSI.  Anywhere else memory is
    psutil's portable reading, there is no pressure, and the guard has no
    container to protect.

    Attributes:
        name: the platform as ``sys.platform`` spells it (tests give another).
        linux: whether the kernel's files are there to read.
    """

    name: str
    linux: bool

    @classmethod
    def named(cls, name: str) -> Platform:
        """The platform called ``name`` (``sys.platform``'s spelling): the one Linux test."""
        return cls(name, name.startswith("linux"))


THIS_PLATFORM = Platform.named(sys.platform)

"""The host the readings are taken on: where its kernel files are.

The roots are defaults, not fixed paths: every reader takes them as
parameters, so tests point it at captured trees (``shared/fixtures``).
Defined once here, at the bottom of the package, so that the lifeline
helper (:mod:`roomkeeper.jobs.lifeline`) can share them without loading the
readers.
"""

from __future__ import annotations

PROC_ROOT = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"

"""``roomkeeper batch`` as a user runs it, in a child process with a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fakes import NO_DISK


def batch(
    tmp_path: Path, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    # A small /tmp (the cgroup v2 VM's is 1.5 GB) must not refuse launches: the
    # disk rule has its own tests.  A batch has no CPU gate unless asked.
    clean.update(ROOMKEEPER_HOME=str(tmp_path / "home"), **NO_DISK, **env)
    return subprocess.run(
        [sys.executable, "-m", "roomkeeper", "batch", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=clean,
        timeout=120,
        check=False,
    )

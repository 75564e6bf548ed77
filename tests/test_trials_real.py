"""Trials on the real kernel: `roomkeeper batch` with nothing learned, in a real 2 GB group."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from roomkeeper.kernel.oom_kills import group_oom_kills as oom_kills
from roomkeeper.kernel.oom_kills import machine_oom_kills
from tests.cgroups import child_memory_cgroup

pytestmark = [pytest.mark.kernel, pytest.mark.cgroups]

GROW = Path(__file__).resolve().parents[1] / "benchmarks" / "grow.py"


def test_lines_that_do_not_fit_start_on_trial_are_paused_and_all_finish(tmp_path: Path) -> None:
    """Four 500 MB lines, each expected at 700 MB, in 2 GB (line 1.8 GB): two fit, two start
    on trial beside them, are paused while the first two grow, and go on; every line ends
    with exit 0, nothing is stopped, and the kernel kills nothing."""
    commands = tmp_path / "commands.txt"
    commands.write_text(f"{sys.executable} {GROW} 500000000 4 1\n" * 4)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(
        ROOMKEEPER_HOME=str(tmp_path / "home"),
        ROOMKEEPER_JOB_MEMORY_MB="700",
        ROOMKEEPER_CPU_PRESSURE_PERCENT="100",
        ROOMKEEPER_JOB_DISK_MB="0",
        ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
        PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"),
    )
    with child_memory_cgroup(2_000_000_000) as (version, group):
        joiner = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
        argv = [sys.executable, "-m", "roomkeeper", "batch", str(commands), "--quiet"]
        before = machine_oom_kills()
        done = subprocess.run(
            [*joiner, *argv], capture_output=True, text=True, env=env, timeout=300, check=False
        )
        kills = (oom_kills(group, version), machine_oom_kills() - before)
    err = done.stderr
    assert (done.returncode, *kills) == (0, 0, 0), err[-3000:]
    assert "4 commands, 0 failed" in err, err
    assert re.search(r"^roomkeeper batch: line [34] paused on trial", err, re.M), err
    counts = re.search(r"^memory pressure: .*stops (\d+), .*; trial pauses (\d+)$", err, re.M)
    assert counts is not None, err
    stops, pauses = map(int, counts.groups())
    assert stops == 0 and pauses >= 1, err

"""Trials on the real kernel: `roomkeeper batch` with nothing learned, in a real 2 GB group."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cgroups import batch_env, machine_kills_counted, memory_box

pytestmark = [pytest.mark.kernel, pytest.mark.cgroups]

GROW = Path(__file__).resolve().parents[1] / "benchmarks" / "grow.py"


def test_lines_that_do_not_fit_start_on_trial_are_paused_and_all_finish(tmp_path: Path) -> None:
    """Four 400 MB lines, each expected at 1.68 GB, in 2 GB (line 1.8 GB): the first fits
    (maybe the second, if the first still looks small), the rest start on trial, are paused
    while an older line grows (its claim is the rest of its estimate, whatever the machine's
    speed), and go on; every line ends with exit 0, nothing is stopped, and the kernel kills
    nothing (four at their peak hold 1.6 GB: no rung of the ladder is needed)."""
    commands = tmp_path / "commands.txt"
    commands.write_text(f"{sys.executable} {GROW} 400000000 4 1\n" * 4)
    env = batch_env(tmp_path)
    with memory_box(2_000_000_000) as box, machine_kills_counted() as machine_kills:
        argv = [sys.executable, "-m", "roomkeeper", "batch", str(commands), "--quiet"]
        argv += ["--job-memory", "1600M"]  # stated: a default would be a quarter of the line
        done = subprocess.run(
            box.argv(argv),
            capture_output=True,
            text=True,
            env={**env, **box.env()},
            timeout=300,
            check=False,
        )
        kills = (box.oom_kills(), machine_kills())
    err = done.stderr
    assert (done.returncode, *kills) == (0, 0, 0), err[-3000:]
    assert "4 commands, 0 failed" in err, err
    assert re.search(r"^roomkeeper batch: line [234] paused on trial", err, re.M), err
    counts = re.search(r"^memory pressure: .*stops (\d+), .*; trial pauses (\d+)$", err, re.M)
    assert counts is not None, err
    stops, pauses = map(int, counts.groups())
    assert stops == 0 and pauses >= 1, err

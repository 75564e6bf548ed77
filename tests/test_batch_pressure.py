"""`roomkeeper batch` under memory pressure: suspensions and stops printed as they come, counted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cgroups import MemoryBox, batch_env, machine_kills_counted, memory_box

pytestmark = [pytest.mark.kernel, pytest.mark.cgroups]

GROW = Path(__file__).resolve().parents[1] / "benchmarks" / "grow.py"


def _three_lines_in_2_gb(tmp_path: Path, lines: str, **settings: str) -> tuple[str, MemoryBox]:
    """Run ``lines`` (three) at once in a fresh 2 GB group, each stated at 100M, with
    ``settings`` (ROOMKEEPER_* variables): its stderr and the group, once it exited 0 with no
    OOM kill anywhere."""
    commands = tmp_path / "commands.txt"
    commands.write_text(lines)
    env = batch_env(tmp_path, ROOMKEEPER_PRESSURE_COOLDOWN="2", **settings)
    with memory_box(2_000_000_000) as box, machine_kills_counted() as machine_kills:
        argv = [sys.executable, "-m", "roomkeeper", "batch", str(commands), "--max-running", "3"]
        done = subprocess.run(
            box.argv([*argv, "--job-memory", "100M", "--quiet"]),
            capture_output=True,
            text=True,
            env={**env, **box.env()},
            timeout=600,
            check=False,
        )
        kills = (box.oom_kills(), machine_kills())
    assert (done.returncode, *kills) == (0, 0, 0), done.stderr[-3000:]
    return done.stderr, box


def test_batch_prints_each_suspension_and_stop_and_counts_them(tmp_path: Path) -> None:
    """Three 750 MB lines in 2 GB: a line each for suspend and stop, counts in the summary."""
    # Slow growth: a busy CI still sees the suspend line.
    err, box = _three_lines_in_2_gb(tmp_path, f"{sys.executable} {GROW} 750000000 16 2\n" * 3)
    assert re.search(r"^roomkeeper batch: line 3 suspended for memory pressure", err, re.M), err
    # A job group's freezer where groups are made; in a read-only layout, SIGSTOP to the tree.
    way = ("v1 freezer" if box.version == 1 else "cgroup.freeze") if box.made else "SIGSTOP"
    assert re.search(rf"^roomkeeper: INFO job 3 frozen by {way}$", err, re.M), err
    stopped = re.findall(r"^roomkeeper batch: line (\d) stopped for memory pressure", err, re.M)
    assert stopped == ["3"], err
    # The line names the estimate the scheduler queued it again with, grown from its run
    # (at least twice the 100M it ran with), not the run's peak.
    said = re.search(r"line 3 stopped .*; it runs again with an estimate of ([\d.]+) ([MG])B", err)
    queued = re.search(r"job 3 queued again .*, estimate ([\d.]+) GB \(peak", err)
    assert said is not None and queued is not None, err
    estimate = float(said[1]) * (1e9 if said[2] == "G" else 1e6)  # as people count, decimal
    assert estimate >= 200_000_000, err
    assert abs(estimate - float(queued[1]) * 1e9) <= 60_000_000, err
    counts = re.search(
        r"^memory pressure: holds (\d+), suspensions (\d+), stops (\d+), "
        r"re-runs (\d+), reaction p50 [\d.]+ ms, max [\d.]+ ms; trial pauses \d+$",
        err,
        re.M,
    )
    assert counts is not None, err
    holds, suspensions, stops, reruns = map(int, counts.groups())
    assert holds >= 1 and suspensions >= 1 and (stops, reruns) == (1, 1)
    assert "3 commands, 0 failed" in err


def test_frozen_lines_waiting_on_each_other_are_unblocked_by_stopping_the_newest(
    tmp_path: Path,
) -> None:
    """Rent or buy on the real kernel: two lines frozen together past the suspend line wait
    for a long first line's end.  Once the two have waited together as long as the newest had
    run, it is stopped (and run again later), the other goes on at once, and nothing is killed."""
    # 30 % headroom: 0.3 GB between the line and the suspend line.  Frozen there, the lines
    # stay blocked even when the kernel turns file pages inactive (0.2 GB on a cgroup v2
    # kernel), which lowers used and would let them go on unstopped.
    err, _ = _three_lines_in_2_gb(
        tmp_path,
        f"{sys.executable} {GROW} 400000000 1 20\n"  # the oldest: small, long
        + f"{sys.executable} {GROW} 800000000 5 1\n" * 2,  # together past the suspend line
        ROOMKEEPER_MEMORY_HEADROOM_PERCENT="30",
    )
    frozen = re.findall(r"^roomkeeper batch: line (\d) suspended for memory pressure", err, re.M)
    assert sorted(set(frozen)) == ["2", "3"], err
    stopped = re.search(
        r"job 3 stopped \(output kept\).*: 2 suspended tree\(s\) idle (\d+) s together since "
        r"it was suspended \d+ s ago, after running (\d+) s",
        err,
    )
    assert stopped is not None, err
    assert int(stopped[1]) >= int(stopped[2]), err
    assert err.index("line 2 resumed") > stopped.start(), err  # it went on once 3 was gone
    assert "3 commands, 0 failed" in err

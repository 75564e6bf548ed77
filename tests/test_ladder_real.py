"""The relief ladder on the real kernel: three jobs outgrow a 2 GB group and no OOM kill comes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cgroups import MemoryBox, machine_kills_counted, memory_box

pytestmark = [pytest.mark.kernel, pytest.mark.cgroups]

SCENARIO = Path(__file__).resolve().parents[1] / "benchmarks" / "ladder_scenario.py"
LIMIT = 2_000_000_000
COOLDOWN_S = 3.0  # short, by the variable: the scenario passes it as ROOMKEEPER_PRESSURE_COOLDOWN


def run_scenario(box: MemoryBox, logs: Path) -> dict[str, Any]:
    """Run the scenario inside ``box`` (its limit is the scheduler's line); its JSON."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.update(box.env())
    scenario = [sys.executable, str(SCENARIO), str(logs), "750000000", "8", "2", str(COOLDOWN_S)]
    done = subprocess.run(
        box.argv(scenario),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # the emulated v2 kernel is several times slower
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr
    return result


def test_newest_is_suspended_then_stopped_the_others_finish_and_no_oom_kill(
    tmp_path: Path,
) -> None:
    """3 x 750 MB in 2 GB: newest suspended then stopped, no OOM kill, cooldown held, re-run."""
    with memory_box(LIMIT) as box:
        if box.made and box.version == 1:  # no swap here; keep it that way where swap exists
            with contextlib.suppress(OSError):
                (box.group / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        with machine_kills_counted() as machine_kills:
            result = run_scenario(box, tmp_path / "logs")
            kills = (box.oom_kills(), machine_kills())
    assert kills == (0, 0), result["log"][-3000:]
    jobs = result["jobs"]
    steps = result["steps"]
    suspensions = [job for step, job, _ in steps if step == "suspend"]
    stops = [(job, at) for step, job, at in steps if step == "stop"]
    assert suspensions[0] == "newest", steps
    assert stops and stops[0][0] == "newest", steps
    assert "oldest" not in suspensions and "oldest" not in [j for j, _ in stops]
    for name in ("oldest", "middle"):
        assert (jobs[name]["final"], jobs[name]["exit_code"]) == ("exited", 0), jobs[name]
    newest = jobs["newest"]
    assert "suspended" in newest["states"]
    assert newest["reasons"][newest["states"].index("suspended")] == "memory_pressure"
    assert newest["states"].count("running") == 2  # stopped, queued again, run again
    assert (newest["final"], newest["exit_code"]) == ("exited", 0)
    stopped_at = stops[0][1]
    later = [at for _, at in result["launches"] if at > stopped_at]
    assert later, "admission never came back after the cooldown"
    assert min(later) >= stopped_at + COOLDOWN_S - 0.05, (min(later) - stopped_at, result)
    assert result["holds"] >= 1 and result["reruns"] == 1
    assert result["reaction_max_s"] is not None

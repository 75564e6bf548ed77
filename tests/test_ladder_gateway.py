"""The relief ladder in a real gateway in a 1 GB group: strict work stopped, restartable re-run."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cgroups import machine_kills_counted, memory_box
from tests.gateways import gateway_in_box, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.cgroups]

GROW = Path(__file__).resolve().parents[1] / "benchmarks" / "grow.py"
LIMIT = 1_000_000_000  # line 0.90, suspend past 0.95, stop past 0.975 GB
MB = 10**6


def grower(size: int, grow_s: float, hold_s: float) -> list[str]:
    """A job that says it started, then grows to ``size`` bytes and holds them."""
    return ["/bin/sh", "-c", f"echo started; exec {sys.executable} {GROW} {size} {grow_s} {hold_s}"]


def submit(client: httpx.Client, argv: list[str], memory: int, **extra: Any) -> str:
    answer = client.post("/v1/jobs", json={"argv": argv, "memory_bytes": memory, **extra})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    return dict(client.get(f"/v1/jobs/{job_id}").json())


def final(client: httpx.Client, job_id: str, timeout: float = 300) -> dict[str, Any]:
    final_states = {"exited", "stopped", "failed", "cancelled", "timed_out"}
    wait_until(lambda: job(client, job_id)["state"] in final_states, f"{job_id}'s end", timeout)
    return job(client, job_id)


def pair(client: httpx.Client, **newer: Any) -> tuple[str, str]:
    """An older job growing to 0.5 GB and a newer one to 0.6 GB: together past the limit."""
    older = submit(client, grower(500 * MB, 4, 4), 450 * MB, owner="a")
    wait_until(lambda: job(client, older)["state"] == "running", "the older job's start", 120)
    time.sleep(0.5)
    return older, submit(client, grower(600 * MB, 4, 1), 50 * MB, owner="b", **newer)


def test_strict_job_is_stopped_and_kept_a_restartable_one_runs_again(tmp_path: Path) -> None:
    """Outgrowing its estimate: strict work stops for good (output kept); restartable runs again."""
    with memory_box(LIMIT) as box, machine_kills_counted() as machine_kills:
        with gateway_in_box(box, tmp_path) as (client, log_path):
            older, strict = pair(client)
            stopped = final(client, strict)
            assert final(client, older)["state"] == "exited"
            strict_output = client.get(f"/v1/jobs/{strict}/output").text
            older2, restartable = pair(client, restartable=True)
            again = final(client, restartable, timeout=400)
            assert final(client, older2)["exit_code"] == 0
            again_output = client.get(f"/v1/jobs/{restartable}/output").text
            assert job(client, strict) == stopped  # still stopped: nothing re-ran it
            history = client.get("/v1/history").json()
            pressure = client.get("/v1/status").json()["pressure"]
            metrics = client.get("/metrics").text
        kills = (box.oom_kills(), machine_kills())
        log = log_path.read_text()
    assert kills == (0, 0), log[-3000:]
    assert (stopped["state"], stopped["reason"]) == ("stopped", "memory_pressure"), log[-3000:]
    assert strict_output == "started\n"  # its output kept, and one run only
    assert f"job {strict} queued again" not in log
    assert (again["state"], again["exit_code"]) == ("exited", 0), log[-3000:]
    assert again_output == "started\nstarted\n"  # the first run's output kept, then the second
    (requeued,) = [line for line in log.splitlines() if f"job {restartable} queued again" in line]
    estimate = float(requeued.rsplit("estimate ", 1)[1].split()[0])
    peak = float(requeued.rsplit("(peak ", 1)[1].split()[0])
    # Grown from its first run: at least its peak and twice the 0.05 that failed, at most
    # the line.
    assert 0.3 <= peak <= estimate <= 0.9 and estimate >= 0.1, requeued
    assert pressure["stops"] == 2 and pressure["reruns"] == 1, pressure
    assert pressure["reaction_max_s"] is not None
    # A read-only cgroup file system takes no PSI trigger: memory.events wakes it there.
    expected_wake = "usage >= " if box.version == 1 else "PSI full trigger"
    expected_wake = expected_wake if box.made else "memory.events"
    assert pressure["wakes_on"].startswith(expected_wake), pressure["wakes_on"]
    assert f'roomkeeper_pressure_steps_total{{step="stop"}} {2.0}' in metrics
    codes = [e["code"] for e in history]
    assert "pressure_stopped" in codes and "pressure_hold" in codes, codes

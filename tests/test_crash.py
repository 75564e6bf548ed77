"""The save-first promise under random SIGKILLs of the whole gateway tree (6 kills here)."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.gateways import RunningGateway, kill_whole_tree, running_gateway

pytestmark = pytest.mark.kernel

# Six kills, each with a restart and a second kill: the promise is checked at every one;
# benchmarks/bench_crash.py runs 200 (the suite must stay short beside other work).
KILLS = 6
ENV = {"ROOMKEEPER_MAX_RUNNING": "4", "ROOMKEEPER_MAX_RUNNING_PER_OWNER": "4"}


def submitter(
    gw: RunningGateway,
    out: Path,
    rng: random.Random,
    accepted: dict[str, tuple[str, bool]],
    stop: threading.Event,
) -> None:
    """Submit jobs that append their tag to ``out`` until told to stop (or the gateway dies)."""
    while not stop.is_set():
        tag = uuid.uuid4().hex[:10]
        resumable = rng.random() < 0.3
        command = f"echo {tag} >> {out}; sleep {rng.uniform(0, 0.3):.2f}"
        try:
            answer = gw.client.post(
                "/v1/jobs", json={"argv": ["sh", "-c", command], "resumable": resumable}, timeout=5
            )
        except httpx.HTTPError:
            return  # killed mid-request: never acknowledged, so never promised
        if answer.status_code == 201:
            accepted[answer.json()["id"]] = (tag, resumable)
        time.sleep(rng.uniform(0, 0.05))


def raw_state(home: Path) -> tuple[dict[str, str], set[str], set[str]]:
    """Jobs' states, the pending markers and the resumable jobs, straight from the journal."""
    with sqlite3.connect(home / "journal.db", timeout=30) as conn:
        states = dict(conn.execute("SELECT id, state FROM jobs").fetchall())
        markers = {r[0] for r in conn.execute("SELECT id FROM markers WHERE kind='job'")}
        resumable = {r[0] for r in conn.execute("SELECT id FROM jobs WHERE resumable")}
    return states, markers, resumable


def crash_cycle(
    home_dir: Path, out: Path, rng: random.Random, accepted: dict[str, tuple[str, bool]]
) -> tuple[list[str], int]:
    """One kill of a working gateway, a restart, a kill of that; the broken promises, if any.

    Returns:
        (violations described in words, how many jobs were uncertain after the restart)
    """
    violations: list[str] = []
    with running_gateway(home_dir, **ENV) as gw:
        stop = threading.Event()
        thread = threading.Thread(target=submitter, args=(gw, out, rng, accepted, stop))
        thread.start()
        time.sleep(rng.uniform(0.3, 1.5))
        kill_whole_tree(gw)
        stop.set()
        thread.join(10)
    # Resumable as submitted: a job whose answer the kill cut off is not in `accepted`.
    states, markers, resumable_ids = raw_state(home_dir / "home")
    # Only a persisted outcome clears a marker: a job still "running" keeps it.
    violations += [
        f"{i} running without a marker"
        for i, s in states.items()
        if s == "running" and i not in markers
    ]
    # A marker belongs to work launched and not settled: running, or uncertain from before.
    violations += [
        f"marker of {i} ({states.get(i)})"
        for i in markers
        if states.get(i) not in ("running", "waiting", "uncertain")
    ]
    # In flight: launched (a marker) or recorded as running, and not settled before.
    running_at_kill = {i for i, s in states.items() if s == "running"} | {
        i for i in markers if states.get(i) != "uncertain"
    }
    uncertain = 0
    with running_gateway(home_dir, **ENV) as gw:
        for job_id in accepted:
            if gw.client.get(f"/v1/jobs/{job_id}").status_code != 200:
                violations.append(f"acknowledged job {job_id} lost")
        for job_id in running_at_kill:
            state = gw.client.get(f"/v1/jobs/{job_id}").json()["state"]
            resumable = job_id in resumable_ids
            allowed = {"uncertain"} | (
                {"deferred", "waiting", "running", "exited"} if resumable else set()
            )
            if state not in allowed:
                violations.append(f"{job_id} running at the kill is {state}")
            uncertain += state == "uncertain"
        kill_whole_tree(gw)  # the restart's own kill: recovery must hold twice over
    counts: dict[str, int] = {}
    for line in out.read_text().split():
        counts[line] = counts.get(line, 0) + 1
    violations += [
        f"{t} ran twice"
        for t, resumable in accepted.values()
        if not resumable and counts.get(t, 0) > 1
    ]
    return violations, uncertain


def test_random_kills_never_lose_or_blindly_replay_work(tmp_path: Path) -> None:
    """After each of 6 kills: all acknowledged jobs found, no cleared marker without an outcome,
    no non-resumable job run twice, and everything running at the kill uncertain or settled."""
    rng = random.Random(20261129)
    out = tmp_path / "appends"
    out.touch()
    accepted: dict[str, tuple[str, bool]] = {}
    uncertain = 0
    for _ in range(KILLS):
        violations, seen = crash_cycle(tmp_path, out, rng, accepted)
        assert violations == []
        uncertain += seen
    assert len(accepted) >= KILLS  # the workload really ran
    assert uncertain > 0  # and kills really landed while jobs ran

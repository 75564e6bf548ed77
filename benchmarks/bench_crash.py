"""Crash benchmark: 200 SIGKILLs of the whole gateway tree, and what durability costs.

1. The save-first promise under 200 kills: a real gateway runs
   jobs that append their tag to a file while a client submits more; the
   gateway with every descendant is SIGKILLed at a random moment, restarted,
   checked, and SIGKILLed again.  After each kill: every acknowledged job is
   in the journal, no marker was cleared without a persisted outcome, no
   non-resumable job ran twice, and work running at the kill is uncertain
   (or, if resumable, deferred or settled).  tests/test_crash.py makes the
   same checks over 8 kills; a change to one belongs in both.
2. The cost of the durable marker: jobs per second through the API (4
   clients submitting `true`, until all have exited) with the journal at
   synchronous=FULL against synchronous=OFF.

Needs root (for the whole-tree kill it only needs to own the processes).
Usage: python benchmarks/bench_crash.py [--kills 200] [--jobs 400]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from live_gateway import RunningGateway, kill_whole_tree, running_gateway

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


def crash_cycles(kills: int) -> None:
    rng = random.Random(7)
    violations: list[str] = []
    uncertain = 0
    with tempfile.TemporaryDirectory() as tmp:
        home_dir = Path(tmp)
        out = home_dir / "appends"
        out.touch()
        accepted: dict[str, tuple[str, bool]] = {}
        start = time.monotonic()
        for n in range(1, kills + 1):
            broken, seen = crash_cycle(home_dir, out, rng, accepted)
            violations += broken
            uncertain += seen
            if n % 20 == 0:
                print(
                    f"  {n} kills: {len(accepted)} jobs acknowledged, "
                    f"{len(violations)} violations, "
                    f"{uncertain} uncertain, {time.monotonic() - start:.0f} s",
                    flush=True,
                )
        print(
            f"crash: {kills} kills (+{kills} kills of the restarted gateway), "
            f"{len(accepted)} jobs acknowledged, {len(violations)} invariant violations",
            flush=True,
        )
        for line in violations[:20]:
            print(f"  violation: {line}")


def throughput(sync: str, jobs: int) -> float:
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_gateway(
            Path(tmp),
            ROOMKEEPER_JOURNAL_SYNCHRONOUS=sync,
            ROOMKEEPER_MAX_RUNNING="4",
            ROOMKEEPER_MAX_RUNNING_PER_OWNER="4",
            ROOMKEEPER_MAX_WAITING="100000",
            ROOMKEEPER_MAX_WAITING_PER_OWNER="100000",
        ) as gw,
    ):
        ids: list[str] = []
        lock = threading.Lock()

        def client(count: int) -> None:
            for _ in range(count):
                job_id = gw.client.post("/v1/jobs", json={"argv": ["true"]}).json()["id"]
                with lock:
                    ids.append(job_id)

        start = time.monotonic()
        threads = [threading.Thread(target=client, args=(jobs // 4,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        while True:
            exited = gw.client.get("/v1/jobs", params={"state": "exited"}).json()
            if len(exited) >= len(ids):
                break
            time.sleep(0.1)
        return len(ids) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=400)
    args = parser.parse_args()
    for sync in ("FULL", "OFF"):
        print(
            f"durability {sync}: {throughput(sync, args.jobs):.1f} jobs/s "
            f"({args.jobs} jobs of `true` through the API, 4 clients)",
            flush=True,
        )
    crash_cycles(args.kills)


if __name__ == "__main__":
    main()

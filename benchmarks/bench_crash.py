"""Crash benchmark: 200 SIGKILLs of the whole gateway tree, and what durability costs.

1. The suite's crash test (tests/test_crash.py) at scale: a real gateway runs
   jobs that append their tag to a file while a client submits more; the
   gateway with every descendant is SIGKILLed at a random moment, restarted,
   checked, and SIGKILLed again.  After each kill: every acknowledged job is
   in the journal, no marker was cleared without a persisted outcome, no
   non-resumable job ran twice, and work running at the kill is uncertain
   (or, if resumable, deferred or settled).
2. The cost of the durable marker: jobs per second through the API (4
   clients submitting `true`, until all have exited) with the journal at
   synchronous=FULL against synchronous=OFF.

Needs root (for the whole-tree kill it only needs to own the processes).
Usage: python benchmarks/bench_crash.py [--kills 200] [--jobs 400]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.gateways

from tests.gateways import kill_whole_tree, running_gateway
from tests.test_crash import ENV, raw_state, submitter


def crash_cycles(kills: int) -> None:
    rng = random.Random(7)
    violations = 0
    with tempfile.TemporaryDirectory() as tmp:
        home_dir = Path(tmp)
        out = home_dir / "appends"
        out.touch()
        accepted: dict[str, tuple[str, bool]] = {}
        uncertain_seen = 0
        start = time.monotonic()
        for n in range(1, kills + 1):
            with running_gateway(home_dir, **ENV) as gw:
                stop = threading.Event()
                thread = threading.Thread(target=submitter, args=(gw, out, rng, accepted, stop))
                thread.start()
                time.sleep(rng.uniform(0.3, 1.5))
                kill_whole_tree(gw)
                stop.set()
                thread.join(10)
            states, markers = raw_state(home_dir / "home")
            violations += sum(1 for i, s in states.items() if s == "running" and i not in markers)
            violations += sum(
                1 for i in markers if states.get(i) not in ("running", "waiting", "uncertain")
            )
            running_at_kill = {i for i, s in states.items() if s == "running"}
            with running_gateway(home_dir, **ENV) as gw:
                for job_id in accepted:
                    if gw.client.get(f"/v1/jobs/{job_id}").status_code != 200:
                        violations += 1
                for job_id in running_at_kill:
                    state = gw.client.get(f"/v1/jobs/{job_id}").json()["state"]
                    resumable = accepted.get(job_id, ("", False))[1]
                    ok = {"uncertain"} | (
                        {"deferred", "waiting", "running", "exited"} if resumable else set()
                    )
                    violations += state not in ok
                    uncertain_seen += state == "uncertain"
                kill_whole_tree(gw)
            counts: dict[str, int] = {}
            for line in out.read_text().split():
                counts[line] = counts.get(line, 0) + 1
            violations += sum(1 for t, r in accepted.values() if not r and counts.get(t, 0) > 1)
            if n % 20 == 0:
                print(
                    f"  {n} kills: {len(accepted)} jobs acknowledged, {violations} violations, "
                    f"{uncertain_seen} uncertain, {time.monotonic() - start:.0f} s",
                    flush=True,
                )
        print(
            f"crash: {kills} kills (+{kills} kills of the restarted gateway), "
            f"{len(accepted)} jobs acknowledged, {violations} invariant violations",
            flush=True,
        )


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

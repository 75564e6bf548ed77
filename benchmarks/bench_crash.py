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

from tests.gateways import running_gateway
from tests.test_crash import crash_cycle


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

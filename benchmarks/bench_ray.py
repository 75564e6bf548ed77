"""The Ray backend against the local one: jobs per second, and the latency it adds per job.

Starts a local Ray cluster on loopback (a head with no CPUs and two worker
nodes of 2 CPUs each, every one ``ray start`` in its own process group:
``local_ray.py`` beside this file), then two gateways on the same machine,
one with ROOMKEEPER_BACKEND=local and one with ROOMKEEPER_BACKEND=ray, and
runs through each:

After a warm-up (2 jobs one after the other, then 8 at once, so that Ray
has started a worker for each of the 4 slots):

1. Latency: ``--sequential`` jobs of ``true``, one after the other; for
   each, the time from submission to its recorded end (the journal's
   ``ended_at - submitted_at``, both taken by the gateway), median and max.
   The ray backend's figure less the local one is the latency it adds.
2. Throughput: ``--jobs`` jobs of ``true`` submitted at once; the time from
   the first submission until the last one has ended, as jobs per second
   (at most ROOMKEEPER_MAX_RUNNING, 4, run at a time in either backend).

For every job measured, its submit-to-start latency (``started_at -
submitted_at``, both the gateway's), p50 and p99; and throughout, a prober
thread asks ``GET /health`` every 20 ms: its p99.  ``--cpu-hog N`` runs
``stress-ng --cpu N`` beside it all (the machine busy, as a shared one is).

Usage (from the repository root):
    PYTHONPATH=src python benchmarks/bench_ray.py [--jobs 40] [--sequential 10] [--cpu-hog 2]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from live_gateway import RunningGateway, running_gateway
from local_ray import local_cluster

MB = 1_000_000
POLL_S = 0.01
STARTS: list[float] = []  # submit-to-start of every measured job, seconds


def wait_ended(gw: RunningGateway, job_ids: list[str]) -> list[dict[str, Any]]:
    """Poll until every job has ended; their final views."""
    ended: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 600
    while len(ended) < len(job_ids):
        for job_id in job_ids:
            if job_id in ended:
                continue
            view = gw.client.get(f"/v1/jobs/{job_id}").json()
            if view["state"] not in ("waiting", "running"):
                if view["state"] != "exited" or view["exit_code"] != 0:
                    raise SystemExit(f"job {job_id} ended {view['state']}: {view}")
                ended[job_id] = view
        if time.monotonic() > deadline:
            raise SystemExit("jobs did not end within 600 s")
        time.sleep(POLL_S)
    return [ended[j] for j in job_ids]


def submit(gw: RunningGateway) -> str:
    answer = gw.client.post("/v1/jobs", json={"argv": ["true"], "memory_bytes": 50 * MB})
    answer.raise_for_status()
    return str(answer.json()["id"])


def latency(gw: RunningGateway, count: int) -> list[float]:
    """Submission to recorded end, seconds, for ``count`` jobs run one at a time."""
    times = []
    for _ in range(count):
        (view,) = wait_ended(gw, [submit(gw)])
        times.append(view["ended_at"] - view["submitted_at"])
        STARTS.append(view["started_at"] - view["submitted_at"])
    return times


def throughput(gw: RunningGateway, count: int) -> float:
    """Jobs per second for ``count`` jobs submitted at once."""
    start = time.monotonic()
    ids = [submit(gw) for _ in range(count)]
    views = wait_ended(gw, ids)
    rate = count / (time.monotonic() - start)
    runs = [v["ended_at"] - v["started_at"] for v in views]
    waits = [v["started_at"] - v["submitted_at"] for v in views]
    STARTS.extend(waits)
    print(
        f"  batch: start to end median {statistics.median(runs) * 1000:.1f} ms, "
        f"max {max(runs) * 1000:.1f} ms; waited median {statistics.median(waits) * 1000:.1f} ms",
        flush=True,
    )
    return rate


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


@contextlib.contextmanager
def probing(url: str) -> Iterator[list[float]]:
    """GET /health every 20 ms on a thread, on its own connection; the latencies, seconds."""
    found: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not done.is_set():
                start = time.perf_counter()
                client.get("/health").raise_for_status()
                found.append(time.perf_counter() - start)
                time.sleep(0.02)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        done.set()
        thread.join()


def measure(gw: RunningGateway, args: argparse.Namespace) -> tuple[list[float], float]:
    print(f"{gw.url}:", flush=True)
    # Warm-up: first imports, and as many Ray workers as jobs run at once (Ray
    # starts a worker, a fresh Python, the first time a slot needs one).
    latency(gw, 2)
    throughput(gw, 8)
    STARTS.clear()
    with probing(gw.url) as health:
        measured = latency(gw, args.sequential), throughput(gw, args.jobs)
    print(
        f"  submit to start: p50 {percentile(STARTS, 0.5) * 1000:.1f} ms, "
        f"p99 {percentile(STARTS, 0.99) * 1000:.1f} ms (n={len(STARTS)}); "
        f"/health p99 {percentile(health, 0.99) * 1000:.1f} ms, "
        f"max {max(health) * 1000:.1f} ms (n={len(health)})",
        flush=True,
    )
    return measured


@contextlib.contextmanager
def cpu_hog(workers: int) -> Iterator[None]:
    """``stress-ng --cpu N`` beside the benchmark (our own process, stopped at the end)."""
    if not workers:
        yield
        return
    hog = subprocess.Popen(["stress-ng", "--cpu", str(workers), "--quiet"])
    print(f"beside stress-ng --cpu {workers}", flush=True)
    try:
        yield
    finally:
        hog.send_signal(signal.SIGINT)
        hog.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--sequential", type=int, default=10)
    parser.add_argument("--cpu-hog", type=int, default=0, help="stress-ng --cpu N beside it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as where, cpu_hog(args.cpu_hog):
        run(Path(where), args)


def run(tmp: Path, args: argparse.Namespace) -> None:
    """Both backends' figures, printed."""
    extra = {"ROOMKEEPER_MAX_WAITING": "1000", "ROOMKEEPER_MAX_WAITING_PER_OWNER": "1000"}
    results: dict[str, tuple[list[float], float]] = {}
    with running_gateway(tmp / "local", **extra) as gw:
        results["local"] = measure(gw, args)
    with (
        local_cluster({"n1": 2000 * MB, "n2": 2000 * MB}) as cluster,
        running_gateway(
            tmp / "ray", ROOMKEEPER_BACKEND="ray", ROOMKEEPER_RAY_ADDRESS=cluster.address, **extra
        ) as gw,
    ):
        results["ray"] = measure(gw, args)
    print(f"{'backend':8} {'median latency':>15} {'max latency':>12} {'jobs/s':>8}")
    for name, (times, rate) in results.items():
        print(
            f"{name:8} {statistics.median(times) * 1000:12.1f} ms {max(times) * 1000:9.1f} ms "
            f"{rate:8.2f}"
        )
    added = statistics.median(results["ray"][0]) - statistics.median(results["local"][0])
    print(f"added by the ray backend, median: {added * 1000:.1f} ms per job")


if __name__ == "__main__":
    main()

"""Gateway benchmarks: /health latency idle and under load, and durable lease throughput.

1. ``GET /health`` latency p50/p99 over 2,000 sequential requests, first with
   the gateway idle, then while 4 managed jobs hog CPU and memory and the
   guard refuses a fifth (the incident the gateway exists for: a health request took 7 s).
   As root, the gateway runs in its own memory cgroup (default 3 GiB) so the
   hogs press against a real limit.
2. Lease throughput: 8 concurrent clients doing grant + release pairs (each
   durable in the journal: WAL, synchronous=FULL, group commit) for a fixed
   time; pairs per second, and /health latency measured beside them (the
   journal must not block the event loop).

Usage: python benchmarks/bench_gateway.py [--requests 2000] [--lease-seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from roomkeeper.kernel.job_cgroups import job_cgroup_parent
from roomkeeper.units import parse_size

HOG = (
    "import time\n"
    "held = b'x' * {size}\n"
    "end = time.monotonic() + 600\n"
    "while time.monotonic() < end:\n"
    "    sum(range(10000))\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(tmp: Path, limit: int | None) -> Iterator[tuple[str, str]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(ROOMKEEPER_HOME=str(tmp / "home"), ROOMKEEPER_WORKSPACE=str(tmp / "ws"))
    env["ROOMKEEPER_MAX_RUNNING"] = "8"  # so the fifth job meets the guard, not the slot cap
    argv = [sys.executable, "-m", "roomkeeper", "serve", "--port", str(port)]
    group = None
    own = job_cgroup_parent() if limit and os.geteuid() == 0 else None
    if own is not None and limit:
        group = Path(own.directory) / f"rkbench-gw-{os.getpid()}"
        group.mkdir()
        limit_file = "memory.max" if own.version == 2 else "memory.limit_in_bytes"
        (group / limit_file).write_text(str(limit))
        argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"), *argv]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            time.sleep(0.05)
        yield url, (tmp / "home" / "token").read_text().strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        if group is not None:
            for _ in range(300):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def health_latencies(url: str, n: int) -> list[float]:
    samples = []
    with httpx.Client(base_url=url) as client:
        for _ in range(n):
            start = time.perf_counter()
            client.get("/health").raise_for_status()
            samples.append((time.perf_counter() - start) * 1000)
    return samples


def describe(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50:.2f} ms  p99 {p99:.2f} ms  max {ordered[-1]:.2f} ms  (n={len(samples)})"


def lease_storm(url: str, token: str, seconds: float, clients: int) -> tuple[int, list[float]]:
    stop = time.monotonic() + seconds
    counts = [0] * clients
    headers = {"Authorization": f"Bearer {token}"}

    def worker(i: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            n = 0
            while time.monotonic() < stop:
                lease_id = f"c{i}-{n}"
                r = client.post("/v1/leases", json={"id": lease_id, "memory_bytes": 1000})
                r.raise_for_status()
                client.delete(f"/v1/leases/{lease_id}").raise_for_status()
                n += 1
            counts[i] = n

    health: list[float] = []

    def prober() -> None:
        with httpx.Client(base_url=url) as client:
            while time.monotonic() < stop:
                start = time.perf_counter()
                client.get("/health")
                health.append((time.perf_counter() - start) * 1000)
                time.sleep(0.01)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    threads.append(threading.Thread(target=prober))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), health


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--limit", default="3G", help="the gateway's cgroup limit (as root)")
    parser.add_argument("--hog", default="500M", help="memory each of the 4 hogs holds")
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with gateway(Path(tmp) / "a", parse_size(args.limit)) as (url, token):
            print(f"idle:        {describe(health_latencies(url, args.requests))}", flush=True)
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, headers=headers) as client:
                hog = HOG.format(size=parse_size(args.hog))
                for i in range(4):
                    client.post(
                        "/v1/jobs",
                        json={
                            "argv": [sys.executable, "-c", hog],
                            "owner": f"hog{i % 2}",
                            "memory_bytes": parse_size(args.hog),
                        },
                    ).raise_for_status()
                time.sleep(3)
                big = client.post("/v1/jobs", json={"argv": ["true"], "memory_bytes": 10**13})
                big.raise_for_status()
                time.sleep(1)
                job = client.get(f"/v1/jobs/{big.json()['id']}").json()
                status = client.get("/v1/status").json()
                print(
                    f"under load:  4 hogs running={status['queue']['running']}, "
                    f"fifth job {job['state']} ({job['reason']}); "
                    f"{status['guard']['summary']}",
                    flush=True,
                )
                print(f"under load:  {describe(health_latencies(url, args.requests))}", flush=True)
        with gateway(Path(tmp) / "b", None) as (url, token):
            pairs, health = lease_storm(url, token, args.lease_seconds, args.clients)
            print(
                f"leases:      {pairs} grant+release pairs in {args.lease_seconds:.0f} s from "
                f"{args.clients} clients = {pairs / args.lease_seconds:.0f} pairs/s (durable)"
            )
            print(f"health beside the lease storm: {describe(health)}")
            print(f"median health during storm: {statistics.median(health):.2f} ms")


if __name__ == "__main__":
    main()

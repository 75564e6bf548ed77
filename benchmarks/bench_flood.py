"""A flood of API requests: does /health still answer at once?

A gateway (``roomkeeper serve``, on its defaults) gets CONCURRENCY mixed API
requests in flight at all times for SECONDS: job submissions (``true``), job
lists, job reads, status, feed, lease grants and releases, and bad input.
The flood comes from FLOODERS processes (asyncio + httpx each), so the client
is not the bottleneck of one interpreter.  Beside it a prober process asks
``GET /health`` every 20 ms on a connection of its own and records each
answer's latency.  Printed: /health p50/p99/max and failures; the API's own
p50/p99, requests answered, and answers by status class; any 5xx counts as a
defect.

Usage: python benchmarks/bench_flood.py [--concurrency 1000] [--seconds 30] [--flooders 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(tmp: Path) -> Iterator[tuple[str, str]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(
        ROOMKEEPER_HOME=str(tmp / "home"),
        ROOMKEEPER_WORKSPACE=str(tmp / "ws"),
        ROOMKEEPER_JOB_MEMORY_MB="1",  # `true` takes nothing: let the guard admit them
    )
    argv = [sys.executable, "-m", "roomkeeper", "serve", "--port", str(port)]
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
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
        proc.wait(timeout=60)
        log.close()


async def _one(client: httpx.AsyncClient, rng: random.Random, n: int) -> int:
    kind = rng.random()
    if kind < 0.25:
        answer = await client.post("/v1/jobs", json={"argv": ["true"], "owner": f"o{n % 8}"})
    elif kind < 0.45:
        answer = await client.get("/v1/jobs", params={"limit": 50})
    elif kind < 0.60:
        answer = await client.get("/v1/status")
    elif kind < 0.70:
        answer = await client.get("/v1/feed")
    elif kind < 0.85:
        lease = f"l{os.getpid()}-{n}"
        answer = await client.post("/v1/leases", json={"id": lease, "memory_bytes": 1000})
        if answer.status_code < 300:
            answer = await client.delete(f"/v1/leases/{lease}")
    elif kind < 0.95:
        answer = await client.get(f"/v1/jobs/{rng.getrandbits(48):012x}")  # a 404
    else:
        answer = await client.post("/v1/jobs", json={"argv": []})  # a 422
    return answer.status_code


def flood(url: str, token: str, concurrency: int, until: float, out: str) -> None:
    """One flooder process: ``concurrency`` requests in flight until ``until`` (wall)."""

    async def run() -> None:
        rng = random.Random(os.getpid())
        latencies: list[float] = []
        statuses: Counter[str] = Counter()
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            base_url=url, headers=headers, limits=limits, timeout=60
        ) as client:

            async def worker(w: int) -> None:
                n = w * 1_000_000
                while time.time() < until:
                    start = time.perf_counter()
                    try:
                        code = await _one(client, rng, n)
                        statuses[f"{code // 100}xx"] += 1
                    except httpx.HTTPError as err:
                        statuses[type(err).__name__] += 1
                    latencies.append((time.perf_counter() - start) * 1000)
                    n += 1

            await asyncio.gather(*(worker(w) for w in range(concurrency)))
        Path(out).write_text(json.dumps({"latencies": latencies, "statuses": statuses}))

    asyncio.run(run())


def probe(url: str, until: float, out: str) -> None:
    """GET /health every 20 ms on its own connection; each latency, or the error."""
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.time() < until:
            start = time.perf_counter()
            try:
                client.get("/health").raise_for_status()
                latencies.append((time.perf_counter() - start) * 1000)
            except httpx.HTTPError as err:
                failures[type(err).__name__] += 1
            time.sleep(0.02)
    Path(out).write_text(json.dumps({"latencies": latencies, "failures": failures}))


def describe(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50:.1f} ms  p99 {p99:.1f} ms  max {ordered[-1]:.1f} ms  (n={len(samples)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=1000, help="requests in flight")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--flooders", type=int, default=4, help="client processes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name, gateway(Path(tmp_name)) as (url, token):
        tmp = Path(tmp_name)
        idle = tmp / "idle.json"
        probe(url, time.time() + 3, str(idle))
        print(f"/health idle:   {describe(json.loads(idle.read_text())['latencies'])}", flush=True)
        until = time.time() + args.seconds
        each = args.concurrency // args.flooders
        procs = [
            multiprocessing.Process(
                target=flood, args=(url, token, each, until, str(tmp / f"f{i}"))
            )
            for i in range(args.flooders)
        ]
        prober = multiprocessing.Process(target=probe, args=(url, until, str(tmp / "probe")))
        for p in [*procs, prober]:
            p.start()
        print(
            f"flooding: {each * args.flooders} requests in flight from {args.flooders} "
            f"processes for {args.seconds:g} s ...",
            flush=True,
        )
        for p in [*procs, prober]:
            p.join(timeout=args.seconds + 300)
        health = json.loads((tmp / "probe").read_text())
        api: list[float] = []
        statuses: Counter[str] = Counter()
        for i in range(args.flooders):
            found = json.loads((tmp / f"f{i}").read_text())
            api += found["latencies"]
            statuses.update(found["statuses"])
        print(
            f"/health flood:  {describe(health['latencies'])}  failures {dict(health['failures'])}"
        )
        print(f"API:            {describe(api)}  {len(api) / args.seconds:.0f} answers/s")
        print(f"API answers:    {dict(sorted(statuses.items()))}")
        if statuses.get("5xx"):
            print("DEFECT: the API answered 5xx", flush=True)
        said = [
            line
            for line in (tmp / "serve.log").read_text(errors="replace").splitlines()
            if "WARNING" in line or "ERROR" in line
        ]
        if said:
            print("the gateway said:\n  " + "\n  ".join(said[-10:]), flush=True)


if __name__ == "__main__":
    main()

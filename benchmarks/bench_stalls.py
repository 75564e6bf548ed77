"""Stall benchmarks: what a crash, a hung hook, a big log or idle sockets cost.

1. Restart after a crash: ``roomkeeper serve`` on one fixed port, traffic, SIGKILL of the
   whole tree, ``serve`` again at once; seconds until /health answers (p50, max).
2. A 150 MB log: the gateway's RSS before, and its peak while 4 clients read the
   whole output at once (sampled every 10 ms).
3. Six hung lease hooks (a loopback server that drips a byte every 0.25 s): latency of
   ``POST /v1/jobs`` while all six hang.
4. 500 half-open sockets (stopped mid-headers): /health latency while they are open,
   and how many are still open after the header deadline.

Usage: python benchmarks/bench_stalls.py [--cycles 20]
"""

from __future__ import annotations

import argparse
import concurrent.futures
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
import psutil

from roomkeeper.api.connections import HEADER_TIMEOUT_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(
        ROOMKEEPER_HOME=str(tmp / "home"),
        ROOMKEEPER_WORKSPACE=str(tmp / "ws"),
        ROOMKEEPER_JOB_DISK_MB="0",
        ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
        ROOMKEEPER_CPU_PRESSURE_PERCENT="100",
    )
    return env


@contextlib.contextmanager
def gateway(
    tmp: Path, port: int, command: str = "gateway"
) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client, float]]:
    """A gateway (or ``serve``) on ``port``; yields it, a client with its token, and the
    seconds it took to answer /health."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "roomkeeper", command, "--port", str(port)],
        env=environment(tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited ({proc.returncode}) instead of starting")
        time.sleep(0.02)
    took = time.monotonic() - started
    token = (tmp / "home" / "token").read_text().strip()
    try:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as client:
            yield proc, client, took
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    proc.wait()


def restarts(tmp: Path, cycles: int) -> None:
    port = free_port()
    times: list[float] = []
    known = 0
    acknowledged: list[str] = []
    for _ in range(cycles):
        with gateway(tmp, port, "serve") as (proc, client, took):
            times.append(took)
            known += sum(client.get(f"/v1/jobs/{j}").status_code == 200 for j in acknowledged)
            for _ in range(3):
                client.get("/health")
                acknowledged.append(
                    client.post("/v1/jobs", json={"argv": ["sleep", "30"]}).json()["id"]
                )
            kill_tree(proc)
    asked = sum(range(0, 3 * cycles, 3))
    print(
        f"restart after SIGKILL, same port, {cycles} cycles: healthy after "
        f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s; "
        f"acknowledged jobs found again {known}/{asked}"
    )


def big_log(tmp: Path) -> None:
    port = free_port()
    with gateway(tmp, port) as (proc, client, _):
        job = client.post(
            "/v1/jobs", json={"argv": ["sh", "-c", "head -c 150000000 /dev/zero | tr '\\0' x"]}
        ).json()["id"]
        while client.get(f"/v1/jobs/{job}").json()["state"] != "exited":
            time.sleep(0.1)
        gw = psutil.Process(proc.pid)
        before = gw.memory_info().rss
        peak = before
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, gw.memory_info().rss)
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()

        def read_all(_: int) -> int:
            with client.stream("GET", f"/v1/jobs/{job}/output") as r:
                return sum(len(c) for c in r.iter_bytes())

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            sizes = list(pool.map(read_all, range(4)))
        took = time.monotonic() - started
        stop.set()
        sampler.join()
        tail = client.get(f"/v1/jobs/{job}/output", params={"tail": 10}).content
    print(
        f"150 MB log read whole by 4 clients at once ({sizes[0]:,} bytes each, {took:.1f} s): "
        f"gateway RSS {before / 1e6:.1f} MB before, peak {peak / 1e6:.1f} MB "
        f"(+{(peak - before) / 1e6:.1f} MB); ?tail=10 gave {len(tail)} bytes"
    )


class Drip:
    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.open = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        self.open += 1
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX: " + b"." * 1000:
                conn.sendall(bytes([byte]))
                time.sleep(0.25)


def hung_hooks(tmp: Path) -> None:
    drip = Drip()
    port = free_port()
    with gateway(tmp, port) as (_, client, _):
        for n in range(6):
            client.post(
                "/v1/leases",
                json={
                    "id": f"l{n}",
                    "memory_bytes": 0,
                    "release": {"url": f"http://127.0.0.1:{drip.port}/chat/{n}"},
                },
            )
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            for n in range(6):
                pool.submit(client.delete, f"/v1/leases/l{n}")
            while drip.open < 6:
                time.sleep(0.01)
            latencies = []
            for _ in range(10):
                started = time.monotonic()
                client.post("/v1/jobs", json={"argv": ["true"]})
                latencies.append(time.monotonic() - started)
    print(
        f"POST /v1/jobs while 6 lease hooks hang: p50 {statistics.median(latencies) * 1e3:.1f} ms, "
        f"max {max(latencies) * 1e3:.1f} ms (10 requests)"
    )


def half_open(tmp: Path, count: int = 500) -> None:
    port = free_port()
    with gateway(tmp, port) as (proc, _client, _):
        sockets = []
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            sockets.append(s)
        latencies = []
        for _ in range(50):
            started = time.monotonic()
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
            latencies.append(time.monotonic() - started)
        time.sleep(HEADER_TIMEOUT_S + 2)
        still = 0
        for s in sockets:
            s.settimeout(0)
            try:
                still += s.recv(1) != b""
            except BlockingIOError:
                still += 1
            except OSError:
                pass
            s.close()
        alive = proc.poll() is None
    print(
        f"/health with {count} half-open sockets: p50 {statistics.median(latencies) * 1e3:.1f} ms, "
        f"max {max(latencies) * 1e3:.1f} ms (50 requests); still open after "
        f"{HEADER_TIMEOUT_S + 2:g} s: {still}; gateway alive: {alive}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        restarts(Path(tmp) / "restarts", args.cycles)
        big_log(Path(tmp) / "log")
        hung_hooks(Path(tmp) / "hooks")
        half_open(Path(tmp) / "sockets")


if __name__ == "__main__":
    main()

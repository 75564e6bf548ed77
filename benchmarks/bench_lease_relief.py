"""Leases in a real memory group: turns that outgrow their leases, and sessions never given back.

Everything runs inside a fresh memory group of ``--limit`` (default 1 GB): a
gateway (no reserve of its own, a 1 s cooldown), the example agent server and
the example dispatcher.

- ``relief``: ``--turns`` turns (default 3) at once, started 0.5 s apart,
  each leased at 100 MB and growing to 420 MB over ``--turn-s`` (default
  24 s): together far past the limit.  Run once with the dispatcher's relieve hook and once without.
  Reported: turns finished and relieved, OOM kills, how long after the
  stop line's crossing each relief was asked, and how long until its
  memory was back.
- ``leak``: turns of 24 MB one after another, without release hooks, then
  with them: after which turn the gateway says ``memory not given back``
  (needs-you), or that it never did within ``--leak-turns`` (default 30).

Needs root and a cgroup memory controller.  Usage:
    python benchmarks/bench_lease_relief.py [--scenario relief,leak] [--limit 1G]
        [--turns 3] [--turn-s 24] [--leak-turns 30]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bench_swarm import bench_groups, run_in_group

from roomkeeper.units import parse_size

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MB = 10**6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Rig:
    """A gateway and an agent server, started by this process (inside the group)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
        self.env.update(
            ROOMKEEPER_HOME=str(tmp / "home"),
            ROOMKEEPER_WORKSPACE=str(tmp / "ws"),
            ROOMKEEPER_GATEWAY_RESERVE_MB="0",
            ROOMKEEPER_PRESSURE_COOLDOWN="1",
            ROOMKEEPER_JOB_DISK_MB="0",
            ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
            PYTHONPATH=str(ROOT / "src"),
        )
        self.log = tmp / "gateway.log"
        with self.log.open("wb") as log:
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "roomkeeper", "gateway", "--port", str(port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.gateway.poll() is not None:
                raise SystemExit(f"the gateway did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        self.token = (tmp / "home" / "token").read_text().strip()
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30
        )
        self.agent_proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "agent_server.py")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.agent_proc.stdout is not None
        self.agent = f"http://127.0.0.1:{int(self.agent_proc.stdout.readline().split()[-1])}"

    def dispatch(self, *args: str) -> str:
        result = subprocess.run(
            [
                sys.executable,
                str(EXAMPLES / "dispatcher.py"),
                *("--gateway", self.url, "--agent", self.agent, f"--token={self.token}"),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        return result.stdout + result.stderr

    def headline(self) -> str:
        return str(self.client.get("/v1/needs-you").json()["headline"])

    def close(self) -> None:
        for proc in (self.agent_proc, self.gateway):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.client.close()


def relief(tmp: Path, relieve: bool, turns: int, turn_s: float) -> dict[str, object]:
    rig = Rig(tmp)
    try:
        out = rig.dispatch(
            *("--turns", str(turns), "--concurrency", str(turns), "--stagger", "0.5"),
            *("--session-bytes", str(100 * MB), "--grow-bytes", str(320 * MB)),
            *("--turn-s", str(turn_s), "--id-prefix", "grow-"),
            *(() if relieve else ("--no-relieve-hook",)),
        )
        log = rig.log.read_text()
    finally:
        rig.close()
    asked_ms = [float(m) for m in re.findall(r"relieve hook\): .*?\((\d+) ms after", log)]
    back_ms = [float(m) for m in re.findall(r"relieved: used fell [0-9.]+ GB in (\d+) ms", log)]
    return {
        "finished": out.count("turn finished"),
        "relieved": len(re.findall(r"relieve asked by roomkeeper", out)),
        "asked_ms": asked_ms,
        "back_ms": back_ms,
        "unrelieved_said": "nothing to act on" in log,
        "tail": out.strip().splitlines()[-1] if out.strip() else "",
    }


def leak(tmp: Path, hooks: bool, turns: int) -> dict[str, object]:
    rig = Rig(tmp)
    fired = None
    try:
        for n in range(1, turns + 1):
            rig.dispatch(
                *("--turns", "1", "--session-bytes", str(24 * MB), "--turn-s", "0.2"),
                *("--id-prefix", f"{'hooked' if hooks else 'leak'}-{n}-"),
                *(() if hooks else ("--no-release-hook",)),
            )
            deadline = time.monotonic() + 1.5  # a record after the ending, and a quiet one
            while time.monotonic() < deadline and fired is None:
                if rig.headline() == "memory not given back":
                    fired = n
                time.sleep(0.1)
            if fired is not None:
                break
        status = rig.client.get("/v1/status").json()["baseline"]
    finally:
        rig.close()
    return {"fired_after_turn": fired, "baseline": status}


def inside(args: argparse.Namespace) -> None:
    """Run one scenario from inside the group; write its figures to ``args.report``."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.inside == "relief-hook":
            figures = relief(Path(tmp), True, args.turns, args.turn_s)
        elif args.inside == "relief-nohook":
            figures = relief(Path(tmp), False, args.turns, args.turn_s)
        elif args.inside == "leak-nohook":
            figures = leak(Path(tmp), False, args.leak_turns)
        else:
            figures = leak(Path(tmp), True, args.leak_turns)
    Path(args.report).write_text(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="relief,leak")
    parser.add_argument("--limit", default="1G")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-s", type=float, default=24.0)
    parser.add_argument("--leak-turns", type=int, default=30)
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    parent, version = bench_groups()
    limit = parse_size(args.limit)
    print(f"cgroup v{version}, a group of {limit / 1e9:.2f} GB", flush=True)
    runs = []
    for scenario in (s.strip() for s in args.scenario.split(",") if s.strip()):
        if scenario == "relief":
            runs += ["relief-hook", "relief-nohook"]
        elif scenario == "leak":
            runs += ["leak-nohook", "leak-hook"]
        else:
            sys.exit(f"unknown scenario {scenario!r}: give relief, leak or both")
    for run in runs:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            argv = [
                sys.executable,
                __file__,
                *("--inside", run, "--report", str(report)),
                *("--turns", str(args.turns), "--turn-s", str(args.turn_s)),
                *("--leak-turns", str(args.leak_turns)),
            ]
            stdin = Path(tmp) / "stdin"
            stdin.write_text("")
            wall, kills = run_in_group(parent, version, limit, argv, stdin, Path(tmp) / "err")
            if not report.exists():
                print(f"{run}: no report ({wall:.1f} s, OOM kills {kills}):", flush=True)
                print((Path(tmp) / "err").read_text()[-2000:], flush=True)
                continue
            figures = json.loads(report.read_text())
            print(f"{run}: {wall:.1f} s, OOM kills {kills}, {json.dumps(figures)}", flush=True)


if __name__ == "__main__":
    main()

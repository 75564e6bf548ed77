"""A real Ray cluster on loopback for a benchmark: a head and worker nodes, each its own group.

Every node is ``ray start --block`` in a session of its own, with a private
temporary directory and ports found free here, so a benchmark never touches a
cluster it did not start (no ``ray stop``, which stops every cluster of the
user).  At the end each node's whole process group is SIGKILLed, worker nodes
first, and the directory removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
NODE_WAIT_S = 90.0

# Lost nodes are noticed in seconds, not the default half minute.
FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class LocalCluster:
    """A head (no CPUs: jobs never land there) and worker nodes, by name."""

    root: Path
    address: str
    env: dict[str, str]
    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(
        self, name: str, memory_bytes: int, cpus: int, head: bool = False, group: Path | None = None
    ) -> None:
        """Start one node and wait until it has joined (a busy machine's join is tried twice).

        With ``group`` (a memory cgroup's folder), the node and all it starts are
        charged to that group.

        Under load ``ray start`` can give up on the head's GCS ("Deadline
        Exceeded") before it joins: Ray's setup failing, not what is measured.
        """
        for attempt in (1, 2):
            self.nodes[name] = self._launch(name, memory_bytes, cpus, head, group)
            try:
                self._wait_started(name)
                return
            except SystemExit as err:
                if attempt == 2 or "Deadline Exceeded" not in str(err):
                    raise
                self._kill(name)

    def _launch(
        self, name: str, memory_bytes: int, cpus: int, head: bool, group: Path | None
    ) -> subprocess.Popen[bytes]:
        ports = free_ports(6 + 8)
        args = [
            RAY,
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={self.root / 'ray'}",
            f"--num-cpus={cpus}",
            f"--memory={memory_bytes}",
            f"--resources={json.dumps({})}",
            "--include-log-monitor=false",
            f"--node-manager-port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--metrics-export-port={ports[2]}",
            f"--dashboard-agent-listen-port={ports[3]}",
            f"--dashboard-agent-grpc-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}",
            f"--worker-port-list={','.join(str(p) for p in ports[6:])}",
            "--object-store-memory=80000000",
        ]
        if head:
            port = self.address.rsplit(":", 1)[1]
            args += ["--head", f"--port={port}", "--include-dashboard=false"]
        else:
            args.append(f"--address={self.address}")
        env = {
            **self.env,
            "ROOMKEEPER_HOME": str(self.root / f"{name}-home"),
            "ROOMKEEPER_WORKSPACE": str(self.root),
        }
        with (self.root / f"{name}.log").open("wb") as log:
            # As a node started in the background of a script: a shell ignores SIGINT for
            # its background jobs, and Ray's workers inherit that.
            enter = "" if group is None else f"echo $$ > {group / 'cgroup.procs'} && "
            ignoring_sigint = ["sh", "-c", enter + "trap '' INT; exec \"$@\"", "ray-node"]
            return subprocess.Popen(
                [*ignoring_sigint, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_started(self, name: str) -> None:
        """Wait until ``ray start`` says the node runs (it has registered with the head)."""
        log = self.root / f"{name}.log"
        proc = self.nodes[name]
        deadline = time.monotonic() + NODE_WAIT_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                text = log.read_text(errors="replace")
                raise SystemExit(f"ray node {name} exited:\n{text[-3000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"ray node {name} did not start in {NODE_WAIT_S:g} s")
            time.sleep(0.2)

    def _kill(self, name: str) -> None:
        """SIGKILL one node's whole process group (raylet, agents, workers) at once."""
        proc = self.nodes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        """SIGKILL every node's process group we started, worker nodes first; remove the folder."""
        for name in reversed(list(self.nodes)):
            self._kill(name)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def local_cluster(
    nodes: dict[str, int],
    head_memory: int = 50_000_000,
    groups: dict[str, Path] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[LocalCluster]:
    """A head and one worker node of 2 CPUs per entry (name -> its memory resource in bytes),
    each started in its memory group of ``groups`` where one is named, with ``env`` added."""
    extra = env
    # Short: Ray's unix socket paths live under it and must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="rk-ray-", dir="/tmp"))
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOMKEEPER_", "RAY_"))}
    env.update(FAST_HEALTH)
    env.update(ROOMKEEPER_JOB_DISK_MB="0", ROOMKEEPER_DISK_HEADROOM_PERCENT="0")
    env.update(extra or {})
    cluster = LocalCluster(root=root, address=f"127.0.0.1:{port}", env=env)
    try:
        cluster.start("head", head_memory, 0, head=True)
        for name, memory in nodes.items():
            cluster.start(name, memory, 2, group=(groups or {}).get(name))
        yield cluster
    finally:
        cluster.close()

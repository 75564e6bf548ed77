"""A real Ray cluster on loopback for tests: a head and worker nodes, each its own process group.

Every node is ``ray start --block`` in a session of its own, with a private
temporary directory and ports found free here, so a test never touches a
cluster it did not start (no ``ray stop``, which stops every cluster of the
user).  :meth:`LocalCluster.kill_node` SIGKILLs one node's whole process
group, as when a machine is lost; :meth:`LocalCluster.close` ends the rest
the same way, and removes the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.ports import free_ports

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


# What ``ray start`` says when a port it was given is taken after all: a setup
# failure of the test's port choice, so the node is started once more on others.
PORT_CLASHES = ("used by other components", "Address already in use", "Failed to bind")


@dataclass
class Node:
    """One ``ray start --block`` process, the leader of its own process group."""

    name: str
    proc: subprocess.Popen[bytes]
    memory_bytes: int
    settings: Path  # its ROOMKEEPER_NODE_SETTINGS file

    def kill(self) -> None:
        """SIGKILL the node's whole process group (raylet, agents, workers) at once.

        When this process is a subreaper (a scheduler test made it one), the
        group's orphans become our children: they are reaped here, or they
        would stay zombies, and Ray would not see the node go.
        """
        members = _group_members(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        _reap(members)


def _group_members(pgid: int) -> set[int]:
    """The pids in process group ``pgid`` now (its leader too)."""
    found = set()
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pgid:
                found.add(pid)
    return found


def _reap(pids: set[int], timeout: float = 10.0) -> None:
    """Reap those of ``pids`` that became our children once dead; forget the others."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                if os.waitpid(pid, os.WNOHANG) != (0, 0):
                    left.discard(pid)  # reaped
            except ChildProcessError:
                if not psutil.pid_exists(pid):
                    left.discard(pid)  # gone, reaped by whoever was its parent
        time.sleep(0.05)


@dataclass
class LocalCluster:
    """A head (no CPUs: jobs never land there) and worker nodes with distinct memory."""

    root: Path
    address: str
    env: dict[str, str]
    nodes: dict[str, Node] = field(default_factory=dict)

    def node_env(self, name: str) -> dict[str, str]:
        settings = self.root / f"{name}.settings"
        settings.touch()
        return {
            **self.env,
            "ROOMKEEPER_NODE_SETTINGS": str(settings),
            "ROOMKEEPER_HOME": str(self.root / f"{name}-home"),
            "ROOMKEEPER_WORKSPACE": str(self.root),
        }

    def _start(
        self, name: str, memory_bytes: int, cpus: int, head: bool, group: Path | None = None
    ) -> Node:
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
            args += [
                "--head",
                f"--port={port}",
                "--include-dashboard=false",
            ]
        else:
            args.append(f"--address={self.address}")
        log = (self.root / f"{name}.log").open("wb")
        # As a node started in the background of a script: a shell ignores SIGINT for its
        # background jobs, and Ray's workers inherit that (so do the nodes pytest-xdist's
        # workers start).  A cancel must reach a job's task all the same.
        ignoring_sigint = ["sh", "-c", "trap '' INT; exec \"$@\"", "ray-node"]
        if group is not None:  # the node and all it starts are charged to its own group
            enter = f"echo $$ > {group / 'cgroup.procs'} && "
            ignoring_sigint = ["sh", "-c", enter + "trap '' INT; exec \"$@\"", "ray-node"]
        proc = subprocess.Popen(
            [*ignoring_sigint, *args],
            env=self.node_env(name),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        node = Node(name, proc, memory_bytes, self.root / f"{name}.settings")
        self.nodes[name] = node
        return node

    def add_node(
        self, name: str, memory_bytes: int, cpus: int = 2, group: Path | None = None
    ) -> Node:
        """Start a worker node and wait until it has joined the cluster.

        On a busy machine (two other test files beside this one) ``ray start``
        can give up on the head's GCS ("Deadline Exceeded") before it joins, or
        on its own raylet registering ("timed out during startup", a wait Ray
        fixes at 30 s): a setup failure of Ray's, not of what is tested, so it
        is started again.
        """
        return self._started(
            lambda: self._start(name, memory_bytes, cpus, head=False, group=group),
            ("Deadline Exceeded", "timed out during startup", *PORT_CLASHES),
        )

    def start_head(self, memory_bytes: int) -> Node:
        """Start the head on a fresh GCS port, once more on others if a port was taken meanwhile."""

        def start() -> Node:
            self.address = f"127.0.0.1:{free_ports(1)[0]}"
            return self._start("head", memory_bytes, 0, head=True)

        return self._started(start, PORT_CLASHES)

    def _started(self, start: Callable[[], Node], retryable: tuple[str, ...]) -> Node:
        """A node ``start`` made that has started, started up to three times while it
        fails with one of the ``retryable`` words (a setup failure, not what is tested)."""
        for attempt in (1, 2, 3):
            node = start()
            try:
                self.wait_started(node)
                return node
            except AssertionError as err:
                if attempt == 3 or not any(word in str(err) for word in retryable):
                    raise
                node.kill()
        raise AssertionError("unreachable")  # pragma: no cover

    def wait_started(self, node: Node) -> None:
        """Wait until ``ray start`` says the node runs (it has registered with the head)."""
        log = self.root / f"{node.name}.log"
        deadline = time.monotonic() + NODE_WAIT_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if node.proc.poll() is not None:
                text = log.read_text(errors="replace")
                raise AssertionError(f"ray node {node.name} exited:\n{text[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"ray node {node.name} did not start in {NODE_WAIT_S:g} s")
            time.sleep(0.2)

    def set_node_settings(self, name: str, text: str) -> None:
        """Write a node's ROOMKEEPER_NODE_SETTINGS file (its guard reads it for every job)."""
        path = self.nodes[name].settings
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)

    def close(self) -> None:
        """SIGKILL every node's process group we started, worker nodes first; remove the directory.

        Nothing of a node outlives its group but job trees' lifelines, which
        kill their trees and exit once their runner is gone.
        """
        for node in reversed(list(self.nodes.values())):
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def local_cluster(
    nodes: dict[str, int],
    head_memory: int = 50_000_000,
    groups: dict[str, Path] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[LocalCluster]:
    """A head and one worker node per entry (name -> its memory resource in bytes), each
    started in its memory group of ``groups`` where one is named, with ``env`` added."""
    # Short: Ray's unix socket paths live under it and must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="rk-ray-", dir="/tmp"))
    extra = env
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOMKEEPER_", "RAY_"))}
    env.update(FAST_HEALTH)
    env.update(ROOMKEEPER_JOB_DISK_MB="0", ROOMKEEPER_DISK_HEADROOM_PERCENT="0")
    env.update(extra or {})
    cluster = LocalCluster(root=root, address="", env=env)
    try:
        cluster.start_head(head_memory)
        for name, memory in nodes.items():
            cluster.add_node(name, memory, group=(groups or {}).get(name))
        yield cluster
    finally:
        cluster.close()

"""A real ``roomkeeper gateway`` for a benchmark: on a free loopback port, always stopped.

The gateway runs as a person runs it (``python -m roomkeeper gateway``) with
its home and workspace under a folder the benchmark owns; ``running_gateway``
hands back a client that carries its token, and SIGTERMs (then SIGKILLs) it
whatever happens.  ``kill_whole_tree`` SIGKILLs it with every descendant at
once, as when a container is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil


def free_port() -> int:
    """A port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningGateway:
    """A gateway subprocess and a client that carries its token."""

    proc: subprocess.Popen[bytes]
    url: str
    home: Path
    client: httpx.Client


def gateway_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This process's environment less any ROOMKEEPER_ setting, with a home under ``tmp``.

    No disk gate (the jobs write nothing worth counting), and no CPU gate: the
    benchmark's own load must not hold back second launches (PSI cpu some is
    never above 100 %).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(
        ROOMKEEPER_HOME=str(tmp / "home"),
        ROOMKEEPER_WORKSPACE=str(tmp / "ws"),
        ROOMKEEPER_JOB_DISK_MB="0",
        ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
        ROOMKEEPER_CPU_PRESSURE_PERCENT="100",
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def running_gateway(tmp: Path, **extra: str) -> Iterator[RunningGateway]:
    """Start ``roomkeeper gateway`` with the settings ``extra``; stop it whatever happens."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    env = gateway_env(tmp, **extra)
    log_path = tmp / f"gateway-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "roomkeeper", "gateway", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(url, proc, log_path)
        home = Path(env["ROOMKEEPER_HOME"])
        token = (home / "token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            yield RunningGateway(proc, url, home, client)
    finally:
        stop_process(proc)


def wait_answering(url: str, proc: subprocess.Popen[Any], log: Path, timeout: float = 30) -> None:
    """Wait until the gateway at ``url`` answers /health; stop with its log if it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited ({proc.returncode}):\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no answer on {url}/health in {timeout:g} s:\n{log.read_text()}")
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM a process we started, then SIGKILL it if it has not gone in 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_whole_tree(gw: RunningGateway) -> None:
    """SIGKILL the gateway and every descendant at once, as when a container is killed."""
    procs = [psutil.Process(gw.proc.pid)]
    with contextlib.suppress(psutil.Error):
        procs += procs[0].children(recursive=True)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP)  # freeze first: nothing reacts to the others dying
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    gw.proc.wait()

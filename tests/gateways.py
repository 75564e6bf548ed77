"""A real gateway for tests: a process on a free loopback port, or one wired in this process
and never served; always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from roomkeeper.gateway.recovery import kill_stale_groups
from roomkeeper.gateway.service import Gateway
from roomkeeper.journal.database import Journal
from roomkeeper.kernel.job_cgroups import stale_job_cgroups
from tests.cgroups import MemoryBox
from tests.ports import free_port

# Every process kill_whole_tree killed in this test. Their job groups are the next
# gateway's to remove (and some tests check that it does); where the test starts none
# after its last kill, its teardown removes them (remove_groups_left_by_kills).
_killed: list[psutil.Process] = []


@contextlib.contextmanager
def in_process_gateway(tmp_path: Path, **env: str) -> Iterator[Gateway]:
    """A gateway wired in this process over a real journal in ``tmp_path``, never served;
    ``env`` adds to (or replaces) its variables.  Closed after: its scheduler, the
    journal writes still on their way, its hooks and its journal."""
    variables = {
        "ROOMKEEPER_HOME": str(tmp_path / "home"),
        "ROOMKEEPER_CPU_PRESSURE_PERCENT": "100",
        **env,
    }
    journal = Journal(tmp_path / "home" / "journal.db")
    built = Gateway(home=tmp_path / "home", env=variables, token="t" * 32, journal=journal)
    try:
        yield built
    finally:
        built.scheduler.close(grace=0)
        for write in built.durable_jobs.pending_writes():
            write.result(timeout=30)
        built.hooks.close()
        journal.close()


@dataclass
class RunningGateway:
    """A gateway subprocess and a client that carries its token."""

    proc: subprocess.Popen[bytes]
    url: str
    home: Path
    client: httpx.Client
    anonymous: httpx.Client

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Poll ``predicate`` until it holds; fail saying ``what`` never happened."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.05)


def roomkeeper_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``roomkeeper ARGS`` as a person would; its exit status, stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "roomkeeper", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def gateway_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(
        ROOMKEEPER_HOME=str(tmp / "home"),
        ROOMKEEPER_WORKSPACE=str(tmp / "ws"),
        ROOMKEEPER_JOB_DISK_MB="0",
        ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
        # The suite's own load on 2 cores must not gate second launches (PSI cpu some is
        # never above 100 %); the CPU gate has its own test with a fake reading.
        ROOMKEEPER_CPU_PRESSURE_PERCENT="100",
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def running_gateway(
    tmp: Path,
    *,
    port: int | None = None,
    supervised: bool = False,
    code: str | None = None,
    **extra: str,
) -> Iterator[RunningGateway]:
    """Start ``roomkeeper gateway`` (``serve``, under its supervisor, when ``supervised``;
    the Python program ``code``, given the port, when set: a gateway with a fault put in);
    stop it with SIGTERM (then SIGKILL) whatever happens."""
    port = port or free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    env = gateway_env(tmp, **extra)
    command = "serve" if supervised else "gateway"
    log = (tmp / f"gateway-{port}.log").open("wb")
    argv = [sys.executable, "-m", "roomkeeper", command, "--port", str(port)]
    proc = subprocess.Popen(
        argv if code is None else [sys.executable, "-c", code, str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(url, proc, tmp / f"gateway-{port}.log")
        home = Path(env["ROOMKEEPER_HOME"])
        token = (home / "token").read_text().strip()
        with (
            httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
            ) as client,
            httpx.Client(base_url=url, timeout=30) as anonymous,
        ):
            yield RunningGateway(proc, url, home, client, anonymous)
    finally:
        stop_process(proc)
        log.close()


def fill_disk(disk: Path) -> Path:
    """Fill the volume at ``disk`` with one file, written until the disk refuses; that file."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as f:
        while True:
            f.write(b"x" * 65536)
    return filler


def wait_answering(url: str, proc: subprocess.Popen[Any], log: Path, timeout: float = 90) -> None:
    """Wait until the gateway at ``url`` answers /health; fail with its log if it exits first.

    The bound is one no busy machine misses: a gateway that joins a Ray cluster took over
    30 s to answer on 2 cores at a load of 9; one that hangs still fails, with its log."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        if proc.poll() is not None:
            raise AssertionError(f"the gateway exited ({proc.returncode}):\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no answer on {url}/health in {timeout:g} s:\n{log.read_text()}")
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


def kill_whole_tree(gw: RunningGateway) -> list[int]:
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
    _killed.extend(procs)
    return [p.pid for p in procs]


def remove_groups_left_by_kills() -> list[str]:
    """Remove the job groups (memory, v1 freezer) of the processes kill_whole_tree killed
    that no gateway started since has removed; the groups it could not remove."""
    left = []
    while _killed:
        proc = _killed.pop()
        if not _dead(proc):
            continue  # still alive, or its pid went to a new process: not ours to touch
        # As the next gateway would: members killed, freezer groups thawed first.
        kill_stale_groups(proc.pid)
        left += stale_job_cgroups(proc.pid)
    return left


def _dead(proc: psutil.Process) -> bool:
    """The process is gone, or a zombie nobody reaped (not a new one with its pid)."""
    if not psutil.pid_exists(proc.pid):
        return True
    with contextlib.suppress(psutil.Error):
        # is_running() compares start times: False once the pid is another process's.
        return proc.is_running() and proc.status() == psutil.STATUS_ZOMBIE
    return True  # gone between the two looks


@contextlib.contextmanager
def gateway_in_box(box: MemoryBox, tmp: Path, **extra: str) -> Iterator[tuple[httpx.Client, Path]]:
    """A real ``roomkeeper gateway`` inside ``box`` (no reserve of its own, a 1 s cooldown);
    its client and its log file; stopped whatever happens."""
    port = free_port()
    settings = {
        "ROOMKEEPER_GATEWAY_RESERVE_MB": "0",
        "ROOMKEEPER_PRESSURE_COOLDOWN": "1",
        "ROOMKEEPER_MAX_RUNNING_PER_OWNER": "4",
        **box.env(),
        **extra,
    }
    env = gateway_env(tmp, **settings)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    log_path = tmp / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            box.argv([sys.executable, "-m", "roomkeeper", "gateway", "--port", str(port)]),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            # The emulated kernel of CI's cgroup v2 VM takes minutes to start a gateway.
            wait_answering(url, proc, log_path, timeout=300)
            token = (Path(env["ROOMKEEPER_HOME"]) / "token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
                yield client, log_path
        finally:
            stop_process(proc)


def journal_db(home: Path) -> sqlite3.Connection:
    """A connection to the journal of ROOMKEEPER_HOME ``home``, rows by name (to read it as
    the gateway saved it)."""
    conn = sqlite3.connect(home / "journal.db", timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


def zombie_or_gone(pid: int) -> bool:
    """The process is dead (a zombie waiting for its reaper counts as dead)."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True

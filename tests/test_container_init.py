"""``roomkeeper serve`` as a container's entrypoint: PID 1 of its own PID namespace.

A container's first process is the init of its PID namespace: the kernel
hands it every orphan to reap, and a signal it has no handler for never
reaches it.  These tests run the real command as PID 1 (``unshare --pid
--fork --mount-proc``), make orphans the way a crash does, and stop it the
way ``docker stop`` does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.gateways import free_port, gateway_env, stop_process, wait_answering, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.cgroups]

SHUTDOWN_S = 15  # the supervisor's stage for a shutdown (ROOMKEEPER_WATCHDOG_SHUTDOWN)


def _namespace_members(init: psutil.Process) -> list[psutil.Process]:
    """Every process of the namespace ``init`` is PID 1 of, as the host sees them."""
    try:
        ns = os.readlink(f"/proc/{init.pid}/ns/pid")
    except OSError:
        return []
    found = []
    for proc in psutil.process_iter():
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/pid") == ns:
                found.append(proc)
        except OSError:
            continue
    return found


@pytest.fixture
def pid1(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], psutil.Process, str, Path]]:
    """``roomkeeper serve`` as PID 1 of a new PID namespace; (unshare, init, url, home)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a PID namespace needs root and util-linux's unshare (CI has both)")
    port = free_port()
    init: psutil.Process | None = None
    env = gateway_env(tmp_path, ROOMKEEPER_SHUTDOWN_S="6")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--",
                sys.executable,
                "-m",
                "roomkeeper",
                "serve",
                "--port",
                str(port),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        try:
            # The emulated kernel of CI's cgroup v2 VM takes minutes to start a gateway.
            wait_answering(url, proc, log, timeout=300)
        except AssertionError as err:
            if "unshare:" in log.read_text():
                pytest.skip(f"unshare --pid is refused here: {log.read_text().strip()}")
            raise AssertionError(str(err)) from None
        init = psutil.Process(proc.pid).children()[0]
        yield proc, init, url, Path(env["ROOMKEEPER_HOME"])
    finally:
        _end_namespace(proc, init)


def _end_namespace(proc: subprocess.Popen[bytes], init: psutil.Process | None) -> None:
    """Stop the namespace we made: SIGTERM to its init (unshare does not pass signals on),
    then SIGKILL, which takes every process of the namespace with it."""
    if init is not None:  # None: it never answered; unshare is stopped all the same
        with contextlib.suppress(psutil.Error):
            init.terminate()
            try:
                init.wait(timeout=30)
            except psutil.TimeoutExpired:
                init.kill()
    stop_process(proc)


def _gateway(init: psutil.Process) -> psutil.Process | None:
    """The supervisor's gateway child (not a zombie it may still have to reap), if any now."""
    for child in init.children():
        try:
            if "gateway" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                return child
        except psutil.Error:
            continue
    return None


def test_serve_as_pid_1_reaps_orphans_and_stops_on_sigterm_leaving_nothing(
    pid1: tuple[subprocess.Popen[bytes], psutil.Process, str, Path],
) -> None:
    """As PID 1: a crashed gateway's orphans are reaped, and SIGTERM ends the whole namespace
    within the shutdown stage, with exit status 0 and no process of it left."""
    proc, init, url, home = pid1
    assert os.readlink(f"/proc/{init.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    token = (home / "token").read_text().strip()
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    with client:
        job = client.post("/v1/jobs", json={"argv": ["sleep", "300"]}).json()["id"]
        wait_until(lambda: client.get(f"/v1/jobs/{job}").json()["state"] == "running", "a job")
    first = _gateway(init)
    assert first is not None
    first.kill()  # a crash: its lifeline kills the job, and the helper is orphaned to PID 1

    def replaced() -> bool:
        now = _gateway(init)
        return now is not None and now.pid != first.pid

    wait_until(replaced, "a new gateway", 60)

    def zombie(child: psutil.Process) -> bool:
        try:
            return child.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False  # reaped between the listing and the look: what is awaited

    def no_zombies() -> bool:
        return not any(zombie(c) for c in init.children())

    wait_until(no_zombies, "PID 1 to reap every orphan of the crash", 30)
    sent = time.monotonic()
    init.send_signal(signal.SIGTERM)  # what `docker stop` sends to PID 1
    assert proc.wait(timeout=SHUTDOWN_S + 10) == 0
    took = time.monotonic() - sent
    assert took < SHUTDOWN_S, f"SIGTERM took {took:.1f} s"
    assert _namespace_members(init) == []

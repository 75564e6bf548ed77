"""``roomkeeper serve`` on a Unix socket is watched as on a port: heartbeats, no restarts."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from roomkeeper.supervisor.records import read_events
from tests.gateways import gateway_env, roomkeeper_cli, stop_process, wait_until

# Short stages, so a gateway that never sends a healthy heartbeat is relieved, stopped and
# relaunched within seconds; the start stage is roomy, since a busy machine starts slowly
# (an emulated kernel took over 40 s to import the gateway before its hello).
START_S = 150.0
STAGES = {
    "ROOMKEEPER_WATCHDOG_START": str(int(START_S)),
    "ROOMKEEPER_WATCHDOG_HEARTBEAT": "3",
    "ROOMKEEPER_WATCHDOG_RELIEF": "3",
    "ROOMKEEPER_WATCHDOG_SHUTDOWN": "3",
}


@contextlib.contextmanager
def served_on_socket(tmp: Path) -> Iterator[tuple[dict[str, str], Path, Path]]:
    """The real ``roomkeeper serve`` on a socket under ``tmp``; always stopped, tree and all."""
    sock = tmp / "gw.sock"
    env = gateway_env(tmp, ROOMKEEPER_SOCKET=str(sock), **STAGES)
    home = Path(env["ROOMKEEPER_HOME"])
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "roomkeeper", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield env, home, log
    finally:
        with contextlib.suppress(psutil.Error):
            left = psutil.Process(proc.pid).children(recursive=True)
        stop_process(proc)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()


def events_named(home: Path, name: str) -> list[dict[str, object]]:
    return [e for e in read_events(home) if e["event"] == name]


def wait_for_heartbeat(home: Path, log: Path, timeout: float = START_S) -> None:
    """Wait for the supervisor's first healthy heartbeat; say what it saw if none came."""
    try:
        wait_until(lambda: bool(events_named(home, "healthy")), "a healthy heartbeat", timeout)
    except AssertionError as err:
        seen = [e["event"] for e in read_events(home)]
        raise AssertionError(f"{err}; events {seen}; the log:\n{log.read_text()}") from None


def test_serve_on_a_socket_sends_heartbeats_and_is_never_relieved_or_restarted(
    tmp_path: Path,
) -> None:
    """A gateway on a socket answers its own health probe: healthy, no relief, one launch."""
    with served_on_socket(tmp_path) as (_env, home, log):
        wait_for_heartbeat(home, log)
        # Past the heartbeat and relief stages twice over: a missing heartbeat would show.
        time.sleep(2 * (3 + 3) + 1)
        seen = [e["event"] for e in read_events(home)]
        assert "relief" not in seen and "sigterm" not in seen, seen
        assert seen.count("launched") == 1, seen
        transport = httpx.HTTPTransport(uds=str(tmp_path / "gw.sock"))
        with httpx.Client(transport=transport) as client:
            assert client.get("http://localhost/health").status_code == 200


def test_repair_works_on_a_socket(tmp_path: Path) -> None:
    """``roomkeeper repair`` on a socket gateway passes its health probes and repairs."""
    with served_on_socket(tmp_path) as (env, home, log):
        wait_for_heartbeat(home, log)
        done = roomkeeper_cli(env, "repair")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "repaired:" in done.stdout and "not repaired" not in done.stdout


pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Unix sockets as Linux has them")

"""The gateway's side of the supervisor's channel, driven by a test acting as the supervisor."""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.gateways import free_port, gateway_env, stop_process, wait_until, zombie_or_gone

pytestmark = pytest.mark.kernel


@dataclass
class Supervised:
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    client: httpx.Client
    buffer: bytes = b""

    def next_message(self, kind: str, timeout: float = 15) -> dict:  # type: ignore[type-arg]
        """Read messages until one of ``kind`` arrives."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if message["type"] == kind:
                    return message  # type: ignore[no-any-return]
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.buffer += chunk
        raise AssertionError(f"no {kind!r} message within {timeout} s")

    def send(self, kind: str, **fields: object) -> None:
        self.sock.sendall(json.dumps({"type": kind, **fields}).encode() + b"\n")


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    with supervise(tmp_path) as s:
        yield s


@contextlib.contextmanager
def supervise(tmp_path: Path, **extra: str) -> Iterator[Supervised]:
    """A real gateway whose supervisor is this test, over a real socketpair."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    port = free_port()
    env = gateway_env(
        tmp_path,
        ROOMKEEPER_IPC_FD=str(theirs.fileno()),
        ROOMKEEPER_WATCHDOG_HEARTBEAT="1.5",
        **extra,
    )
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "roomkeeper", "gateway", "--port", str(port)],
        env=env,
        pass_fds=[theirs.fileno()],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    theirs.close()
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        token = (tmp_path / "home" / "token").read_text().strip()
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}
        ) as client:
            yield Supervised(proc, ours, client)
    finally:
        stop_process(proc)
        ours.close()
        log.close()


def test_hello_then_heartbeats_that_carry_the_real_boot_id(supervised: Supervised) -> None:
    """The channel opens with a versioned hello; heartbeats follow real /health probes."""
    hello = supervised.next_message("hello")
    assert hello["protocol"] == 1 and "heartbeat" in hello["capabilities"]
    boot_id = supervised.client.get("/health").json()["boot_id"]
    assert hello["boot_id"] == boot_id
    beats = [supervised.next_message("heartbeat") for _ in range(6)]
    assert {beat["boot_id"] for beat in beats} == {boot_id}
    # About a third of the heartbeat timeout (1.5 s) apart: the closest pair shows the pace
    # (one probe held up by a busy machine lengthens one gap, not all of them).
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(beats)]
    assert min(gaps) <= 0.8, gaps  # they beat every 0.5 s and a probe


def test_no_heartbeat_while_the_gateway_cannot_answer(supervised: Supervised) -> None:
    """A stopped gateway sends no heartbeat: they come from its answers, not a side thread."""
    supervised.next_message("heartbeat")
    supervised.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(0.2)
        supervised.buffer = b""
        supervised.sock.settimeout(0.01)
        with contextlib.suppress(TimeoutError, BlockingIOError):
            while supervised.sock.recv(65536):
                pass
        with pytest.raises(AssertionError):
            supervised.next_message("heartbeat", timeout=2.5)
    finally:
        supervised.proc.send_signal(signal.SIGCONT)
    supervised.next_message("heartbeat")


def test_relief_holds_launches_and_stops_the_newest_tree(supervised: Supervised) -> None:
    """On relief the newest managed tree is stopped (its output kept) and launches are held."""
    client = supervised.client

    def state(job_id: str) -> str:
        return str(client.get(f"/v1/jobs/{job_id}").json()["state"])

    older = client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
    wait_until(lambda: state(older) == "running", "the older job's start")
    newer = client.post(
        "/v1/jobs", json={"argv": ["sh", "-c", "echo kept; sleep 60"], "owner": "b"}
    ).json()["id"]
    wait_until(lambda: client.get(f"/v1/jobs/{newer}/output").text == "kept\n", "its output")
    supervised.send("relief")
    wait_until(lambda: state(newer) == "stopped", "the newest tree's stop")
    assert supervised.client.get(f"/v1/jobs/{older}").json()["state"] == "running"
    assert supervised.client.get(f"/v1/jobs/{newer}/output").text == "kept\n"
    held = supervised.client.post("/v1/jobs", json={"argv": ["true"], "owner": "c"}).json()["id"]
    wait_until(lambda: client.get(f"/v1/jobs/{held}").json()["reason"] == "held", "the held reason")
    time.sleep(0.5)  # and it stays held: launches are held, not merely late
    job = supervised.client.get(f"/v1/jobs/{held}").json()
    assert (job["state"], job["reason"]) == ("waiting", "held")
    assert "relief" in supervised.client.get("/v1/status").json()["holds"]


def test_recovery_mode_holds_work_until_a_repair(supervised: Supervised) -> None:
    """Recovery mode holds queued jobs and says so; a repair checks, clears and releases gently."""
    supervised.next_message("hello")
    supervised.send("recovery_mode", on=True)
    wait_until(
        lambda: supervised.client.get("/v1/needs-you").json()["headline"] == "recovery mode",
        "recovery mode's headline",
    )
    ids = [
        supervised.client.post("/v1/jobs", json={"argv": ["sleep", "0.5"]}).json()["id"]
        for _ in range(2)
    ]
    wait_until(
        lambda: {supervised.client.get(f"/v1/jobs/{i}").json()["reason"] for i in ids} == {"held"},
        "the held reasons",
    )
    time.sleep(0.5)  # and they stay held
    assert {supervised.client.get(f"/v1/jobs/{i}").json()["reason"] for i in ids} == {"held"}
    assert supervised.client.get("/v1/status").status_code == 200  # status still served
    answer = supervised.client.post("/v1/repair", timeout=30).json()
    assert answer["repaired"] is True, answer
    supervised.next_message("repaired")
    # One at a time: judged from the jobs' own times, not from two GETs in turn
    # (a job read as running may end, and the next start, between the two reads).
    views = []
    for _ in range(200):
        views = [supervised.client.get(f"/v1/jobs/{i}").json() for i in ids]
        if [v["state"] for v in views] == ["exited", "exited"]:
            break
        time.sleep(0.05)
    assert [v["state"] for v in views] == ["exited", "exited"], views
    first, second = sorted(views, key=lambda v: v["started_at"])
    assert second["started_at"] >= first["ended_at"], views
    assert supervised.client.get("/v1/needs-you").json()["headline"] != "recovery mode"


def test_explicit_stop_and_restart_are_announced(tmp_path: Path, supervised: Supervised) -> None:
    """POST /v1/restart tells the supervisor 'restart' and exits; a stop says 'stop'."""
    supervised.next_message("hello")
    assert supervised.client.post("/v1/restart").json() == {"state": "restarting"}
    supervised.next_message("restart")
    assert supervised.proc.wait(timeout=20) == 0


def test_shutdown_says_stop_to_the_supervisor(supervised: Supervised) -> None:
    """POST /v1/shutdown sends 'stop' first, so the supervisor never takes it for a crash."""
    supervised.next_message("hello")
    supervised.client.post("/v1/shutdown")
    supervised.next_message("stop")
    assert supervised.proc.wait(timeout=20) == 0


def test_losing_the_supervisor_shuts_the_gateway_down_with_its_trees(
    supervised: Supervised,
) -> None:
    """End of file on the channel runs the shutdown path: the gateway and its jobs are gone."""
    job = supervised.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
    for _ in range(100):
        if supervised.client.get(f"/v1/jobs/{job}").json()["state"] == "running":
            break
        time.sleep(0.05)
    trees = [p.pid for p in psutil.Process(supervised.proc.pid).children(recursive=True)]
    supervised.sock.close()
    assert supervised.proc.wait(timeout=20) == 0
    time.sleep(0.3)
    alive = [p for p in trees if not zombie_or_gone(p)]
    assert alive == []


def test_gateway_alone_says_it_has_no_watchdog(tmp_path: Path) -> None:
    """`roomkeeper gateway` without a supervisor says that it runs with no watchdog."""
    port = free_port()
    env = gateway_env(tmp_path)
    env.pop("ROOMKEEPER_IPC_FD", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "roomkeeper", "gateway", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            time.sleep(0.05)
        token = (tmp_path / "home" / "token").read_text().strip()
        restart = httpx.post(
            f"http://127.0.0.1:{port}/v1/restart", headers={"Authorization": f"Bearer {token}"}
        )
        assert restart.status_code == 409
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert b"no watchdog" in err


def test_a_latched_recovery_mode_holds_work_from_the_first_moment(tmp_path: Path) -> None:
    """Started under a latched recovery mode, the gateway launches nothing, even at first."""
    with supervise(tmp_path, ROOMKEEPER_RECOVERY_MODE="1") as s:
        job = s.client.post("/v1/jobs", json={"argv": ["true"]}).json()["id"]
        wait_until(lambda: s.client.get(f"/v1/jobs/{job}").json()["reason"] == "held", "held")
        time.sleep(0.5)  # and it stays held
        answer = s.client.get(f"/v1/jobs/{job}").json()
        assert (answer["state"], answer["reason"]) == ("waiting", "held")
        assert s.client.get("/v1/needs-you").json()["headline"] == "recovery mode"

"""The gateway over real HTTP: auth, jobs, leases and hooks, status words, restart, shutdown."""

from __future__ import annotations

import http.server
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.gateways import (
    RunningGateway,
    gateway_env,
    roomkeeper_cli,
    running_gateway,
    wait_until,
    zombie_or_gone,
)

pytestmark = pytest.mark.kernel


class HookServer:
    """A loopback server that records the release hooks it receives."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        calls = self.calls

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                calls.append((self.command, self.path))
                self.send_response(204)
                self.end_headers()

            do_DELETE = do_POST = do_GET = _answer  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()


def wait_state(gw: RunningGateway, job_id: str, *states: str, timeout: float = 20) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        job = gw.client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states or time.monotonic() > deadline:
            return job  # type: ignore[no-any-return]
        time.sleep(0.05)


def test_calls_need_the_token_and_a_wrong_one_changes_nothing(gw: RunningGateway) -> None:
    """Without or with a wrong token: 401 and nothing queued; open endpoints need none."""
    assert gw.anonymous.post("/v1/jobs", json={"argv": ["true"]}).status_code == 401
    bad = gw.anonymous.post(
        "/v1/jobs", json={"argv": ["true"]}, headers={"Authorization": "Bearer nope"}
    )
    assert bad.status_code == 401
    assert gw.client.get("/v1/jobs").json() == []
    for path in ("/health", "/metrics", "/", "/v1/feed"):
        assert gw.anonymous.get(path).status_code == 200, path
    assert stat.S_IMODE((gw.home / "token").stat().st_mode) == 0o600


def test_job_runs_and_its_output_is_kept(gw: RunningGateway) -> None:
    """POST /v1/jobs runs argv without a shell; state, exit code and output are served."""
    created = gw.client.post(
        "/v1/jobs", json={"argv": ["sh", "-c", "echo out; exit 5"], "owner": "alice"}
    )
    assert created.status_code == 201
    job_id = created.json()["id"]
    job = wait_state(gw, job_id, "exited")
    assert (job["state"], job["exit_code"], job["owner"]) == ("exited", 5, "alice")
    assert job["submitted_at"] <= job["started_at"] <= job["ended_at"]
    assert gw.client.get(f"/v1/jobs/{job_id}/output").text == "out\n"
    streamed = gw.client.get(f"/v1/jobs/{job_id}/output", params={"follow": "true"})
    assert streamed.text == "out\n"
    assert [j["id"] for j in gw.client.get("/v1/jobs", params={"owner": "alice"}).json()] == [
        job_id
    ]
    assert gw.client.get("/v1/jobs", params={"owner": "bob"}).json() == []


def test_jobs_do_not_inherit_roomkeeper_variables(tmp_path: Path) -> None:
    """A managed job sees no ROOMKEEPER_* variable, so it cannot find the gateway's keys."""
    with running_gateway(tmp_path, ROOMKEEPER_SECRET_HINT="x") as gw:
        job_id = gw.client.post("/v1/jobs", json={"argv": ["env"]}).json()["id"]
        wait_state(gw, job_id, "exited")
        output = gw.client.get(f"/v1/jobs/{job_id}/output").text
    assert "ROOMKEEPER_" not in output
    assert "PATH=" in output


def test_cancel_waiting_and_stop_running(gw: RunningGateway) -> None:
    """POST .../cancel stops a running job's tree; the job and its record stay."""
    running = gw.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
    assert wait_state(gw, running, "running")["state"] == "running"
    gw.client.post(f"/v1/jobs/{running}/cancel")
    assert wait_state(gw, running, "stopped")["state"] == "stopped"
    assert gw.client.post("/v1/jobs/nope/cancel").status_code == 404


def test_delete_removes_only_an_ended_job(gw: RunningGateway) -> None:
    """DELETE refuses a live job (409 not_ended), then removes the ended one: 404 afterwards."""
    job_id = gw.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
    wait_state(gw, job_id, "running")
    refused = gw.client.delete(f"/v1/jobs/{job_id}")
    assert refused.status_code == 409 and refused.json()["reason"] == "not_ended"
    assert f"/v1/jobs/{job_id}/cancel" in refused.json()["detail"]
    gw.client.post(f"/v1/jobs/{job_id}/cancel")
    wait_state(gw, job_id, "stopped")
    log = gw.home / "logs" / f"{job_id}.log"
    assert log.exists()
    removed = gw.client.delete(f"/v1/jobs/{job_id}")
    assert removed.status_code == 204, removed.text
    assert gw.client.get(f"/v1/jobs/{job_id}").status_code == 404
    assert gw.client.get(f"/v1/jobs/{job_id}/output").status_code == 404
    assert job_id not in {j["id"] for j in gw.client.get("/v1/jobs").json()}
    assert not log.exists()  # its kept output went with it
    assert gw.client.delete(f"/v1/jobs/{job_id}").status_code == 404


def test_delete_removes_only_a_settled_call(gw: RunningGateway) -> None:
    """DELETE refuses a pending call (not_ended), a cancelled one (in_doubt); a settled one goes."""
    pending = gw.client.post("/v1/calls", json={"kind": "write"}).json()["id"]
    refused = gw.client.delete(f"/v1/calls/{pending}")
    assert refused.status_code == 409 and refused.json()["reason"] == "not_ended"
    gw.client.post(f"/v1/calls/{pending}/cancel")
    doubt = gw.client.delete(f"/v1/calls/{pending}")
    assert doubt.status_code == 409 and doubt.json()["reason"] == "in_doubt"
    gw.client.post(f"/v1/calls/{pending}/outcome", json={"outcome": "failed"})  # refused: 409
    gw.client.post(f"/v1/calls/{pending}/resolve", json={"resolution": "failed"})
    assert gw.client.delete(f"/v1/calls/{pending}").status_code == 204
    assert gw.client.get(f"/v1/calls/{pending}").status_code == 404


def test_queue_bound_answers_429_with_the_reason(tmp_path: Path) -> None:
    """Past ROOMKEEPER_MAX_WAITING_PER_OWNER the API refuses at once with owner_queue_full."""
    with running_gateway(
        tmp_path, ROOMKEEPER_MAX_RUNNING="1", ROOMKEEPER_MAX_WAITING_PER_OWNER="1"
    ) as gw:
        blocker = gw.client.post("/v1/jobs", json={"argv": ["sleep", "30"]})
        # Running, no longer waiting: otherwise it fills the owner's one waiting place.
        wait_state(gw, blocker.json()["id"], "running")
        first = gw.client.post("/v1/jobs", json={"argv": ["true"]})
        assert first.status_code == 201
        wait_state(gw, first.json()["id"], "waiting")
        second = gw.client.post("/v1/jobs", json={"argv": ["true"]})
        assert second.status_code == 429
        assert second.json()["reason"] == "owner_queue_full"


def test_lease_grant_retry_refuse_and_release_runs_the_hook(
    gw: RunningGateway, hooks: HookServer
) -> None:
    """201 granted, 200 on retry, 409 with reason when no room, DELETE runs the hook."""
    body = {
        "id": "turn-1",
        "owner": "queen",
        "memory_bytes": 10**6,
        "release": {"method": "DELETE", "url": hooks.url("/chat/turn-1")},
    }
    granted = gw.client.post("/v1/leases", json=body)
    assert granted.status_code == 201 and granted.json()["state"] == "granted"
    assert gw.client.post("/v1/leases", json=body).status_code == 200
    refused = gw.client.post("/v1/leases", json={"memory_bytes": 10**15})
    assert refused.status_code == 409
    assert refused.json()["reason"] == "memory" and "no room" in refused.json()["summary"]
    released = gw.client.delete("/v1/leases/turn-1").json()
    assert released["state"] == "released" and released["hook_outcome"] == "ok 204"
    assert hooks.calls == [("DELETE", "/chat/turn-1")]


def test_lease_without_heartbeat_expires_and_runs_its_hook(
    gw: RunningGateway, hooks: HookServer
) -> None:
    """A lease whose holder stops heartbeating expires, releases its memory and runs its hook."""
    gw.client.post(
        "/v1/leases",
        json={
            "id": "l",
            "memory_bytes": 10**6,
            "ttl_s": 5.0,  # the heartbeat below must land before a busy machine expires it
            "release": {"url": hooks.url("/chat/l")},
        },
    )
    hb = gw.client.post("/v1/leases/l/heartbeat", json={"ttl_s": 2.0})
    assert hb.status_code == 200
    deadline = time.monotonic() + 30
    while not hooks.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hooks.calls == [("DELETE", "/chat/l")]
    leases = {lease["id"]: lease for lease in gw.client.get("/v1/leases").json()}
    assert leases["l"]["state"] == "expired"
    # The hook's server sees the call before the gateway has its answer and releases.
    wait_until(
        lambda: gw.client.get("/v1/status").json()["guard"]["young"] == 0,
        "the expired lease's reservation released after its hook",
        timeout=10,
    )


def test_lease_wait_s_waits_for_room_then_refuses(gw: RunningGateway) -> None:
    """With wait_s the gateway retries for that long before answering 409."""
    start = time.monotonic()
    refused = gw.client.post("/v1/leases", json={"memory_bytes": 10**15, "wait_s": 1.0})
    assert refused.status_code == 409
    assert time.monotonic() - start >= 0.75


def test_release_hooks_must_be_loopback(gw: RunningGateway) -> None:
    """A hook to any other address is refused with 422, for leases and jobs."""
    for path, body in (
        ("/v1/leases", {"release": {"url": "http://10.0.0.1/chat/x"}}),
        ("/v1/jobs", {"argv": ["true"], "release": {"url": "http://example.com/"}}),
        ("/v1/leases", {"relieve": {"url": "http://10.0.0.1/relieve/x"}}),
    ):
        answer = gw.client.post(path, json=body)
        assert answer.status_code == 422
        assert "loopback" in answer.text
    said = gw.client.post("/v1/leases", json={"relieve": {"url": "ftp://127.0.0.1/x"}}).text
    assert "relieve.url must be" in said and "release.url" not in said


def test_a_lease_shows_its_relieve_hook_and_status_its_baseline(gw: RunningGateway) -> None:
    """A relieve hook is kept as given (POST by default); /v1/status says the baseline, the
    leases ended without a release hook and the processes that grew; /metrics the gauges."""
    hook = {"url": "http://127.0.0.1:9/relieve/r1"}
    lease = gw.client.post("/v1/leases", json={"id": "r1", "relieve": hook}).json()
    assert lease["relieve"] == {"method": "POST", "url": hook["url"]}
    assert lease["relieve_outcome"] is None
    ended = gw.client.delete("/v1/leases/r1").json()
    assert ended["state"] == "released"  # never asked to relieve: an ordinary release
    wait_until(
        lambda: gw.client.get("/v1/status").json()["baseline"]["endings"] >= 1,
        "the baseline recorded after the lease's end",
        timeout=10,
    )
    status = gw.client.get("/v1/status").json()
    baseline = status["baseline"]
    assert baseline["leases_ended_without_hook"] >= 1 and baseline["baseline_bytes"] > 0
    assert baseline["not_given_back"] is False
    assert all({"pid", "name", "bytes"} == set(g) for g in baseline["grew"])
    assert (status["pressure"]["relieves"], status["pressure"]["relieved"]) == (0, 0)
    metrics = gw.anonymous.get("/metrics").text
    assert "roomkeeper_memory_not_given_back 0.0" in metrics
    assert "roomkeeper_memory_baseline_bytes " in metrics
    assert "roomkeeper_leases_ended_without_hook_total " in metrics
    assert 'roomkeeper_pressure_steps_total{step="relieve"} 0.0' in metrics


def test_job_release_hook_runs_when_the_job_ends(gw: RunningGateway, hooks: HookServer) -> None:
    """A job's release hook runs once it ends, whatever the outcome."""
    job_id = gw.client.post(
        "/v1/jobs", json={"argv": ["false"], "release": {"url": hooks.url("/chat/job")}}
    ).json()["id"]
    wait_state(gw, job_id, "exited")
    deadline = time.monotonic() + 5
    while not hooks.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hooks.calls == [("DELETE", "/chat/job")]


def test_needs_you_headlines_come_from_the_vocabulary(tmp_path: Path) -> None:
    """needs-you says 'no room in the container: memory' or 'guard off', and no path."""
    with running_gateway(tmp_path / "a", ROOMKEEPER_MEMORY_LIMIT_MB="1") as gw:
        answer = gw.client.get("/v1/needs-you").json()
        assert answer["headline"] == "no room in the container: memory"
        assert "/" not in answer["body"]
    with running_gateway(tmp_path / "b", ROOMKEEPER_GUARD="off") as gw:
        assert gw.client.get("/v1/needs-you").json()["headline"] == "guard off"


def test_gateway_keeps_its_reserve_off_the_line(tmp_path: Path) -> None:
    """ROOMKEEPER_GATEWAY_RESERVE_MB comes off the guard's line: a fitting lease is refused."""
    with running_gateway(tmp_path / "a", ROOMKEEPER_GATEWAY_RESERVE_MB="0") as gw:
        line0 = gw.client.get("/v1/status").json()
        decision0 = gw.client.post("/v1/leases", json={"id": "probe", "memory_bytes": 0})
        assert decision0.status_code == 201, line0
    huge = str(10**9)  # MiB: far more than any machine has
    with running_gateway(tmp_path / "b", ROOMKEEPER_GATEWAY_RESERVE_MB=huge) as gw:
        refused = gw.client.post("/v1/leases", json={"id": "probe", "memory_bytes": 0})
        assert refused.status_code == 409
        assert refused.json()["reason"] == "memory"


def test_metrics_follow_prometheus_naming_without_owner_labels(gw: RunningGateway) -> None:
    """/metrics exposes memory, disk, jobs by state, decisions, queue wait and leases."""
    gw.client.post("/v1/jobs", json={"argv": ["true"], "owner": "secret-owner"})
    text = gw.anonymous.get("/metrics").text
    for name in (
        "roomkeeper_memory_used_bytes",
        "roomkeeper_memory_limit_bytes",
        "roomkeeper_disk_free_bytes",
        'roomkeeper_jobs{state="running"}',
        'roomkeeper_refusals_total{reason="memory"}',
        "roomkeeper_queue_wait_seconds_bucket",
        "roomkeeper_leases",
    ):
        assert name in text, name
    assert "secret-owner" not in text and "owner=" not in text


def test_feed_carries_no_command_path_or_output(gw: RunningGateway) -> None:
    """The open feed shows ids, owners, states and numbers, never argv, paths or output."""
    job_id = gw.client.post(
        "/v1/jobs", json={"argv": ["sh", "-c", "echo TOPSECRET"], "owner": "alice"}
    ).json()["id"]
    wait_state(gw, job_id, "exited")
    feed = gw.anonymous.get("/v1/feed").text
    assert job_id in feed and "alice" in feed
    assert "TOPSECRET" not in feed and "echo" not in feed and str(gw.home) not in feed


def test_jobs_and_leases_survive_a_restart_with_a_new_boot_id(tmp_path: Path) -> None:
    """After a restart the journal still lists old jobs; a held lease keeps its reservation."""
    with running_gateway(tmp_path) as gw:
        boot1 = gw.anonymous.get("/health").json()["boot_id"]
        job_id = gw.client.post("/v1/jobs", json={"argv": ["true"]}).json()["id"]
        wait_state(gw, job_id, "exited")
        gw.client.post("/v1/leases", json={"id": "kept", "memory_bytes": 5 * 10**8, "ttl_s": 600})
    with running_gateway(tmp_path) as gw:
        assert gw.anonymous.get("/health").json()["boot_id"] != boot1
        job = gw.client.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "exited"
        status = gw.client.get("/v1/status").json()
        assert status["guard"]["reserved_bytes"] == 5 * 10**8
        assert gw.client.delete("/v1/leases/kept").json()["state"] == "released"


def test_shutdown_stops_managed_trees_and_the_process(tmp_path: Path) -> None:
    """POST /v1/shutdown runs the shutdown path: trees stopped, process exits, no restart."""
    with running_gateway(tmp_path) as gw:
        job_id = gw.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
        wait_state(gw, job_id, "running")
        pids = [p.pid for p in psutil.Process(gw.proc.pid).children(recursive=True)]
        assert gw.client.post("/v1/shutdown").json() == {"state": "stopping"}
        assert gw.proc.wait(timeout=15) == 0
        time.sleep(0.2)
        alive = [p for p in pids if not zombie_or_gone(p)]
        assert alive == []
    with running_gateway(tmp_path) as gw:
        assert gw.client.get(f"/v1/jobs/{job_id}").json()["state"] == "stopped"


def test_sigterm_takes_the_same_path(tmp_path: Path) -> None:
    """SIGTERM stops the gateway cleanly (exit 0), and says so in its log."""
    with running_gateway(tmp_path) as gw:
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=15) == 0
    assert "gateway stopped" in "".join(p.read_text() for p in tmp_path.glob("gateway-*.log"))


def test_workspace_holding_the_token_is_refused(tmp_path: Path) -> None:
    """A workspace that contains ROOMKEEPER_HOME's token is a usage error, not a start."""
    env = gateway_env(tmp_path, ROOMKEEPER_WORKSPACE=str(tmp_path))
    result = roomkeeper_cli(env, "gateway", "--port", "0")
    assert result.returncode == 2
    assert "contains the gateway's token" in result.stderr


def test_cli_without_a_gateway_says_how_to_start_one(tmp_path: Path) -> None:
    """roomkeeper jobs with no gateway running says so and how to start one."""
    env = {**os.environ, "ROOMKEEPER_HOME": str(tmp_path / "none")}
    result = roomkeeper_cli(env, "jobs")
    assert result.returncode == 1
    assert "roomkeeper serve" in result.stderr and "Traceback" not in result.stderr


def test_cli_run_streams_output_and_exits_with_the_job_code(gw: RunningGateway) -> None:
    """roomkeeper run -- CMD prints the job's output and exits with its exit code."""
    env = {**os.environ, "ROOMKEEPER_HOME": str(gw.home)}
    result = roomkeeper_cli(env, "run", "--owner", "me", "--", "sh", "-c", "echo hello; exit 3")
    assert (result.returncode, result.stdout) == (3, "hello\n")
    listed = roomkeeper_cli(env, "jobs", "--owner", "me")
    assert listed.returncode == 0 and "exited" in listed.stdout


def test_a_chunked_body_over_the_limit_is_refused(gw: RunningGateway) -> None:
    """A body sent without Content-Length is counted as it arrives: over 1 MiB is 413."""

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * 65536

    answer = gw.client.post(
        "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 413
    assert gw.client.get("/health").status_code == 200


def test_jobs_in_flight_at_a_crash_are_uncertain_after_restart(tmp_path: Path) -> None:
    """A job running when the gateway was SIGKILLed is uncertain afterwards, and its output ends."""
    with running_gateway(tmp_path) as gw:
        job_id = gw.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
        wait_state(gw, job_id, "running")
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait()
    with running_gateway(tmp_path) as gw:
        job = gw.client.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "uncertain"
        streamed = gw.client.get(f"/v1/jobs/{job_id}/output", params={"follow": "true"}, timeout=10)
        assert streamed.status_code == 200
        listed = gw.client.get("/v1/jobs", params={"state": "uncertain"}).json()
        assert [j["id"] for j in listed] == [job_id]


def test_shutdown_does_not_wait_for_an_open_output_stream(tmp_path: Path) -> None:
    """SIGTERM while `roomkeeper run` streams a long job: the gateway stops in its deadline."""
    with running_gateway(tmp_path, ROOMKEEPER_SHUTDOWN_S="6") as gw:
        env = {**os.environ, "ROOMKEEPER_HOME": str(gw.home)}
        with subprocess.Popen(
            [sys.executable, "-m", "roomkeeper", "run", "--", "sleep", "120"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ) as client:
            try:
                deadline = time.monotonic() + 90  # the CLI's start, on a busy machine
                while not any(j["state"] == "running" for j in gw.client.get("/v1/jobs").json()):
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
                time.sleep(0.5)  # the client is now following the output
                start = time.monotonic()
                gw.proc.send_signal(signal.SIGTERM)
                assert gw.proc.wait(timeout=20) == 0
                assert time.monotonic() - start < 6 + 2
                assert client.wait(timeout=20) != 0
            finally:
                if client.poll() is None:
                    client.kill()


def test_an_empty_token_file_is_replaced_not_trusted(tmp_path: Path) -> None:
    """A token file left empty by a crash is replaced: an empty token never opens the API."""
    home = tmp_path / "home"
    home.mkdir(parents=True)
    (home / "token").write_text("")
    with running_gateway(tmp_path) as gw:
        assert len(gw.token) >= 32
        assert gw.anonymous.get("/v1/jobs").status_code == 401
        assert (
            gw.anonymous.get("/v1/jobs", headers={"Authorization": "Bearer x"}).status_code == 401
        )


class _HealthOnly(http.server.BaseHTTPRequestHandler):
    """Answers /health, then drops every other request unanswered (a gateway dying mid-call)."""

    def do_GET(self) -> None:
        if self.path == "/health":
            body = b'{"boot_id": "fake-boot"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_gateway_that_stops_answering_mid_call_is_a_clear_error(tmp_path: Path) -> None:
    """The CLI found a gateway, then the call broke: one line that says so, exit 1, no traceback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HealthOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = gateway_env(tmp_path)
        home = Path(env["ROOMKEEPER_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "token").write_text("t" * 40)
        port = server.server_address[1]
        started = psutil.Process().create_time()  # it passes for the recorded gateway
        record = {"pid": os.getpid(), "started": started, "boot_id": "fake-boot", "port": port}
        (home / "gateway.json").write_text(json.dumps(record))
        done = roomkeeper_cli(env, "status")
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 1
    assert "the gateway stopped answering" in done.stderr
    assert "Traceback" not in done.stderr

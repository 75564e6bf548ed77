"""Nobody else in: private files, a token jobs cannot take, a Host check, a contract.

Each test names the finding it holds.  Where the behaviour is the kernel's
(file modes, another user's access), a real gateway and real jobs are used.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roomkeeper.errors import UsageError
from roomkeeper.paths import load_token, validate_home
from roomkeeper.processes.job_user import read_job_user
from tests.gateways import RunningGateway, free_port, gateway_env, roomkeeper_cli, running_gateway

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("security"), INHERITED_SECRET="s3cr3t") as g:
        yield g


def finished(gw: RunningGateway, job_id: str, timeout: float = 20) -> dict[str, Any]:
    """The job once it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = gw.client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] not in ("waiting", "running"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# ------------------------------------------------------------------ files


def test_logs_are_0600_and_directories_0700(gw: RunningGateway) -> None:
    """A job's log is 0600; logs/, the workspace and the journal are the gateway's alone."""
    job_id = gw.client.post("/v1/jobs", json={"argv": ["echo", "hi"]}).json()["id"]
    assert finished(gw, job_id)["exit_code"] == 0
    log = gw.home / "logs" / f"{job_id}.log"
    assert mode(log) == 0o600
    assert mode(gw.home / "logs") == 0o700
    assert mode(gw.home.parent / "ws") == 0o700
    assert mode(gw.home / "journal.db") == 0o600
    assert mode(gw.home) == 0o700


def test_the_systemd_unit_makes_its_state_directory_0700() -> None:
    """StateDirectory= alone gives 0755: the unit asks for 0700."""
    unit = (ROOT / "contrib" / "roomkeeper.service").read_text()
    assert "\nStateDirectoryMode=0700\n" in unit


# ------------------------------------------------------- home and token


def test_a_home_others_can_write_is_refused_at_start(tmp_path: Path) -> None:
    """A pre-existing 0777 home with a planted token: the gateway refuses, saying the fix."""
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    (home / "token").write_text("p" * 43 + "\n")
    env = gateway_env(tmp_path)
    done = roomkeeper_cli(env, "gateway", "--port", str(free_port()))
    assert done.returncode != 0
    assert "writable by other users (mode 0777)" in done.stderr
    assert f"chmod 700 {home}" in done.stderr


def test_a_home_of_another_user_is_refused(tmp_path: Path) -> None:
    """A home that another uid owns is refused with the chown that fixes it."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, 65534, -1)
    with pytest.raises(UsageError, match=r"belongs to uid 65534.*chown 0 "):
        validate_home(home)


def test_a_home_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    """ROOMKEEPER_HOME as a symbolic link is refused: point it at the real directory."""
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "home").symlink_to(tmp_path / "real")
    with pytest.raises(UsageError, match="is a symbolic link"):
        validate_home(tmp_path / "home")


def test_a_readable_home_and_its_logs_are_made_0700(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 0755 home (systemd's default) and an old 0755 logs/ are repaired, and the repair logged."""
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    home.chmod(0o755)
    (home / "logs").chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="roomkeeper"):
        validate_home(home)
    assert (mode(home), mode(home / "logs")) == (0o700, 0o700)
    assert "was mode 0755; made it 0700" in caplog.text


@pytest.mark.parametrize("planted", ["0644", "link", "fifo", "other-user"])
def test_a_token_that_others_may_know_is_refused(
    tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The token must be a regular 0600 file of ours, opened without following a link."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    token = home / "token"
    if planted == "0644":
        token.write_text("p" * 43)
        token.chmod(0o644)
    elif planted == "link":
        (tmp_path / "elsewhere").write_text("p" * 43)
        (tmp_path / "elsewhere").chmod(0o600)
        token.symlink_to(tmp_path / "elsewhere")
    elif planted == "fifo":
        os.mkfifo(token, 0o600)
    else:
        if os.geteuid() != 0:
            pytest.skip("only root can give a file to another user")
        token.write_text("p" * 43)
        token.chmod(0o600)
        os.chown(token, 65534, -1)
    with caplog.at_level(logging.ERROR, logger="roomkeeper"), pytest.raises(UsageError) as err:
        load_token(home)
    assert f"rm {token}" in str(err.value)
    assert str(err.value) in caplog.text


def test_a_token_of_ours_is_kept_and_a_new_one_is_0600(tmp_path: Path) -> None:
    """The checks let the gateway's own token through, and a new token is made 0600."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    first = load_token(home)
    assert mode(home / "token") == 0o600
    assert load_token(home) == first


# --------------------------------------------------------- the journal


def test_the_journal_stores_only_the_env_the_submitter_gave(gw: RunningGateway) -> None:
    """The job still inherits the gateway's variables, but only its own env reaches the disk."""
    answer = gw.client.post("/v1/jobs", json={"argv": ["env"], "env": {"GIVEN_BY_SUBMITTER": "1"}})
    job_id = answer.json()["id"]
    assert finished(gw, job_id)["exit_code"] == 0
    output = gw.client.get(f"/v1/jobs/{job_id}/output").text
    assert "INHERITED_SECRET=s3cr3t" in output and "GIVEN_BY_SUBMITTER=1" in output
    stored = b"".join(p.read_bytes() for p in gw.home.glob("journal.db*"))
    assert b"GIVEN_BY_SUBMITTER" in stored
    assert b"s3cr3t" not in stored


# ----------------------------------------------------------- the browser


@pytest.mark.parametrize("host", ["127.0.0.1:8765", "localhost", "LOCALHOST:1", "[::1]:8765"])
def test_loopback_hosts_are_answered(gw: RunningGateway, host: str) -> None:
    """127.0.0.1, localhost and [::1] are answered, with any port."""
    assert gw.anonymous.get("/health", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/feed", "/metrics", "/openapi.json", "/health", "/"])
def test_a_rebound_host_is_refused(gw: RunningGateway, path: str) -> None:
    """A DNS-rebinding page's Host (its own name) gets 403 on every route, open ones included."""
    answer = gw.anonymous.get(path, headers={"Host": "attacker.example:8765"})
    assert answer.status_code == 403
    assert answer.json()["reason"] == "host_not_allowed"


def test_a_request_from_another_site_is_refused(gw: RunningGateway) -> None:
    """An Origin that is not the gateway's own is refused; its own page's Origin is not."""
    host = gw.url.removeprefix("http://")
    job = {"argv": ["true"]}
    other = gw.client.post("/v1/jobs", json=job, headers={"Origin": "https://evil.example"})
    assert (other.status_code, other.json()["reason"]) == (403, "origin_not_allowed")
    assert gw.client.get("/v1/feed", headers={"Origin": "null"}).status_code == 403
    own = gw.client.post("/v1/jobs", json=job, headers={"Origin": f"http://{host}"})
    assert own.status_code == 201


def test_docs_need_no_network_and_openapi_stays(gw: RunningGateway) -> None:
    """/docs (swagger-ui from a CDN) is off; /openapi.json is still served."""
    assert gw.anonymous.get("/docs").status_code == 404
    assert gw.anonymous.get("/redoc").status_code == 404
    assert gw.anonymous.get("/openapi.json").json()["info"]["title"] == "roomkeeper"
    page = gw.anonymous.get("/").text
    assert "<script src=" not in page and "https://" not in page  # the Health page loads nothing


# ------------------------------------------------------------ job user


def test_jobs_as_our_own_user_are_said_once_at_start(gw: RunningGateway) -> None:
    """Without a job user the gateway says once that jobs could read its token."""
    (log,) = gw.home.parent.glob("gateway-*.log")
    text = log.read_text()
    assert text.count("managed jobs run as roomkeeper's own user") == 1
    assert "not against a hostile job" in text


@pytest.fixture
def job_user() -> str:
    """A real unprivileged user, made if absent (root only)."""
    if os.geteuid() != 0:
        pytest.skip("running jobs as another user needs roomkeeper to run as root")
    try:
        pwd.getpwnam("rkjob")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "rkjob"], check=True)
    return "rkjob"


def test_a_job_user_reads_neither_token_nor_journal_nor_other_logs(job_user: str) -> None:
    """As root with ROOMKEEPER_JOB_USER, a job runs as that user in its own workspace and every
    `cat` of the token, the journal and another job's log is refused by the kernel."""
    top = Path(tempfile.mkdtemp(prefix="rk-job-user-"))
    try:
        top.chmod(0o711)  # only the home's own modes may keep the job out
        home = top / "home"
        with running_gateway(
            top, ROOMKEEPER_JOB_USER=job_user, ROOMKEEPER_WORKSPACE=str(home / "workspace")
        ) as g:
            first = g.client.post("/v1/jobs", json={"argv": ["echo", "first job's output"]})
            first_id = first.json()["id"]
            assert finished(g, first_id)["exit_code"] == 0
            script = (
                "id -un; pwd; touch mine && echo wrote; "
                f"cat {home}/token; cat {home}/journal.db; cat {home}/logs/{first_id}.log; "
                f"ls {home}; echo end"
            )
            job_id = g.client.post("/v1/jobs", json={"argv": ["/bin/sh", "-c", script]}).json()[
                "id"
            ]
            finished(g, job_id)
            out = g.client.get(f"/v1/jobs/{job_id}/output").text
            token = g.token
            workspace = home / "workspace"
            assert (workspace.stat().st_uid, mode(workspace)) == (
                pwd.getpwnam(job_user).pw_uid,
                0o700,
            )
        lines = out.splitlines()
        assert lines[:3] == [job_user, str(workspace), "wrote"], out
        assert out.count("Permission denied") == 4, out  # token, journal, log, ls of the home
        assert token not in out and "first job's output" not in out
        assert (workspace / "mine").stat().st_uid == pwd.getpwnam(job_user).pw_uid
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_job_user_needs_root_and_an_existing_user() -> None:
    """A job user named while not root, or one that does not exist, is refused saying why."""
    with pytest.raises(UsageError, match="needs roomkeeper to run as root"):
        read_job_user({"ROOMKEEPER_JOB_USER": "nobody"}, euid=1000)
    with pytest.raises(UsageError, match="no such user; create it"):
        read_job_user({"ROOMKEEPER_JOB_USER": "no-such-user-rk"}, euid=0)
    assert read_job_user({}) is None


# ------------------------------------------------------ the API contract


def test_every_error_has_one_shape_with_a_reason(gw: RunningGateway) -> None:
    """401, 404, 422 (NUL text and schema errors alike) all answer ``reason`` beside ``detail``."""
    answers = {
        "unauthorized": gw.anonymous.get("/v1/jobs"),
        "not_found": gw.client.get("/v1/jobs/nope"),
        "invalid_request": gw.client.post("/v1/jobs", json={"argv": ["tr\u0000ue"]}),
    }
    schema_error = gw.client.post("/v1/jobs", json={"argv": []})
    for reason, answer in answers.items():
        body = answer.json()
        assert body["reason"] == reason and isinstance(body["detail"], str), body
    assert schema_error.json()["reason"] == "invalid_request"
    assert isinstance(schema_error.json()["detail"], str) and schema_error.json()["errors"]


def test_every_route_declares_its_error_answers_and_release_url(gw: RunningGateway) -> None:
    """Each operation documents 401/404/409/422/429/507 with the error model; release.url has
    the server's own pattern."""
    document = gw.anonymous.get("/openapi.json").json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            declared = set(operation["responses"])
            assert {"401", "404", "409", "422", "429", "507"} <= declared, (method, path)
    url = document["components"]["schemas"]["ReleaseIn"]["properties"]["url"]
    assert url["pattern"].startswith("^https?://(127")


# ------------------------------------------------------- the CLI's token


class _Impostor:
    """A loopback server that answers /health as a gateway would and records every header."""

    def __init__(self, boot_id: str) -> None:
        import http.server
        import threading

        seen = self.authorizations = []  # type: list[str | None]
        body = json.dumps({"boot_id": boot_id}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _record(tmp_path: Path, **record: object) -> dict[str, str]:
    env = gateway_env(tmp_path)
    home = Path(env["ROOMKEEPER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "token").write_text("t" * 43)
    (home / "gateway.json").write_text(json.dumps(record))
    return env


@pytest.mark.parametrize("case", ["boot id differs", "pid reused", "pid gone"])
def test_the_cli_sends_no_token_to_what_took_the_port(tmp_path: Path, case: str) -> None:
    """Something else listens where gateway.json says the gateway did: no token is sent."""
    import psutil

    impostor = _Impostor(boot_id="theirs")
    me = psutil.Process()
    record: dict[str, object] = {
        "pid": me.pid,
        "started": me.create_time(),
        "boot_id": "ours",
        "port": impostor.port,
    }
    if case == "pid reused":
        record["started"] = me.create_time() - 100  # same pid, another process's start
        record["boot_id"] = "theirs"
    if case == "pid gone":
        record["pid"], record["boot_id"] = 2**22 + 7, "theirs"
    try:
        done = roomkeeper_cli(_record(tmp_path, **record), "status")
    finally:
        impostor.close()
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert all(a is None for a in impostor.authorizations), impostor.authorizations
    if case == "boot id differs":
        assert "is not that gateway" in done.stderr and "the token was not sent" in done.stderr
    else:
        assert "is not running" in done.stderr


# Another user cannot run our interpreter when it lives under /root: Debian's own one.
OTHERS_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root")
@pytest.mark.skipif(not os.access(OTHERS_PYTHON, os.X_OK), reason=f"needs {OTHERS_PYTHON}")
def test_the_socket_is_0600_and_other_users_are_refused(tmp_path: Path) -> None:
    """With ROOMKEEPER_SOCKET the socket is 0600, and a peer of another uid is cut off even
    where the file lets it connect (SO_PEERCRED)."""
    import httpx

    reachable = Path(tempfile.mkdtemp(prefix="rk-sock-", dir="/tmp"))
    reachable.chmod(0o755)  # pytest's own tmp_path is 0700: other users could not even try
    path = reachable / "gw.sock"
    env = gateway_env(tmp_path, ROOMKEEPER_SOCKET=str(path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "roomkeeper", "gateway"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not path.exists():  # connecting before it exists leaks httpcore's socket
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        transport = httpx.HTTPTransport(uds=str(path))
        with httpx.Client(transport=transport, base_url="http://localhost") as client:
            assert client.get("/health").status_code == 200
        assert mode(path) == 0o600
        path.chmod(0o666)  # as if it were placed where others can reach it
        probe = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.connect(sys.argv[1])\n"
            "print('connected', flush=True)\n"
            "s.settimeout(10)\n"
            "try:\n"
            "    s.sendall(b'GET /health HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n')\n"
            "    print(repr(s.recv(100)))\n"
            "except (BrokenPipeError, ConnectionResetError):\n"  # closed on it: no answer
            "    print(repr(b''))\n"
        )
        nobody = subprocess.run(
            [OTHERS_PYTHON, "-c", probe, str(path)],
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        said = nobody.stdout.split()
        assert said[:1] == ["connected"], nobody.stdout + nobody.stderr  # the file let it in
        assert said[1:] == ["b''"], nobody.stdout + nobody.stderr  # cut off unanswered
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(reachable, ignore_errors=True)


# ------------------------------------------------------- the contract, pinned


def test_an_unknown_query_parameter_is_refused(gw: RunningGateway) -> None:
    """``?stat=uncertain`` (misspelt) is a 422 naming it, not a silent list of everything."""
    answer = gw.client.get("/v1/jobs", params={"stat": "uncertain"})
    assert answer.status_code == 422
    assert answer.json()["reason"] == "invalid_request"
    assert "unknown query parameter 'stat'" in answer.json()["detail"]
    assert gw.client.get("/v1/jobs", params={"state": "waiting"}).status_code == 200
    assert gw.client.get("/v1/jobs", params={"state": "nonsense"}).status_code == 422


def test_a_405_lists_every_method_of_its_path(gw: RunningGateway) -> None:
    """GET and DELETE are two routes at /v1/jobs/{id}: the Allow header names both."""
    answer = gw.client.request("PATCH", "/v1/jobs/abc")
    assert answer.status_code == 405
    allowed = {m.strip() for m in answer.headers["allow"].split(",")}
    assert {"GET", "DELETE"} <= allowed


def test_creating_posts_link_their_id_to_the_resource(gw: RunningGateway) -> None:
    """The document links POST /v1/jobs's id to GET and DELETE /v1/jobs/{job_id}."""
    document = gw.anonymous.get("/openapi.json").json()
    links = document["paths"]["/v1/jobs"]["post"]["responses"]["201"]["links"]
    targets = {link["operationId"] for link in links.values()}
    job_ops = {
        op["operationId"]
        for path, ops in document["paths"].items()
        if path.startswith("/v1/jobs/{job_id}")
        for op in ops.values()
    }
    assert targets == job_ops and len(targets) >= 4
    assert all(v["parameters"] == {"job_id": "$response.body#/id"} for v in links.values())


def test_an_ended_lease_is_a_409_conflict(gw: RunningGateway) -> None:
    """Granting or extending an ended lease is a conflict with its state (409 already_ended)."""
    assert gw.client.post("/v1/leases", json={"id": "gone", "memory_bytes": 0}).status_code == 201
    assert gw.client.delete("/v1/leases/gone").status_code == 200
    again = gw.client.post("/v1/leases", json={"id": "gone", "memory_bytes": 0})
    beat = gw.client.post("/v1/leases/gone/heartbeat", json={})
    assert (again.status_code, again.json()["reason"]) == (409, "already_ended")
    assert (beat.status_code, beat.json()["reason"]) == (409, "already_ended")


def test_what_this_machine_cannot_run_has_its_own_reason(gw: RunningGateway) -> None:
    """Valid by the schema, not runnable here: 422 with a reason a client can act on."""
    cases = {
        "cwd_not_found": {"argv": ["true"], "cwd": "/nonexistent/rk"},
        "command_not_found": {"argv": ["no-such-command-rk"]},
        "never_fits": {"argv": ["true"], "memory_bytes": 2**52},
    }
    for reason, body in cases.items():
        answer = gw.client.post("/v1/jobs", json=body)
        assert (answer.status_code, answer.json()["reason"]) == (422, reason), answer.text

"""The Ray backend against a real Ray cluster on loopback, through a real gateway.

One cluster for the module: a head with no CPUs (no job lands there) and
two worker nodes with distinct ``memory`` resources, ``small`` (300 MB)
and ``big`` (900 MB), each ``ray start`` in its own process group.  A job's
memory estimate chooses its node: above 300 MB only ``big`` can take it.
The last test adds a third node, ``doomed``, and SIGKILLs it mid-job.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.gateways import RunningGateway, running_gateway, wait_until
from tests.pages import PAGE_TIMEOUT_MS
from tests.ray_cluster import LocalCluster, local_cluster

pytestmark = pytest.mark.ray

MB = 1_000_000
SMALL, BIG, DOOMED = 300 * MB, 900 * MB, 1500 * MB


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with local_cluster({"small": SMALL, "big": BIG}) as made:
        yield made


@pytest.fixture(scope="module")
def gateway(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("ray-gateway")
    with running_gateway(
        tmp,
        ROOMKEEPER_BACKEND="ray",
        ROOMKEEPER_RAY_ADDRESS=cluster.address,
        ROOMKEEPER_MAX_RUNNING="16",  # the cluster's CPUs are the bound here, not ours
    ) as gw:
        yield gw


def submit(gw: RunningGateway, argv: list[str], memory: int = 50 * MB, **extra: Any) -> str:
    answer = gw.client.post("/v1/jobs", json={"argv": argv, "memory_bytes": memory, **extra})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def job(gw: RunningGateway, job_id: str) -> dict[str, Any]:
    answer = gw.client.get(f"/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def wait_state(
    gw: RunningGateway, job_id: str, *states: str, timeout: float = 60
) -> dict[str, Any]:
    wait_until(lambda: job(gw, job_id)["state"] in states, f"job {job_id} {states}", timeout)
    return job(gw, job_id)


def output(gw: RunningGateway, job_id: str) -> str:
    return gw.client.get(f"/v1/jobs/{job_id}/output").text


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def pid_in(path: Path, timeout: float = 60) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip() != "", f"{path} written", timeout)
    return int(path.read_text().split()[0])


def test_outputs_and_exit_codes_come_back_and_nodes_are_shown(gateway: RunningGateway) -> None:
    failing = submit(gateway, ["sh", "-c", "echo to-out; echo to-err >&2; exit 3"])
    passing = submit(gateway, ["sh", "-c", "echo fine"], memory=400 * MB)  # big only
    assert wait_state(gateway, failing, "exited")["exit_code"] == 3
    assert wait_state(gateway, passing, "exited")["exit_code"] == 0
    assert output(gateway, failing).splitlines() == ["to-out", "to-err"]
    assert output(gateway, passing) == "fine\n"
    status = gateway.client.get("/v1/status").json()
    assert status["backend"] == "ray"
    by_memory = {n["memory_bytes"]: n for n in status["nodes"] if n["alive"]}
    assert {SMALL, BIG} <= set(by_memory)
    assert by_memory[BIG]["headroom_bytes"] is not None  # its guard judged the 400 MB job
    assert gateway.anonymous.get("/v1/feed").json()["nodes"] != []
    metrics = gateway.anonymous.get("/metrics").text
    memory_line = f'roomkeeper_node_memory_bytes{{node="{by_memory[BIG]["node_id"]}"}} '
    values = [float(m.split()[-1]) for m in metrics.splitlines() if m.startswith(memory_line)]
    assert values == [BIG]
    assert "roomkeeper_node_jobs{" in metrics


NODE_ROWS = """(count) => document.querySelectorAll('#nodes tbody tr[data-node]').length >= count"""


def test_the_health_page_shows_each_node(browser: Any, gateway: RunningGateway) -> None:
    """The "Ray nodes" card: one row per node, alive, its memory and its guard's headroom."""
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(f"{gateway.url}/")
    page.wait_for_function(NODE_ROWS, arg=3, timeout=PAGE_TIMEOUT_MS)  # head, small, big
    assert page.locator("#nodes-card").is_visible()
    rows = [r.split("\t") for r in page.locator("#nodes tbody tr").all_inner_texts()]
    by_memory = {cells[4]: cells for cells in rows}
    assert set(by_memory) >= {"0.30 GB", "0.90 GB"}
    assert by_memory["0.90 GB"][2] == "yes"
    assert by_memory["0.90 GB"][6].endswith(" GB")  # big's guard judged a job before
    assert errors == []


def test_a_job_larger_than_any_node_waits_with_a_clear_reason(gateway: RunningGateway) -> None:
    huge = submit(gateway, ["true"], memory=2000 * MB)
    wait_until(
        lambda: "no node of the Ray cluster" in str(gateway.client.get("/v1/status").json()),
        "the status to say no node is large enough",
        30,
    )
    now = job(gateway, huge)
    assert (now["state"], now["reason"]) == ("waiting", "memory")
    refusals = gateway.anonymous.get("/v1/feed").json()["refusals"]
    assert any("no node of the Ray cluster offers 2.00 GB" in r["summary"] for r in refusals), (
        refusals,
        gateway.client.get("/v1/status").json(),
    )
    # It waits aside: jobs behind it, of its owner and of another, run meanwhile.
    mine = submit(gateway, ["sh", "-c", "echo mine"])
    theirs = submit(gateway, ["sh", "-c", "echo theirs"], owner="someone-else")
    assert wait_state(gateway, mine, "exited")["exit_code"] == 0
    assert wait_state(gateway, theirs, "exited")["exit_code"] == 0
    assert (job(gateway, huge)["state"], job(gateway, huge)["reason"]) == ("waiting", "memory")
    assert gateway.client.post(f"/v1/jobs/{huge}/cancel").status_code == 200
    assert wait_state(gateway, huge, "cancelled")["state"] == "cancelled"


def test_a_learned_size_is_what_ray_is_asked_for(gateway: RunningGateway) -> None:
    """A job with no size of its own runs with its kind's learned size: the 1 GiB default
    fits no node here, so it could only start if Ray was asked for the learned size."""
    first = submit(gateway, ["sh", "-c", "echo one"], kind="ray-learned")
    assert wait_state(gateway, first, "exited")["exit_code"] == 0
    answer = gateway.client.post(
        "/v1/jobs", json={"argv": ["sh", "-c", "echo two"], "kind": "ray-learned"}
    )
    assert answer.status_code == 201, answer.text
    second = str(answer.json()["id"])
    done = wait_state(gateway, second, "exited")
    assert done["estimate_source"] == "learned"
    assert done["estimate_bytes"] < SMALL
    assert output(gateway, second) == "two\n"


def test_cancel_stops_the_remote_tree(gateway: RunningGateway, tmp_path: Path) -> None:
    script = f"sleep 300 & echo $! > {tmp_path}/child; echo $$ > {tmp_path}/leader; wait"
    running = submit(gateway, ["sh", "-c", script])
    wait_state(gateway, running, "running")
    leader, child = pid_in(tmp_path / "leader"), pid_in(tmp_path / "child")
    assert not gone(leader) and not gone(child)
    assert gateway.client.post(f"/v1/jobs/{running}/cancel").status_code == 200
    stopped = wait_state(gateway, running, "stopped")
    assert "cancelled" in (stopped["error"] or "")
    wait_until(lambda: gone(leader) and gone(child), "the remote tree to be gone", 30)


def test_a_deadline_stops_the_remote_tree(gateway: RunningGateway, tmp_path: Path) -> None:
    """Its deadline passes while it runs on a node: timed out, and its tree there is gone."""
    script = f"echo $$ > {tmp_path}/leader; exec sleep 300"
    # 15 s: a Ray task may take seconds to start beside other load, and must run before it.
    late = submit(gateway, ["sh", "-c", script], timeout_s=15)
    leader = pid_in(tmp_path / "leader")
    ended = wait_state(gateway, late, "timed_out", timeout=60)
    assert ended["exit_code"] is None
    wait_until(lambda: gone(leader), "the timed-out tree to be gone", 30)


# 3200 writes of 64 KiB, each its own numbered line: 200 MiB of output.
BLOCKS, BLOCK = 3200, 64 * 1024
CHATTY = (
    "import os\n"
    f"for i in range({BLOCKS}):\n"
    f"    os.write(1, b'%08d ' % i + b'x' * {BLOCK - 10} + b'\\n')\n"
)


def chatty_output() -> tuple[int, str, bytes]:
    """The size, sha256 and last line of what CHATTY writes."""
    digest = hashlib.sha256()
    for i in range(BLOCKS):
        digest.update(b"%08d " % i + b"x" * (BLOCK - 10) + b"\n")
    last = b"%08d " % (BLOCKS - 1) + b"x" * (BLOCK - 10) + b"\n"
    return BLOCKS * BLOCK, digest.hexdigest(), last


class PeakRss:
    """Samples a process's resident memory on a thread of its own; the highest seen."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self._process, self._every_s = psutil.Process(pid), every_s
        self.first = self.peak = self._process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(self._every_s):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> int:
        """Stop sampling; how far the peak rose above the first reading."""
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)
        return self.peak - self.first


def test_a_chatty_jobs_output_streams_through_a_gateway_that_stays_small(
    gateway: RunningGateway,
) -> None:
    """200 MiB of output come whole, in order, into the job's log while the gateway's own
    resident memory grows by less than 40 MB (it was read whole on the node and sent in one
    piece, so the gateway held it all)."""
    warm = submit(gateway, [sys.executable, "-c", "import os; os.write(1, b'w' * 4_000_000)"])
    assert wait_state(gateway, warm, "exited", timeout=300)["exit_code"] == 0  # Ray's first use
    size, digest, last = chatty_output()
    rss = PeakRss(gateway.proc.pid)
    try:
        chatty = submit(gateway, [sys.executable, "-c", CHATTY])
        assert wait_state(gateway, chatty, "exited", timeout=600)["exit_code"] == 0
        received, tail, hashed = 0, b"", hashlib.sha256()
        with gateway.client.stream("GET", f"/v1/jobs/{chatty}/output", timeout=600) as answer:
            assert answer.status_code == 200
            for piece in answer.iter_bytes():
                received += len(piece)
                hashed.update(piece)
                tail = (tail + piece)[-BLOCK:]
    finally:
        grew = rss.stop()
    print(f"the gateway's RSS grew by {grew / MB:.1f} MB (from {rss.first / MB:.1f} MB)")
    assert (received, hashed.hexdigest(), tail) == (size, digest, last)
    assert grew < 40 * MB, f"the gateway's RSS grew by {grew / MB:.1f} MB"


def test_output_shows_while_the_remote_job_runs(gateway: RunningGateway, tmp_path: Path) -> None:
    """GET output, and a followed stream, show what it wrote before it ended."""
    release = tmp_path / "release"
    script = f"echo first; while [ ! -e {release} ]; do sleep 0.05; done; echo second"
    running = submit(gateway, ["sh", "-c", script])
    wait_until(lambda: output(gateway, running) == "first\n", "its first line, while it runs", 120)
    assert job(gateway, running)["state"] == "running"
    url = f"/v1/jobs/{running}/output?follow=true"
    with gateway.client.stream("GET", url, timeout=120) as followed:
        pieces = followed.iter_bytes()
        seen = next(pieces)
        assert seen == b"first\n"
        release.touch()
        seen += b"".join(pieces)  # until it ends
    assert seen == b"first\nsecond\n"
    assert wait_state(gateway, running, "exited")["exit_code"] == 0


def test_a_cancelled_remote_job_keeps_its_output(gateway: RunningGateway, tmp_path: Path) -> None:
    """What it wrote before the cancel, and while its tree was being stopped (its SIGTERM
    trap), is in its output once it is stopped."""
    script = (
        "trap 'echo stopping; exit 0' TERM; echo started; "
        f"echo $$ > {tmp_path}/leader; while :; do sleep 0.05; done"
    )
    running = submit(gateway, ["sh", "-c", script])
    leader = pid_in(tmp_path / "leader")
    assert gateway.client.post(f"/v1/jobs/{running}/cancel").status_code == 200
    stopped = wait_state(gateway, running, "stopped", timeout=120)
    assert "cancelled" in (stopped["error"] or "")
    kept = output(gateway, running)  # the shell may say between them that its sleep died
    assert kept.startswith("started\n") and kept.endswith("stopping\n"), kept
    wait_until(lambda: gone(leader), "the remote tree to be gone", 30)


def test_a_remote_jobs_logs_are_private(gateway: RunningGateway) -> None:
    """Its log on the node (the job's own stdout) and its log on the gateway are 0600."""
    mode = "import os, stat; print(oct(stat.S_IMODE(os.fstat(1).st_mode)))"
    private = submit(gateway, [sys.executable, "-c", mode])
    assert wait_state(gateway, private, "exited")["exit_code"] == 0
    assert output(gateway, private) == "0o600\n"  # on the node
    log = gateway.home / "logs" / f"{private}.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_node_guard_refusal_is_waited_out(
    cluster: LocalCluster, gateway: RunningGateway, tmp_path: Path
) -> None:
    """``big`` refuses (a 1 MiB stated limit: its guard refuses the job, and its pressure
    monitor, which reads the node's settings afresh too, holds launches); lifted, the same
    job runs."""
    cluster.set_node_settings("big", "ROOMKEEPER_MEMORY_LIMIT_MB=1\n")
    try:
        waiting = submit(gateway, ["sh", "-c", "echo ran"], memory=500 * MB)  # big only
        wait_until(
            lambda: any(
                (r["summary"].startswith("node ") and r["reason"] == "memory")
                or (r["reason"] == "pressure" and "pressure monitor" in r["summary"])
                for r in gateway.anonymous.get("/v1/feed").json()["refusals"]
            ),
            "a refusal from big's guard or a hold of its pressure monitor",
            60,
        )
        now = job(gateway, waiting)
        assert now["state"] in ("waiting", "running")  # refused, so back in line, not failed
    finally:
        cluster.set_node_settings("big", "")
    done = wait_state(gateway, waiting, "exited")
    assert done["exit_code"] == 0
    assert output(gateway, waiting) == "ran\n"


def test_a_cancel_the_node_is_slow_to_carry_out_holds_up_no_request(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    """The job ignores SIGTERM, so its node takes the whole stop grace (5 s) to end it; the
    API answers at once meanwhile (reaping once waited in Ray under the scheduler's lock)."""
    script = f"trap '' TERM; echo $$ > {tmp_path}/leader; while :; do sleep 0.1; done"
    stubborn = submit(gateway, ["sh", "-c", script])
    wait_state(gateway, stubborn, "running")
    leader = pid_in(tmp_path / "leader")
    assert gateway.client.post(f"/v1/jobs/{stubborn}/cancel").status_code == 200
    slowest = 0.0
    deadline = time.monotonic() + 90  # 5 s of grace; a lost cancel is forced after 15 s
    while job(gateway, stubborn)["state"] == "running":
        assert time.monotonic() < deadline, "the cancelled job never ended"
        for call in (
            lambda: gateway.client.get("/v1/jobs"),
            lambda: gateway.client.get(f"/v1/jobs/{stubborn}"),
            lambda: gateway.anonymous.get("/health"),
        ):
            started = time.monotonic()
            assert call().status_code == 200
            slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.1)
    # The cancel's grace is 5 s: a request that waited for it would take that long; a busy
    # 2-core machine with a Ray cluster beside the test delays any request by a second or so.
    assert slowest < 3.0, f"a request took {slowest:.2f} s while the cancel was carried out"
    assert wait_state(gateway, stubborn, "stopped")["state"] == "stopped"
    wait_until(lambda: gone(leader), "the stubborn tree to be gone", 30)


def test_a_freed_cpu_is_used_at_once_beside_a_job_no_node_could_hold(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    """Every CPU of the cluster (2 nodes of 2) is taken: the next job waits for a CPU, a
    job larger than any node waits aside, and the next job starts once a slot frees: within
    10 s (a job stuck behind the one no node can hold would never start; a Ray task's start
    took 3.3 s beside a CPU hog, so the bound is one no busy machine misses)."""
    holders = []
    for n in range(4):
        script = f"while [ ! -e {tmp_path}/end{n} ]; do sleep 0.05; done"
        holders.append(submit(gateway, ["sh", "-c", script], memory=20 * MB, owner=f"h{n}"))
    for holder in holders:
        try:
            wait_state(gateway, holder, "running")
        except AssertionError as err:
            views = [job(gateway, h) for h in holders]
            status = gateway.client.get("/v1/status").json()
            raise AssertionError(f"{err}: {views} {status}") from err
    huge = submit(gateway, ["true"], memory=4000 * MB)
    started_file = tmp_path / "started"
    following = submit(gateway, ["sh", "-c", f"date +%s.%N > {started_file}"], 20 * MB, owner="n")
    wait_until(lambda: job(gateway, following)["reason"] == "cpu", "the next job to wait for cpu")
    assert job(gateway, huge)["reason"] == "memory"
    freed_at = time.time()
    (tmp_path / "end0").touch()
    assert wait_state(gateway, following, "exited")["exit_code"] == 0
    started = float(started_file.read_text())
    assert started - freed_at < 10.0, f"started {started - freed_at:.2f} s after the slot freed"
    assert job(gateway, huge)["state"] == "waiting"
    for n in range(1, 4):
        (tmp_path / f"end{n}").touch()
    for holder in holders:
        assert wait_state(gateway, holder, "exited")["exit_code"] == 0
    assert gateway.client.post(f"/v1/jobs/{huge}/cancel").status_code == 200


def test_a_lost_node_leaves_the_job_uncertain(
    cluster: LocalCluster, gateway: RunningGateway, tmp_path: Path
) -> None:
    doomed = cluster.add_node("doomed", DOOMED)
    lost = submit(gateway, ["sh", "-c", f"echo $$ > {tmp_path}/leader; exec sleep 300"], 1200 * MB)
    wait_state(gateway, lost, "running")
    leader = pid_in(tmp_path / "leader")
    doomed.kill()
    ended = wait_state(gateway, lost, "uncertain", timeout=90)
    assert "lost" in (ended["error"] or "")
    wait_until(lambda: gone(leader), "the lost node's tree to be gone (its lifeline)", 30)
    time.sleep(1)  # one more round: it is never run again
    assert job(gateway, lost)["state"] == "uncertain"

    # The task's failure can reach us before Ray's health checks mark the node dead.
    def doomed_shown_lost() -> bool:
        nodes = gateway.client.get("/v1/status").json()["nodes"]
        return [n["alive"] for n in nodes if n["memory_bytes"] == DOOMED] == [False]

    wait_until(doomed_shown_lost, "the lost node to show as not alive in /v1/status", 60)


def _gcs_server(cluster: LocalCluster) -> psutil.Process:
    """The head's GCS process: a member of the head's process group, which we started."""
    head = cluster.nodes["head"].proc.pid
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == head and "gcs_server" in " ".join(proc.info["cmdline"]):
                return proc
    raise AssertionError("the head's gcs_server was not found")


def test_a_frozen_head_leaves_the_gateway_answering_and_jobs_waiting(
    cluster: LocalCluster, gateway: RunningGateway
) -> None:
    """The head's GCS stopped (SIGSTOP): /health, GET and POST /v1/jobs answer at once (within
    4 s on a busy machine, where one waiting on the head would take its 5 s connect timeout),
    needs-you says the cluster is unreachable, a new job waits with that reason; once the
    head is back (SIGCONT) every job submitted meanwhile runs."""
    gcs = _gcs_server(cluster)
    posted: list[str] = []
    gcs.suspend()
    try:
        slowest = 0.0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            body = {
                "argv": ["sh", "-c", "echo back"],
                "owner": f"f{len(posted)}",
                "memory_bytes": MB,
            }
            for call in (
                lambda: gateway.anonymous.get("/health"),
                lambda: gateway.client.get("/v1/jobs"),
                lambda body=body: gateway.client.post("/v1/jobs", json=body),
            ):
                started = time.monotonic()
                answer = call()
                slowest = max(slowest, time.monotonic() - started)
                assert answer.status_code in (200, 201), answer.text
                if answer.status_code == 201:
                    posted.append(str(answer.json()["id"]))
            time.sleep(0.5)
        # A request that waited on the frozen head would take its 5 s connect timeout at least.
        assert slowest < 4.0, f"a request took {slowest:.2f} s while the head was frozen"
        said = gateway.client.get("/v1/needs-you").json()
        assert said["headline"] == "cluster unreachable", said
        page = gateway.anonymous.get("/v1/feed").json()["guard"]  # the Health page's headline
        assert (page["headline"], page["admit"]) == ("cluster unreachable", False), page
        late = submit(gateway, ["sh", "-c", "echo back"], memory=MB, owner="late")
        posted.append(late)
        wait_until(
            lambda: job(gateway, late)["reason"] == "cluster_unreachable",
            "a job submitted while the head is frozen to wait for the cluster",
        )
        assert job(gateway, late)["state"] == "waiting"
    finally:
        gcs.resume()
    for each in posted:
        assert wait_state(gateway, each, "exited", timeout=120)["exit_code"] == 0
    assert output(gateway, late) == "back\n"
    wait_until(
        lambda: gateway.client.get("/v1/needs-you").json()["headline"] != "cluster unreachable",
        "needs-you to stop saying the cluster is unreachable",
        60,
    )


def test_the_port_finder_never_hands_out_a_port_twice() -> None:
    """A port handed to one Ray component and then to another stops ``ray start``."""
    from tests.ray_cluster import free_ports

    ports = [port for _ in range(50) for port in free_ports(14)]
    assert len(set(ports)) == len(ports)

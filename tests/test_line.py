"""Waiting never holds the API's line, and every save a request waits for has a deadline.

Real gateway processes: four lease grants waiting for room beside a cancel, a
status and a shutdown; and a journal whose writer hangs as on a hung disk.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests.gateways import RunningGateway, running_gateway, wait_until

pytestmark = pytest.mark.kernel

PROMPT_S = 5.0  # an answer that waits behind nothing (busy machine); the waits last 30 s
TEN_PB = 10**15  # more memory than any machine has: a grant of it waits for its wait_s


def timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    """The answer of ``call`` and how long it took."""
    start = time.monotonic()
    answer = call()
    return answer, time.monotonic() - start


def running_job(gw: RunningGateway, argv: list[str]) -> str:
    """Submit ``argv`` and wait until it runs; its id."""
    job_id = str(gw.client.post("/v1/jobs", json={"argv": argv}).json()["id"])
    wait_until(
        lambda: gw.client.get(f"/v1/jobs/{job_id}").json()["state"] == "running",
        "the job running",
    )
    return job_id


def test_grants_waiting_for_room_leave_the_line_to_a_cancel_a_status_and_a_shutdown(
    tmp_path: Path,
) -> None:
    """Four grants wait 30 s for room (as many as the line has places): a cancel, a status
    and a shutdown each answer at once, and the grants are answered 503 at the shutdown."""
    with running_gateway(tmp_path) as gw:
        job_id = running_job(gw, ["sleep", "60"])
        answers: list[httpx.Response] = []

        def wait_for_room(size: int) -> None:
            with httpx.Client(base_url=gw.url, headers=gw.client.headers, timeout=60) as own:
                answers.append(own.post("/v1/leases", json={"memory_bytes": size, "wait_s": 30}))

        sizes = [TEN_PB * (n + 1) for n in range(4)]  # each grant's refusals tell it apart
        waiting = [threading.Thread(target=wait_for_room, args=(size,)) for size in sizes]
        for thread in waiting:
            thread.start()

        def refused_grants() -> int:
            refusals = gw.anonymous.get("/v1/feed").json()["refusals"]
            return len({m for r in refusals for m in re.findall(r"job ([\d.]+)", r["summary"])})

        # Each has tried, been refused and holds its place while it waits for its next try.
        wait_until(lambda: refused_grants() == 4, "the four grants refused once")
        took: dict[str, float] = {}
        cancel, took["cancel"] = timed(lambda: gw.client.post(f"/v1/jobs/{job_id}/cancel"))
        status, took["status"] = timed(lambda: gw.client.get("/v1/status"))
        assert max(took.values()) < PROMPT_S, took
        assert all(thread.is_alive() for thread in waiting)  # still waiting for room
        stop, took["shutdown"] = timed(lambda: gw.client.post("/v1/shutdown"))
        assert took["shutdown"] < PROMPT_S, took
        assert (cancel.status_code, status.status_code, stop.status_code) == (200, 200, 200)
        for thread in waiting:
            thread.join(timeout=15)
        assert not any(thread.is_alive() for thread in waiting)
        assert [(a.status_code, a.json()["reason"]) for a in answers] == [
            (503, "shutting_down")
        ] * 4
        assert gw.proc.wait(timeout=15) == 0


# The real gateway, with two routes that hang its journal's writer as a hung disk would (a
# write that does not return) and let it go; a request waits 1 s for a save (10 s in use).
STALLING_GATEWAY = """
import sys, threading
import roomkeeper.api.serve as serve
import roomkeeper.gateway.persistence as persistence
from roomkeeper.api import app as api

persistence.SAVE_DEADLINE_S = 1.0
stall = threading.Event()

def create_app(gateway, **kw):
    app = api.create_app(gateway, **kw)

    @app.post("/test-stall")
    async def stall_the_journal() -> dict:
        stall.clear()
        gateway.journal.submit(lambda conn: stall.wait())
        return {}

    @app.post("/test-unstall")
    async def unstall_the_journal() -> dict:
        stall.set()
        return {}

    return app

serve.create_app = create_app
serve.run_gateway(int(sys.argv[1]), None)
"""


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def command(process: psutil.Process) -> list[str]:
    """The process's command line; none once it has gone (a child may end while listed)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def journal_rows(home: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(home / "journal.db")
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


def test_a_hung_journal_answers_503_in_time_and_saves_everything_once_it_answers(
    tmp_path: Path,
) -> None:
    """Its writer hung: a grant, a release, a submit and a cancel each answer 503
    ``not_saved_in_time`` within the deadline (the cancel's tree stopped all the same,
    the grant and the job holding nothing), /health answers, needs-you says so; once the
    writer answers, the release and the cancel are saved, the grant's and the job's late
    rows are taken back."""
    with running_gateway(
        tmp_path,
        code=STALLING_GATEWAY,
        ROOMKEEPER_MAX_RUNNING="1",
        ROOMKEEPER_MAX_RUNNING_PER_OWNER="1",
    ) as gw:
        job_id = running_job(gw, ["sleep", "60"])
        sleeper = [
            p
            for p in psutil.Process(gw.proc.pid).children(recursive=True)
            if command(p)[:2] == ["sleep", "60"]
        ]
        assert gw.client.post("/v1/leases", json={"id": "held", "memory_bytes": 10**6}).is_success
        gw.client.post("/test-stall")
        with httpx.Client(base_url=gw.url, headers=gw.client.headers, timeout=15) as client:
            answers = {
                "grant": timed(
                    lambda: client.post("/v1/leases", json={"id": "new", "memory_bytes": 10**6})
                ),
                "release": timed(lambda: client.delete("/v1/leases/held")),
                "submit": timed(lambda: client.post("/v1/jobs", json={"argv": ["true"]})),
                "cancel": timed(lambda: client.post(f"/v1/jobs/{job_id}/cancel")),
            }
            for name, (answer, took) in answers.items():
                assert (answer.status_code, answer.json()["reason"]) == (
                    503,
                    "not_saved_in_time",
                ), (name, answer.text)
                assert took < 8, (name, took)  # its deadline is 1 s
            detail = {name: answer.json()["detail"] for name, (answer, _) in answers.items()}
            assert "did not answer within 1 s" in detail["grant"]
            assert "not granted and holds nothing" in detail["grant"]
            assert "has ended in this run" in detail["release"]
            assert "will not run" in detail["submit"]
            assert "a running tree is stopped" in detail["cancel"]
            assert gw.anonymous.get("/health").status_code == 200
            assert client.get("/v1/needs-you").json()["headline"] == "persistence failed"
            leases = {x["id"]: x["state"] for x in client.get("/v1/leases").json()}
            assert leases == {"held": "released"}
            wait_until(lambda: not any(alive(p) for p in sleeper), "the cancelled tree stopped")
            client.post("/test-unstall")
            wait_until(
                lambda: client.get("/v1/needs-you").json()["headline"] != "persistence failed",
                "every change saved",
            )
            wait_until(
                lambda: (
                    journal_rows(gw.home, "SELECT id, state FROM leases") == [("held", "released")]
                ),
                "the late grant's row taken back",
            )
            wait_until(
                lambda: (
                    journal_rows(gw.home, "SELECT id, state FROM jobs") == [(job_id, "stopped")]
                ),
                "the cancel saved and the late job's row taken back",
            )
            wait_until(
                lambda: (
                    client.post("/v1/leases", json={"id": "new", "memory_bytes": 10**6}).status_code
                    == 201
                ),
                "the id granted afresh",
            )

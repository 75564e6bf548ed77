"""Release hooks survive a crash: at least once, with one key, and an ended lease stays ended.

Real gateway processes, a real SIGKILL in the middle of a hook, and a real loopback
server that records every call with its Idempotency-Key.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.gateways import kill_whole_tree, running_gateway, wait_until
from tests.hook_servers import SlowHooks

pytestmark = pytest.mark.kernel


def lease_row(home: Path, lease_id: str) -> tuple[str, str | None]:
    conn = sqlite3.connect(home / "journal.db")
    try:
        row = conn.execute(
            "SELECT state, hook_outcome FROM leases WHERE id = ?", (lease_id,)
        ).fetchone()
        return str(row[0]), row[1]
    finally:
        conn.close()


def test_a_crash_during_a_lease_hook_never_grants_the_lease_again(
    tmp_path: Path, hooks: SlowHooks
) -> None:
    """DELETE of a lease whose hook takes 2.5 s, SIGKILL as its call arrives: after the
    restart the lease is released (its memory free), and the hook is made again once, with
    the same key."""
    hooks.delay_s = 2.5
    lease = {"id": "turn-1", "memory_bytes": 10**6, "release": {"url": hooks.url("/chat/1")}}
    home = tmp_path / "home"
    with running_gateway(tmp_path) as gw:
        assert gw.client.post("/v1/leases", json=lease).status_code == 201

        def release() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the gateway dies mid-answer
                gw.client.delete("/v1/leases/turn-1", timeout=10)

        releasing = threading.Thread(target=release)
        releasing.start()
        wait_until(lambda: len(hooks.calls) == 1, "the hook's first call")
        # Killed at once, while the hook still answers (2.5 s): a pause here would leave a
        # busy machine less of that margin.  The end is saved (released, its hook due)
        # before the call is made.
        kill_whole_tree(gw)
        releasing.join(timeout=15)
    assert lease_row(home, "turn-1") == ("released", "due")
    hooks.delay_s = 0.0
    with running_gateway(tmp_path) as gw:
        wait_until(lambda: len(hooks.calls) == 2, "the due hook made again")
        wait_until(lambda: lease_row(home, "turn-1")[1] == "ok 204", "its outcome saved")
        assert lease_row(home, "turn-1")[0] == "released"
        assert "turn-1" not in {x["id"] for x in gw.client.get("/v1/leases").json()}
        status = gw.client.get("/v1/status").json()
        assert status["leases"].get("granted", 0) == 0
    assert [c[2] for c in hooks.calls] == ["lease-turn-1", "lease-turn-1"]


def test_a_lease_that_expired_while_the_gateway_was_down_gets_its_hook(
    tmp_path: Path, hooks: SlowHooks
) -> None:
    lease = {
        "id": "turn-2",
        "memory_bytes": 10**6,
        "ttl_s": 1,
        "release": {"url": hooks.url("/chat/2")},
    }
    home = tmp_path / "home"
    with running_gateway(tmp_path) as gw:
        assert gw.client.post("/v1/leases", json=lease).status_code == 201
        kill_whole_tree(gw)
    time.sleep(1.5)  # past its ttl while nothing runs
    with running_gateway(tmp_path):
        wait_until(lambda: len(hooks.calls) == 1, "the expired lease's hook")
        wait_until(lambda: lease_row(home, "turn-2") == ("expired", "ok 204"), "its outcome")
    assert hooks.calls == [("DELETE", "/chat/2", "lease-turn-2")]


def test_job_hooks_survive_a_crash_and_run_once_their_jobs_end(
    tmp_path: Path, hooks: SlowHooks
) -> None:
    """An ended job's hook (made before the crash), a running job's and a waiting job's,
    then SIGKILL: after the restart the running job (its tree stopped, uncertain) gets its
    hook, the waiting one gets its own when it has run, and the ended one's is not repeated."""

    def job(argv: list[str], name: str) -> str:
        body = {"argv": argv, "release": {"url": hooks.url(f"/chat/{name}")}}
        answer = gw.client.post("/v1/jobs", json=body)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    with running_gateway(tmp_path, ROOMKEEPER_MAX_RUNNING="1") as gw:
        ended = job(["true"], "ended")
        wait_until(lambda: len(hooks.calls) == 1, "the ended job's hook")
        running = job(["sleep", "60"], "running")
        wait_until(
            lambda: gw.client.get(f"/v1/jobs/{running}").json()["state"] == "running",
            "the second job running",
        )
        waiting = job(["true"], "waiting")
        assert gw.client.get(f"/v1/jobs/{waiting}").json()["state"] == "waiting"
        kill_whole_tree(gw)
    with running_gateway(tmp_path, ROOMKEEPER_MAX_RUNNING="1") as gw:
        wait_until(lambda: len(hooks.calls) == 3, "the owed hooks", timeout=30)
        assert gw.client.get(f"/v1/jobs/{running}").json()["state"] == "uncertain"
        wait_until(
            lambda: gw.client.get(f"/v1/jobs/{waiting}").json()["state"] == "exited",
            "the waiting job resumed and ended",
        )
        time.sleep(0.5)  # nothing more comes
    keys = sorted(c[2] or "" for c in hooks.calls)
    assert keys == sorted(f"job-{i}" for i in (ended, running, waiting))

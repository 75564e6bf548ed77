"""A lease change that failed to save is saved again, newest state last, until the journal
takes it; leases that expired while the gateway was down get their hooks once it saves.

Real gateways: one whose journal refuses lease rows while a file exists (a failing
write put in), and one started on a real full disk; and a real journal below them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest

from roomkeeper.gateway.lease_records import LeaseRecords
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import LeaseState, LeaseView
from roomkeeper.journal.database import Journal
from tests.gateways import fill_disk, running_gateway, wait_until
from tests.hook_servers import SlowHooks


def lease_row(home: Path, lease_id: str) -> tuple[str, str | None] | None:
    conn = sqlite3.connect(home / "journal.db")
    try:
        row = conn.execute(
            "SELECT state, hook_outcome FROM leases WHERE id = ?", (lease_id,)
        ).fetchone()
        return None if row is None else (str(row[0]), row[1])
    finally:
        conn.close()


def lease(state: LeaseState = LeaseState.GRANTED, **changes: object) -> LeaseView:
    granted = LeaseView("l", LeaseTerms(owner="a", memory_bytes=10**6), state, 1.0, 100.0)
    return replace(granted, **changes)  # type: ignore[arg-type]


def test_an_ended_lease_is_never_saved_granted_again(tmp_path: Path) -> None:
    """An older state's save landing after the lease's end changes nothing: ended stays."""
    journal = Journal(tmp_path / "journal.db")
    try:
        assert journal.record_lease(lease()).result()
        assert journal.record_lease(lease(LeaseState.RELEASED, ended_at=2.0)).result()
        assert journal.record_lease(lease(expires_at=200.0)).result() is False
        seen = journal.lease_seen("l")
        assert seen is not None and seen.state is LeaseState.RELEASED
    finally:
        journal.close()


def test_a_failed_lease_save_is_saved_again_with_its_newest_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat and an end refused by the journal: the lease is unsaved until a retry
    saves its newest state (the end), never the heartbeat after it."""
    journal = Journal(tmp_path / "journal.db")
    refusing = True
    real = journal.record_lease

    def record_lease(view: LeaseView) -> concurrent.futures.Future[bool]:
        if not refusing:
            return real(view)
        refused: concurrent.futures.Future[bool] = concurrent.futures.Future()
        refused.set_exception(sqlite3.OperationalError("database or disk is full"))
        return refused

    try:
        records = LeaseRecords(journal=journal, watch=lambda write: None)
        assert records.save(lease(), again=False).result()
        monkeypatch.setattr(journal, "record_lease", record_lease)
        records.save(lease(expires_at=150.0))
        records.save(lease(LeaseState.RELEASED, ended_at=2.0, hook_outcome="ok 204"))
        assert list(records.unsaved) == ["l"] and records.owed == 1
        assert records.retry() == [] and records.owed == 1  # refused again
        refusing = False
        records.retry()
        wait_until(lambda: not records.unsaved, "the lease saved")
        seen = journal.lease_seen("l")
        assert seen is not None and (seen.state, seen.hook_outcome) == (
            LeaseState.RELEASED,
            "ok 204",
        )
    finally:
        journal.close()


# The real gateway, its journal refusing every lease row while the file named by
# TEST_REFUSE_LEASE_SAVES exists, as a full disk would.
REFUSING_GATEWAY = """
import concurrent.futures, os, sqlite3, sys
import roomkeeper.api.serve as serve
from roomkeeper.journal.leases import LeasesTable

flag = os.environ["TEST_REFUSE_LEASE_SAVES"]
real = LeasesTable.record_lease

def record_lease(self, lease):
    if not os.path.exists(flag):
        return real(self, lease)
    refused = concurrent.futures.Future()
    refused.set_exception(sqlite3.OperationalError("database or disk is full"))
    return refused

LeasesTable.record_lease = record_lease
serve.run_gateway(int(sys.argv[1]), None)
"""


@pytest.mark.kernel
def test_a_release_whose_save_failed_is_saved_later_and_stays_released(
    tmp_path: Path, hooks: SlowHooks
) -> None:
    """A release the journal refuses: 507 (its hook made, its memory given back), then saved
    once the journal takes it; after a restart the lease is not granted back and its hook
    is not made again."""
    home, flag = tmp_path / "home", tmp_path / "refuse"
    body = {"id": "turn", "memory_bytes": 10**6, "release": {"url": hooks.url("/chat/turn")}}
    with running_gateway(tmp_path, code=REFUSING_GATEWAY, TEST_REFUSE_LEASE_SAVES=str(flag)) as gw:
        assert gw.client.post("/v1/leases", json=body).status_code == 201
        flag.touch()
        released = gw.client.delete("/v1/leases/turn")
        assert (released.status_code, released.json()["reason"]) == (507, "not_saved")
        assert "has ended in this run" in released.json()["detail"]
        assert hooks.paths == ["/chat/turn"]
        assert gw.client.get("/v1/status").json()["leases"].get("granted", 0) == 0
        assert gw.client.get("/v1/needs-you").json()["headline"] == "persistence failed"
        assert lease_row(home, "turn") == ("granted", None)
        flag.unlink()
        wait_until(lambda: lease_row(home, "turn") == ("released", "ok 204"), "the end saved")
        wait_until(
            lambda: gw.client.get("/v1/needs-you").json()["headline"] != "persistence failed",
            "nothing owed",
        )
        again = gw.client.delete("/v1/leases/turn")  # a retried release: saved now
        assert again.status_code == 200 and again.json()["state"] == "released"
    with running_gateway(tmp_path) as gw:
        assert gw.client.get("/v1/status").json()["leases"].get("granted", 0) == 0
        assert "turn" not in {x["id"] for x in gw.client.get("/v1/leases").json()}
        time.sleep(1.0)  # owed hooks are made at once: none is
    assert hooks.paths == ["/chat/turn"]


@pytest.mark.kernel
def test_a_lease_that_expired_while_down_on_a_full_disk_gets_its_hook_once_space_is_back(
    tmp_path: Path, tiny_disk: Path, hooks: SlowHooks
) -> None:
    """Past its ttl while nothing ran, and the disk full at start: its expiry cannot be
    saved, so no hook yet; once space is back it is saved expired and its hook is made,
    once, in the same run, and never again after a restart."""
    home = tiny_disk / "home"
    body = {
        "id": "turn",
        "memory_bytes": 10**6,
        "ttl_s": 8,
        "release": {"url": hooks.url("/chat/turn")},
    }
    with running_gateway(tmp_path / "first", ROOMKEEPER_HOME=str(home)) as gw:
        granted = gw.client.post("/v1/leases", json=body)
        assert granted.status_code == 201
        expires_at = granted.json()["expires_at"]
    assert hooks.paths == []  # stopped within its ttl: the lease was still granted
    filler = fill_disk(tiny_disk)
    time.sleep(max(0.0, expires_at + 0.5 - time.time()))
    with running_gateway(tmp_path / "second", ROOMKEEPER_HOME=str(home)) as gw:
        assert gw.client.get("/v1/needs-you").json()["headline"] == "persistence failed"
        assert gw.client.get("/v1/status").json()["leases"].get("granted", 0) == 0
        time.sleep(1.0)
        assert hooks.paths == []  # its expiry is not saved: its hook waits for that
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()
        wait_until(lambda: hooks.paths == ["/chat/turn"], "the expired lease's hook")
        wait_until(lambda: lease_row(home, "turn") == ("expired", "ok 204"), "its outcome saved")
        assert gw.proc.poll() is None  # the same run made it
    with running_gateway(tmp_path / "third", ROOMKEEPER_HOME=str(home)):
        time.sleep(1.0)  # owed hooks are made at once: none is
    assert hooks.paths == ["/chat/turn"]

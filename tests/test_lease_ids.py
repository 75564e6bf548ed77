"""A lease id is granted once, ever: the journal, not memory, knows which ids were seen."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from roomkeeper.errors import AlreadyEndedError
from roomkeeper.gateway.leases import DurableLeases
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import Leases, LeaseState, LeaseView
from roomkeeper.journal.database import Journal
from roomkeeper.loopback.hook_calls import HookRunner
from roomkeeper.loopback.hooks import ReleaseHook
from tests.fakes import fixture_guard
from tests.gateways import running_gateway

MB = 10**6
GB = 10**9


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def test_an_ended_lease_id_is_refused_after_a_restart_and_its_row_kept(tmp_path: Path) -> None:
    """Released, then the gateway restarts: the same id is a 409, and the old row keeps its
    owner, size and hook (a new grant never updates it)."""
    first = {
        "id": "turn-7",
        "owner": "alice",
        "memory_bytes": 5 * MB,
        "release": {"url": "http://127.0.0.1:9/chat/alice"},
    }
    with running_gateway(tmp_path) as gw:
        assert gw.client.post("/v1/leases", json=first).status_code == 201
        gw.client.delete("/v1/leases/turn-7")
        home = gw.home
    with running_gateway(tmp_path) as gw:
        again = gw.client.post(
            "/v1/leases", json={"id": "turn-7", "owner": "bob", "memory_bytes": 7 * MB}
        )
        assert (again.status_code, again.json()["reason"]) == (409, "already_ended"), again.text
        assert "granted once" in again.json()["detail"]
        assert gw.client.post("/v1/leases/turn-7/heartbeat", json={}).status_code in (404, 409)
    (row,) = rows(home / "journal.db", "SELECT owner, memory_bytes, release, state FROM leases")
    assert row[:2] == ("alice", 5 * MB) and "chat/alice" in str(row[2]), row
    assert row[3] == "released"


def durable(tmp_path: Path, journal: Journal, leases: Leases) -> DurableLeases:
    guard = leases._guard  # the guard the leases reserve with
    return DurableLeases(
        leases=leases,
        guard=guard,
        journal=journal,
        refusals=deque(),
        closing=lambda: False,
        watch=lambda write: None,
        hooks=HookRunner(run=lambda hook: "ok 200"),
    )


def test_an_id_forgotten_by_memory_is_still_refused(tmp_path: Path) -> None:
    """Past the window of ended leases memory keeps, the journal still refuses the id."""
    guard, _ = fixture_guard(tmp_path / "g", used=1 * GB)
    journal = Journal(tmp_path / "j.db", synchronous="OFF")
    try:
        leases = durable(tmp_path, journal, Leases(guard, keep_ended=1))
        terms = LeaseTerms(owner="o", memory_bytes=10 * MB, ttl_s=60.0)

        async def story() -> None:
            for lease_id in ("a", "b", "c"):
                granted, _, created = await leases.grant(lease_id, terms, wait_s=0)
                assert granted is not None and created
                await leases.end(lease_id)
            assert not leases.leases.known("a")  # forgotten by memory
            with pytest.raises(AlreadyEndedError, match="granted once"):
                await leases.grant("a", terms, wait_s=0)

        asyncio.run(story())
        assert guard.statistics().young == 0  # a refused id reserves nothing
    finally:
        journal.close()


def test_a_new_grant_never_updates_an_old_row_and_beats_add_no_events(tmp_path: Path) -> None:
    """The journal writes a row for a grant only where none has its id; heartbeats rewrite the
    row but append no event: a lease's events are its grant and its end."""
    journal = Journal(tmp_path / "j.db", synchronous="OFF")
    try:
        now = time.time()
        hook = ReleaseHook("DELETE", "http://127.0.0.1:9/chat/1")
        old = LeaseView(
            "x",
            LeaseTerms(owner="o1", memory_bytes=MB, ttl_s=60.0, release=hook),
            LeaseState.GRANTED,
            now,
            now + 60,
        )
        assert journal.record_lease(old).result() is True
        for n in range(5):
            assert journal.record_lease(replace(old, expires_at=now + 61 + n)).result() is True
        ended = replace(old, state=LeaseState.RELEASED, ended_at=now + 70)
        assert journal.record_lease(ended).result() is True
        new = LeaseView(
            "x",
            LeaseTerms(owner="o2", memory_bytes=9 * MB, ttl_s=60.0),
            LeaseState.GRANTED,
            now + 80,
            now + 140,
        )
        assert journal.record_lease(new).result() is False
        kept = journal.lease_seen("x")
    finally:
        journal.close()
    assert kept is not None and kept.terms == old.terms and kept.state is LeaseState.RELEASED
    events = rows(tmp_path / "j.db", "SELECT state FROM lease_events ORDER BY rowid")
    assert [e[0] for e in events] == ["granted", "released"]

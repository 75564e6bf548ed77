"""A lease's fields agree everywhere they appear: the record, the API's models, the
journal's columns; a field added in one place and not the others fails here."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import time
from pathlib import Path
from typing import Any

from roomkeeper.api.models import LeaseIn
from roomkeeper.api.responses import LeaseOut
from roomkeeper.api.views import lease_json
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import LEASE_FIELDS, LeaseState, LeaseView
from roomkeeper.journal.database import Journal
from roomkeeper.journal.leases import lease_of_row
from roomkeeper.loopback.hooks import ReleaseHook
from tests.gateways import RunningGateway

TERMS = {f.name for f in dataclasses.fields(LeaseTerms)}

# The leases table as it first shipped: every column added since must be in ADDED_COLUMNS.
FIRST_LEASES_TABLE = (
    "CREATE TABLE leases (id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL,"
    " memory_bytes INTEGER NOT NULL, disk_bytes INTEGER NOT NULL, ttl_s REAL NOT NULL,"
    " granted_at REAL NOT NULL, expires_at REAL NOT NULL, ended_at REAL, release TEXT,"
    " hook_outcome TEXT)"
)

HOOK = ReleaseHook("POST", "http://127.0.0.1:9/relieve")


def every_term() -> LeaseTerms:
    """Terms with no field left at its default."""
    terms = LeaseTerms(
        owner="dispatcher",
        memory_bytes=123_000_000,
        disk_bytes=7_000_000,
        ttl_s=42.5,
        release=ReleaseHook("DELETE", "http://127.0.0.1:9/release"),
        relieve=HOOK,
    )
    left = [f.name for f in dataclasses.fields(LeaseTerms) if getattr(terms, f.name) == f.default]
    assert left == [], f"give these terms a value other than their default here: {left}"
    return terms


def every_lease_field(now: float) -> LeaseView:
    """A granted lease with no field left at its default (its terms' included)."""
    lease = LeaseView(
        "lease-1",
        every_term(),
        LeaseState.GRANTED,
        granted_at=now - 1,
        expires_at=now + 60,
        ended_at=now - 0.5,
        hook_outcome="ok 204",
        relieve_outcome="asked",
    )
    own = [f.name for f in dataclasses.fields(LeaseView) if getattr(lease, f.name) == f.default]
    assert own == [], f"give these fields a value other than their default here: {own}"
    return lease


def columns(path: Path, table: str) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def test_a_lease_field_has_one_name() -> None:
    """No name is both a lease's own field and one of its terms'."""
    assert len(LEASE_FIELDS) == len(set(LEASE_FIELDS)), LEASE_FIELDS


def test_the_lease_models_and_columns_are_the_records_fields(tmp_path: Path) -> None:
    """LeaseIn is the terms with an id and a wait; LeaseOut, a new journal's columns and an
    older journal's after its migration are the lease's fields, no more, no less."""
    assert set(LeaseIn.model_fields) == TERMS | {"id", "wait_s"}
    assert set(LeaseOut.model_fields) == set(LEASE_FIELDS)
    Journal(tmp_path / "new.db", synchronous="OFF").close()
    assert columns(tmp_path / "new.db", "leases") == set(LEASE_FIELDS)
    with contextlib.closing(sqlite3.connect(tmp_path / "old.db")) as conn:
        conn.execute(FIRST_LEASES_TABLE)
        conn.commit()
    assert columns(tmp_path / "old.db", "leases") < set(LEASE_FIELDS)
    Journal(tmp_path / "old.db", synchronous="OFF").close()
    assert columns(tmp_path / "old.db", "leases") == set(LEASE_FIELDS)


def test_a_lease_comes_back_from_the_journal_and_the_api_whole(tmp_path: Path) -> None:
    """Every field of a lease survives its journal row; every field is in its answer, as
    LeaseOut declares it; a request's terms are the terms asked, field for field."""
    now = time.time()
    lease = every_lease_field(now)
    journal = Journal(tmp_path / "j.db", synchronous="OFF")
    try:
        journal.record_lease(lease).result()
        assert journal.live_leases(now=now) == [lease]
    finally:
        journal.close()
    answer = lease_json(lease)
    assert set(answer) == set(LEASE_FIELDS)
    LeaseOut.model_validate(answer)
    asked = {name: answer[name] for name in TERMS}
    assert LeaseIn.model_validate(asked).terms() == lease.terms


def test_a_lease_asked_over_http_keeps_every_field(module_gw: RunningGateway) -> None:
    """A lease posted with every field it takes: each reaches the answer and the journal."""
    terms = every_term()
    body: dict[str, Any] = {"id": "every-field", "wait_s": 0.5}
    for f in dataclasses.fields(LeaseTerms):
        value = getattr(terms, f.name)
        body[f.name] = value.to_json() if isinstance(value, ReleaseHook) else value
    got = module_gw.client.post("/v1/leases", json=body)
    assert got.status_code == 201, got.text
    assert set(got.json()) == set(LEASE_FIELDS)
    assert {name: got.json()[name] for name in TERMS} == {name: body[name] for name in TERMS}
    with contextlib.closing(sqlite3.connect(module_gw.home / "journal.db")) as conn:
        conn.row_factory = sqlite3.Row
        lease_row = conn.execute("SELECT * FROM leases WHERE id = 'every-field'").fetchone()
    assert lease_of_row(lease_row).terms == terms

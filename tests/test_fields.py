"""A lease's and a job's fields agree everywhere they appear: the record, the API's models,
the journal's columns; a field added in one place and not the others fails here."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from roomkeeper.api.models import JobIn, LeaseIn
from roomkeeper.api.responses import LeaseOut
from roomkeeper.api.views import lease_json
from roomkeeper.gateway.doubt import spec_from_row
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import LEASE_FIELDS, LeaseState, LeaseView
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.jobs.spec import JobSpec, JobState, JobView
from roomkeeper.journal.database import Journal
from roomkeeper.journal.jobs import SPEC_COLUMNS, JobRow, spec_json
from roomkeeper.journal.leases import lease_of_row
from roomkeeper.loopback.hooks import ReleaseHook
from roomkeeper.worktrees.request import WorktreeRequest
from tests.gateways import RunningGateway

TERMS = {f.name for f in dataclasses.fields(LeaseTerms)}
SPEC = {f.name for f in dataclasses.fields(JobSpec)}

# The leases table as it first shipped: every column added since must be in ADDED_COLUMNS.
FIRST_LEASES_TABLE = (
    "CREATE TABLE leases (id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL,"
    " memory_bytes INTEGER NOT NULL, disk_bytes INTEGER NOT NULL, ttl_s REAL NOT NULL,"
    " granted_at REAL NOT NULL, expires_at REAL NOT NULL, ended_at REAL, release TEXT,"
    " hook_outcome TEXT)"
)

# What a job's request and its spec do not share, and why.
ASKED_BESIDE_THE_SPEC = {"release"}  # the gateway keeps a job's hook in its own table
NOT_ASKED_OVER_HTTP = {
    "shell",  # the API runs argv as given, never through a shell (the CLI's run may)
    "inherit_env",  # the API's jobs always inherit the gateway's environment at launch
    "learned_bytes",  # found by the gateway at submission, from the jobs of the same kind
    "shape_bytes",  # found by the gateway at submission, from the jobs of the same shape
}

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
        session="session-7",
        kind="agent-Explore",
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


def every_spec_field() -> JobSpec:
    """A job's spec with no field left at its default."""
    spec = JobSpec(
        argv=["make", "test"],
        owner="ci",
        cwd="/src",
        env={"A": "1"},
        memory_bytes=1_000_000,
        disk_bytes=2_000_000,
        timeout_s=30.0,
        shell=True,
        resumable=True,
        inherit_env=True,
        restartable=True,
        worktree=WorktreeRequest("/repo", "topic"),
        memory_policy=MemoryPolicy.PACK,
        kind="unit-tests",
        learned_bytes=3_000_000,
        jobserver=True,
        shape_bytes=4_000_000,
    )
    left = [f.name for f in dataclasses.fields(JobSpec) if getattr(spec, f.name) == f.default]
    assert left == [], f"give these spec fields a value other than their default here: {left}"
    return spec


def job_view(spec: JobSpec) -> JobView:
    return JobView("j", spec, JobState.WAITING, None, None, 0.0, None, None, "/l", None, None, ())


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


def test_the_job_request_spec_and_columns_agree(tmp_path: Path) -> None:
    """JobIn asks for the spec's fields (the differences named, with why); the journal keeps
    each field of the spec, in its JSON or a column of its own; JobRow is the jobs table."""
    assert set(JobIn.model_fields) - ASKED_BESIDE_THE_SPEC == SPEC - NOT_ASKED_OVER_HTTP
    view = job_view(every_spec_field())
    assert set(json.loads(spec_json(view))) | set(SPEC_COLUMNS) == SPEC
    Journal(tmp_path / "new.db", synchronous="OFF").close()
    table = columns(tmp_path / "new.db", "jobs")
    assert set(SPEC_COLUMNS) <= table
    assert {f.name for f in dataclasses.fields(JobRow)} == table


def test_a_job_spec_comes_back_from_the_journal_whole() -> None:
    """Each field of a spec, saved as the journal saves it, is read back as it was (the
    spec a deferred job runs again with)."""
    spec = every_spec_field()
    saved = json.loads(spec_json(job_view(spec)))
    again = spec_from_row(saved, spec.owner, spec.resumable)
    assert again == spec


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


def test_a_job_asked_over_http_keeps_every_field(module_gw: RunningGateway, tmp_path: Path) -> None:
    """A job posted with every field it takes: each reaches the journal."""
    job = {
        "argv": [sys.executable, "-c", "pass"],
        "owner": "fields",
        "cwd": str(tmp_path),
        "env": {"FIELDS": "1"},
        "memory_bytes": 1_000_000,
        "disk_bytes": 1_000,
        "timeout_s": 60.0,
        "resumable": True,
        "restartable": True,
        "release": {"url": "http://127.0.0.1:9/done"},
        "memory_policy": "pack",
        "kind": "fields",
        "jobserver": True,
    }
    # worktree is the one left out: a job runs in its cwd or its worktree, not both.
    assert set(JobIn.model_fields) - set(job) == {"worktree"}
    posted = module_gw.client.post("/v1/jobs", json=job)
    assert posted.status_code == 201, posted.text
    with contextlib.closing(sqlite3.connect(module_gw.home / "journal.db")) as conn:
        conn.row_factory = sqlite3.Row
        job_id = posted.json()["id"]
        job_row = conn.execute(
            "SELECT owner, resumable, spec FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
        hook_row = conn.execute("SELECT release FROM job_hooks WHERE job_id = ?", (job_id,))
        release = json.loads(hook_row.fetchone()["release"])
    saved = {**json.loads(job_row["spec"]), "owner": job_row["owner"]}
    saved["resumable"] = bool(job_row["resumable"])
    asked = {k: v for k, v in job.items() if k not in ASKED_BESIDE_THE_SPEC}
    assert {k: saved[k] for k in asked} == asked
    assert release == {"method": "DELETE", **job["release"]}

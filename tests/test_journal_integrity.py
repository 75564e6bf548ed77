"""A damaged journal is named, never served silently, and what can be read is saved.

Real SQLite files damaged as disks damage them (a page overwritten, the file
cut short), real gateway and supervisor processes, and the CLI as a person
runs it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import psutil
import pytest

from roomkeeper.gateway.recovery import logs_without_records, recover
from roomkeeper.ipc import EXIT_CANNOT_START
from roomkeeper.journal.database import SCHEMA, Journal
from roomkeeper.journal.history import RecoveryCode
from roomkeeper.journal.integrity import (
    ALL_TABLES,
    JournalDamagedError,
    check_journal,
    is_damage,
    recover_journal,
)
from tests.gateways import gateway_env, roomkeeper_cli
from tests.supervisors import names, serve

PAGE = 4096
ROWS = 3000


def _journal_with_rows(path: Path, rows: int = ROWS) -> None:
    """A closed journal whose history table spans many pages (about 20 rows a page)."""
    Journal(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            "INSERT INTO history (at, event) VALUES (?, ?)",
            ((float(i), "x" * 180) for i in range(rows)),
        )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _leaf_page_of_history(path: Path) -> int:
    """The number of a page in the middle of the history table's leaves."""
    conn = sqlite3.connect(path)
    try:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'history'").fetchone()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    finally:
        conn.close()
    # The table was filled last and alone, so its leaves are the file's last pages.
    assert pages > root[0] + 40
    return int(pages) - 20


def _overwrite_page(path: Path, number: int) -> None:
    with path.open("r+b") as f:
        f.seek((number - 1) * PAGE)
        f.write(b"\xa5" * PAGE)


def test_a_whole_journal_passes_and_a_missing_one_is_nothing_to_check(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    assert check_journal(path) == []
    _journal_with_rows(path, rows=50)
    assert check_journal(path) == []


@pytest.mark.parametrize("damage", ["page", "cut"])
def test_damage_is_found_and_opening_refuses_without_writing(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "journal.db"
    _journal_with_rows(path)
    if damage == "page":
        _overwrite_page(path, _leaf_page_of_history(path))
    else:
        os.truncate(path, 10_000)
    before = path.read_bytes()
    problems = check_journal(path)
    assert problems and all("***" not in p for p in problems)
    with pytest.raises(JournalDamagedError) as raised:
        Journal(path)
    message = str(raised.value)
    assert str(path) in message and "roomkeeper journal recover" in message
    assert path.read_bytes() == before  # nothing was written to the damaged file


def test_recovery_saves_the_rows_around_a_damaged_page_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    _journal_with_rows(path)
    _overwrite_page(path, _leaf_page_of_history(path))
    damaged_bytes = path.read_bytes()
    report = recover_journal(path, SCHEMA)
    saved, lost = report.saved["history"], report.lost["history"]
    assert lost is not None and 0 < lost < 100  # one leaf page: about 20 rows
    assert saved + lost == ROWS
    assert report.damaged.read_bytes() == damaged_bytes  # kept beside it, as it was
    assert report.damaged.parent == path.parent and ".damaged-" in report.damaged.name
    assert check_journal(path) == []
    journal = Journal(path)  # the gateway opens it: every table is there
    try:
        assert journal.job_ids() == set()
    finally:
        journal.close()
    assert (path.stat().st_mode & 0o777) == 0o600


def test_recovery_of_a_file_cut_short_says_nothing_could_be_found(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _journal_with_rows(path)
    os.truncate(path, 10_000)
    report = recover_journal(path, SCHEMA)
    assert report.lost == {ALL_TABLES: None}
    assert check_journal(path) == []


def test_damage_words_tell_a_damaged_file_from_a_full_disk() -> None:
    assert is_damage(sqlite3.DatabaseError("database disk image is malformed"))
    assert is_damage("file is not a database")
    assert not is_damage(sqlite3.OperationalError("database or disk is full"))
    assert not is_damage("disk I/O error")


def _damaged_home(tmp: Path) -> tuple[dict[str, str], Path]:
    env = gateway_env(tmp)
    home = Path(env["ROOMKEEPER_HOME"])
    home.mkdir(mode=0o700, parents=True)
    path = home / "journal.db"
    _journal_with_rows(path)
    _overwrite_page(path, _leaf_page_of_history(path))
    return env, path


def test_the_cli_checks_refuses_to_serve_and_recovers(tmp_path: Path) -> None:
    env, path = _damaged_home(tmp_path)
    checked = roomkeeper_cli(env, "journal", "check")
    assert checked.returncode == 1 and "is damaged" in checked.stdout
    served = roomkeeper_cli(env, "serve", "--port", "0")
    assert served.returncode != 0
    assert "is damaged" in served.stderr and "roomkeeper journal recover" in served.stderr
    assert "Traceback" not in served.stderr
    assert not (path.parent / "gateway.json").exists()  # nothing started
    recovered = roomkeeper_cli(env, "journal", "recover")
    assert recovered.returncode == 0, recovered.stderr
    assert "history: " in recovered.stdout and "lost from history: about" in recovered.stdout
    assert list(path.parent.glob("journal.db.damaged-*"))
    assert roomkeeper_cli(env, "journal", "check").returncode == 0


def test_recovery_is_refused_while_roomkeeper_runs_for_the_home(tmp_path: Path) -> None:
    env, path = _damaged_home(tmp_path)
    me = psutil.Process()
    # This test's own process stands for a running gateway: the record names it.
    (path.parent / "gateway.json").write_text(
        json.dumps({"pid": me.pid, "started": me.create_time()})
    )
    refused = roomkeeper_cli(env, "journal", "recover")
    assert refused.returncode == 1
    assert f"gateway (pid {me.pid}) is using" in refused.stderr
    assert not list(path.parent.glob("journal.db.damaged-*"))


def test_a_gateway_over_a_damaged_journal_says_so_and_exits_for_good(tmp_path: Path) -> None:
    """The bare gateway exits with its cannot-start status and no traceback."""
    env, path = _damaged_home(tmp_path)
    ran = roomkeeper_cli(env, "gateway", "--port", "0")
    assert ran.returncode == EXIT_CANNOT_START
    assert "cannot start" in ran.stderr and str(path) in ran.stderr
    assert "Traceback" not in ran.stderr


def test_the_supervisor_does_not_restart_a_gateway_that_cannot_start(tmp_path: Path) -> None:
    """Damage found at a restart (past serve's own check) stops the supervisor, once."""
    _damaged_home(tmp_path / "run")
    with serve(tmp_path / "run") as served:
        assert served.proc.wait(timeout=60) == EXIT_CANNOT_START
        events = served.events()
    assert names(events).count("launched") == 1
    assert "cannot_start" in names(events)


def test_logs_without_records_are_reported_at_start(tmp_path: Path) -> None:
    """A job log whose record the journal lost (a damaged WAL) is counted and logged."""
    journal = Journal(tmp_path / "journal.db")
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("aaaa", "bbbb"):
        (logs / f"{name}.log").write_text("output\n")
    time.sleep(0.01)
    (logs / "notalog.txt").write_text("")
    try:
        assert [p.name for p in logs_without_records(journal.job_ids(), logs)] == [
            "aaaa.log",
            "bbbb.log",
        ]
        report = recover(journal, crashed=True, logs_dir=logs)
        assert report.lost_records == 2
        codes = [e.code for e in journal.history()]
        assert RecoveryCode.RECORDS_LOST in codes
    finally:
        journal.close()


def test_after_a_damaged_wal_no_job_vanishes_without_a_word(tmp_path: Path) -> None:
    """Twelve jobs, a SIGKILL, 4 KiB of the WAL overwritten: after the restart each job is
    either in the journal or named as a record lost (its log without a row)."""
    from tests.gateways import kill_whole_tree, running_gateway, wait_until

    env = gateway_env(tmp_path)
    home = Path(env["ROOMKEEPER_HOME"])
    with running_gateway(tmp_path) as gw:
        ids = [
            gw.client.post("/v1/jobs", json={"argv": ["echo", str(i)]}).json()["id"]
            for i in range(12)
        ]
        wait_until(
            lambda: all(gw.client.get(f"/v1/jobs/{i}").json()["state"] == "exited" for i in ids),
            "every job's end",
        )
        kill_whole_tree(gw)
    wal = home / "journal.db-wal"
    assert wal.stat().st_size > 3 * PAGE, "the WAL holds the last writes"
    with wal.open("r+b") as f:
        f.seek(wal.stat().st_size // 2)
        f.write(b"\x5a" * PAGE)
    with running_gateway(tmp_path) as gw:
        kept = {j["id"] for j in gw.client.get("/v1/jobs").json()}
    log_text = "".join(p.read_text() for p in tmp_path.glob("gateway-*.log"))
    lost = {i for i in ids if i not in kept}
    assert lost, "the damaged WAL lost no job: this test would show nothing"
    checked = roomkeeper_cli(env, "journal", "check")
    assert checked.returncode == 1, checked.stdout
    assert f"no record of {len(lost)} job(s)" in log_text, log_text[-2000:]
    assert f"{len(lost)} job log(s) have no record" in checked.stdout

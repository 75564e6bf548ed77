"""A full disk: reported, never presented as saved; saved once space is back; no new work
while the start-up recovery it refused is owed."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil
import pytest

from tests.gateways import (
    fill_disk,
    journal_db,
    running_gateway,
    wait_until,
    zombie_or_gone,
)

pytestmark = pytest.mark.kernel


def test_a_full_disk_is_reported_never_presented_as_saved(tmp_path: Path, tiny_disk: Path) -> None:
    """Journal's disk full: 507, a log line, 'persistence failed'; /health still answers."""
    home = tiny_disk / "home"
    with running_gateway(tmp_path, ROOMKEEPER_HOME=str(home)) as gw:
        ok = gw.client.post("/v1/jobs", json={"argv": ["true"]})
        assert ok.status_code == 201
        filler = tiny_disk / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as f:
            while True:
                f.write(b"x" * 65536)
        refused = None
        for i in range(20):  # SQLite may still fit a page or two
            refused = gw.client.post("/v1/jobs", json={"argv": ["sh", "-c", f"echo {i}"]})
            if refused.status_code != 201:
                break
        assert refused is not None and refused.status_code == 507, refused.text
        acknowledged = [r.json()["id"] for r in [ok] if r.status_code == 201]
        with journal_db(home) as conn:  # every 201 is a saved row; the refused job is not running
            saved = {row[0] for row in conn.execute("SELECT id FROM jobs")}
        assert set(acknowledged) <= saved
        assert "not saved" in refused.json()["detail"]
        assert gw.client.get("/v1/needs-you").json()["headline"] == "persistence failed"
        assert gw.anonymous.get("/health").status_code == 200
        assert gw.client.get("/v1/status").status_code == 200
        filler.unlink()
        again = gw.client.post("/v1/jobs", json={"argv": ["true"]})
        assert again.status_code == 201
        # Changes that failed to save meanwhile are saved again within a moment.
        wait_until(
            lambda: gw.client.get("/v1/needs-you").json()["headline"] != "persistence failed",
            "every failed save made again",
        )
    log_text = "".join(p.read_text() for p in tmp_path.glob("gateway-*.log"))
    assert "the journal could not save" in log_text


def test_a_gateway_starts_and_serves_on_a_full_disk_and_saves_once_space_is_back(
    tmp_path: Path, tiny_disk: Path
) -> None:
    """A full home volume at start: /health, reads and 507 on writes, never a crash loop;
    once space is back the journal saves, start-up recovery runs and gateway.json is written."""
    home = tiny_disk / "home"
    with running_gateway(tmp_path / "first", ROOMKEEPER_HOME=str(home)) as gw:
        earlier = gw.client.post("/v1/jobs", json={"argv": ["true"]}).json()["id"]
        wait_until(
            lambda: gw.client.get(f"/v1/jobs/{earlier}").json()["state"] == "exited",
            "the first job's end",
        )
    filler = fill_disk(tiny_disk)
    with running_gateway(tmp_path / "second", ROOMKEEPER_HOME=str(home)) as gw:
        assert gw.anonymous.get("/health").status_code == 200
        assert earlier in {j["id"] for j in gw.client.get("/v1/jobs").json()}
        refused = gw.client.post("/v1/jobs", json={"argv": ["true"]})
        assert refused.status_code == 507, refused.text
        assert gw.client.get("/v1/needs-you").json()["headline"] == "persistence failed"
        assert not (home / "gateway.json").exists()
        filler.unlink()
        wait_until(
            lambda: gw.client.get("/v1/needs-you").json()["headline"] != "persistence failed",
            "the journal saving again",
        )
        assert gw.client.post("/v1/jobs", json={"argv": ["true"]}).status_code == 201
        wait_until((home / "gateway.json").exists, "gateway.json written")
        assert gw.proc.poll() is None  # the same process served throughout
    log_text = "".join(p.read_text() for p in (tmp_path / "second").glob("gateway-*.log"))
    assert "cannot be opened for writing" in log_text
    assert "start-up recovery ran once the journal could save again" in log_text


def test_a_failed_save_undoes_what_it_promised_and_is_saved_once_space_is_back(
    tmp_path: Path, tiny_disk: Path
) -> None:
    """On a full disk: a refused lease holds nothing and its retry is judged again; a
    refused job is never listed; a cancel stops the tree (and says it is not saved); a
    delete of an ended job frees its output first.  Once space is back, the cancelled job
    is saved as ended."""
    home = tiny_disk / "home"
    with running_gateway(tmp_path, ROOMKEEPER_HOME=str(home)) as gw:
        talker = gw.client.post(
            "/v1/jobs", json={"argv": ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x"]}
        ).json()["id"]
        runner = gw.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
        wait_until(
            lambda: (
                gw.client.get(f"/v1/jobs/{runner}").json()["state"] == "running"
                and gw.client.get(f"/v1/jobs/{talker}").json()["state"] == "exited"
            ),
            "one job running, one ended",
        )

        def end_saved() -> bool:  # before the disk fills: an end kept unsaved stops the delete
            with contextlib.closing(journal_db(home)) as conn:
                row = conn.execute("SELECT state FROM jobs WHERE id = ?", (talker,)).fetchone()
            return row is not None and row[0] == "exited"

        wait_until(end_saved, "the ended job's end saved")

        def sleepers() -> list[psutil.Process]:  # running, the job may still be in nice or sh
            found = []
            for child in psutil.Process(gw.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.cmdline()[:2] == ["sleep", "60"]:
                        found.append(child)
            return found

        wait_until(lambda: len(sleepers()) == 1, "the running job's sleep exec'd")
        pid = sleepers()[0].pid
        filler = fill_disk(tiny_disk)
        lease = {"id": "full", "memory_bytes": 10**6}
        for _ in range(2):  # the retry is judged and saved afresh, never a 200 for nothing
            assert gw.client.post("/v1/leases", json=lease).status_code == 507
            assert gw.client.get("/v1/status").json()["leases"].get("granted", 0) == 0
        refused = gw.client.post("/v1/jobs", json={"argv": ["true"]})
        assert refused.status_code == 507
        listed = {j["id"] for j in gw.client.get("/v1/jobs").json()}
        assert listed == {talker, runner}
        cancelled = gw.client.post(f"/v1/jobs/{runner}/cancel")  # not saved: said so
        assert (cancelled.status_code, cancelled.json()["reason"]) == (507, "not_saved")
        assert "the cancel holds in this run (a running tree is stopped)" in cancelled.text
        wait_until(lambda: not psutil.pid_exists(pid) or zombie_or_gone(pid), "the tree stopped")
        assert gw.client.get("/v1/needs-you").json()["headline"] == "persistence failed"
        assert gw.client.delete(f"/v1/jobs/{talker}").status_code == 204
        filler.unlink()
        wait_until(
            lambda: gw.client.get("/v1/needs-you").json()["headline"] != "persistence failed",
            "every change saved",
        )
        with journal_db(home) as conn:
            state = conn.execute("SELECT state FROM jobs WHERE id = ?", (runner,)).fetchone()[0]
            assert state == "stopped"
            assert (
                conn.execute("SELECT count(*) FROM jobs WHERE id = ?", (talker,)).fetchone()[0] == 0
            )


def test_no_new_work_runs_while_start_up_recovery_is_owed(tmp_path: Path, tiny_disk: Path) -> None:
    """A full disk at start leaves recovery owed: submits and calls are refused (507, saying
    so) until it has run, and nothing this run accepted is ever stopped by it."""
    home = tiny_disk / "home"
    with running_gateway(tmp_path / "first", ROOMKEEPER_HOME=str(home)) as gw:
        assert gw.client.post("/v1/jobs", json={"argv": ["true"]}).status_code == 201
    filler = fill_disk(tiny_disk)
    with running_gateway(tmp_path / "second", ROOMKEEPER_HOME=str(home)) as gw:
        refused = gw.client.post("/v1/jobs", json={"argv": ["true"]})
        assert refused.status_code == 507, refused.text
        call = gw.client.post("/v1/calls", json={"kind": "send", "owner": "o"})
        assert call.status_code == 507, call.text
        filler.unlink()
        accepted: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(accepted) < 5:
            answer = gw.client.post("/v1/jobs", json={"argv": ["sleep", "1"]})
            if answer.status_code == 201:
                accepted.append(answer.json()["id"])
            else:
                assert answer.status_code == 507, answer.text
                assert "recovery" in answer.json()["detail"], answer.text
            time.sleep(0.01)
        assert accepted, "no submit was accepted once space was back"
        for job_id in accepted:
            wait_until(
                lambda job_id=job_id: (
                    gw.client.get(f"/v1/jobs/{job_id}").json()["state"]
                    not in ("waiting", "running")
                ),
                f"job {job_id} ending",
                60,
            )
            job = gw.client.get(f"/v1/jobs/{job_id}").json()
            assert (job["state"], job.get("exit_code")) == ("exited", 0), job

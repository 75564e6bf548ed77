"""Save first: pending markers, uncertain and deferred work, calls, history, a full disk."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil
import pytest

from roomkeeper.errors import UsageError
from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from tests.gateways import (
    RunningGateway,
    journal_db,
    kill_whole_tree,
    roomkeeper_cli,
    running_gateway,
    wait_until,
)

pytestmark = pytest.mark.kernel


def wait_state(gw: RunningGateway, job_id: str, *states: str, timeout: float = 30) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        job = gw.client.get(f"/v1/jobs/{job_id}").json()
        if job.get("state") in states or time.monotonic() > deadline:
            return job  # type: ignore[no-any-return]
        time.sleep(0.05)


def appender(path: Path, seconds: float) -> list[str]:
    return ["sh", "-c", f'echo "$0" >> {path}; sleep {seconds}']


def test_marker_is_durable_before_the_launch_and_cleared_with_the_outcome(tmp_path: Path) -> None:
    """While a job runs its pending marker is in the journal; its exit row clears it."""
    with running_gateway(tmp_path) as gw:
        go = tmp_path / "go"  # the job runs until the marker has been read, however long
        wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
        job_id = gw.client.post("/v1/jobs", json={"argv": ["sh", "-c", wait]}).json()["id"]
        wait_state(gw, job_id, "running")
        with journal_db(gw.home) as conn:
            marked = conn.execute("SELECT id FROM markers WHERE kind='job'").fetchall()
        go.touch()
        assert [r["id"] for r in marked] == [job_id]
        assert wait_state(gw, job_id, "exited")["exit_code"] == 0

        def cleared() -> bool:
            with journal_db(gw.home) as conn:
                return int(conn.execute("SELECT count(*) FROM markers").fetchone()[0]) == 0

        wait_until(cleared, "the marker's clearing")  # the exit row is written after the answer
        with journal_db(gw.home) as conn:
            assert conn.execute("SELECT state FROM jobs").fetchone()[0] == "exited"


def test_work_in_flight_at_a_crash_is_uncertain_and_never_rerun_blindly(tmp_path: Path) -> None:
    """A non-resumable job running at a SIGKILL of the whole tree is uncertain, run once."""
    out = tmp_path / "appends"
    with running_gateway(tmp_path) as gw:
        job_id = gw.client.post("/v1/jobs", json={"argv": appender(out, 30)}).json()["id"]
        wait_state(gw, job_id, "running")
        wait_until(lambda: out.exists() and "sh" in out.read_text(), "the job's append")
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:
        assert gw.client.get(f"/v1/jobs/{job_id}").json()["state"] == "uncertain"
        uncertain = gw.client.get("/v1/jobs", params={"state": "uncertain"}).json()
        assert [j["id"] for j in uncertain] == [job_id]
        time.sleep(1.5)
        assert out.read_text().count("sh") == 1  # not re-run
        codes = [e["code"] for e in gw.client.get("/v1/history").json()]
        assert "crash_detected" in codes and "marked_uncertain" in codes
        assert gw.client.get("/v1/needs-you").json()["headline"] == "uncertain work needs you"
        feed = gw.anonymous.get("/v1/feed").json()
        assert {"id": job_id, "state": "uncertain"}.items() <= next(
            j for j in feed["jobs"] if j["id"] == job_id
        ).items()
        assert any(r["reason"] == "marked_uncertain" for r in feed["recoveries"])
        rerun = gw.client.post(f"/v1/jobs/{job_id}/resolve", json={"resolution": "rerun"})
        assert rerun.status_code == 200
        wait_state(gw, job_id, "running")
        deadline = time.monotonic() + 10
        while out.read_text().count("sh") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.read_text().count("sh") == 2  # run again only when asked
        again = gw.client.post(f"/v1/jobs/{job_id}/resolve", json={"resolution": "succeeded"})
        assert again.status_code == 409  # it is no longer uncertain: its state forbids it
        assert again.json()["reason"] == "not_uncertain"


def test_resolve_succeeded_settles_an_uncertain_job(tmp_path: Path) -> None:
    """An uncertain job shows its start and last output; resolve --succeeded settles it."""
    import os

    with running_gateway(tmp_path) as gw:
        job_id = gw.client.post(
            "/v1/jobs", json={"argv": ["sh", "-c", "echo step-one-done; sleep 30"]}
        ).json()["id"]
        wait_state(gw, job_id, "running")
        wait_until(
            lambda: "step-one-done" in gw.client.get(f"/v1/jobs/{job_id}/output").text,
            "the job's first output",
        )
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:
        env = {**os.environ, "ROOMKEEPER_HOME": str(gw.home)}
        known = gw.client.get(f"/v1/jobs/{job_id}").json()
        assert known["started_at"] and "step-one-done" in known["last_output"]
        listed = roomkeeper_cli(env, "jobs", "--state", "uncertain")
        assert "uncertain" in listed.stdout and "step-one-done" in listed.stdout
        result = roomkeeper_cli(env, "resolve", job_id, "--succeeded")
        assert result.returncode == 0, result.stderr
        job = gw.client.get(f"/v1/jobs/{job_id}").json()
        assert (job["state"], job["resolution"]) == ("resolved", "succeeded")


def test_work_in_doubt_is_removed_only_once_it_is_resolved(tmp_path: Path) -> None:
    """DELETE of an uncertain job is 409 in_doubt; resolved, its record and output go (404)."""
    with running_gateway(tmp_path) as gw:
        job_id = gw.client.post("/v1/jobs", json={"argv": ["sleep", "30"]}).json()["id"]
        wait_state(gw, job_id, "running")
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:
        refused = gw.client.delete(f"/v1/jobs/{job_id}")
        assert (refused.status_code, refused.json()["reason"]) == (409, "in_doubt")
        assert gw.client.get(f"/v1/jobs/{job_id}").json()["state"] == "uncertain"
        gw.client.post(f"/v1/jobs/{job_id}/resolve", json={"resolution": "failed"})
        assert gw.client.delete(f"/v1/jobs/{job_id}").status_code == 204
        assert gw.client.get(f"/v1/jobs/{job_id}").status_code == 404
        assert not (gw.home / "logs" / f"{job_id}.log").exists()


def test_resumable_work_is_deferred_and_survives_a_second_restart(tmp_path: Path) -> None:
    """Interrupted resumable jobs are resumed one at a time; a second crash loses none."""
    out = tmp_path / "appends"
    with running_gateway(
        tmp_path, ROOMKEEPER_MAX_RUNNING="3", ROOMKEEPER_MAX_RUNNING_PER_OWNER="3"
    ) as gw:
        ids = [
            gw.client.post("/v1/jobs", json={"argv": appender(out, 4), "resumable": True}).json()[
                "id"
            ]
            for _ in range(3)
        ]
        for job_id in ids:
            wait_state(gw, job_id, "running")
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:  # crash again while they are deferred
        states = {gw.client.get(f"/v1/jobs/{i}").json()["state"] for i in ids}
        assert states <= {"deferred", "waiting", "running"}
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:
        running_at_once = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = [gw.client.get(f"/v1/jobs/{i}").json() for i in ids]
            running_at_once = max(running_at_once, sum(j["state"] == "running" for j in jobs))
            if all(j["state"] == "exited" for j in jobs):
                break
            time.sleep(0.1)
        assert [j["state"] for j in jobs] == ["exited"] * 3
        assert running_at_once == 1  # resumed one at a time
        codes = [e["code"] for e in gw.client.get("/v1/history").json()]
        assert "deferred" in codes and "resumed" in codes


def test_cancelled_and_stopped_work_stays_so_across_a_restart(tmp_path: Path) -> None:
    """Work a person cancelled or stopped is not deferred or resumed after a crash."""
    with running_gateway(tmp_path, ROOMKEEPER_MAX_RUNNING="1") as gw:
        running = gw.client.post("/v1/jobs", json={"argv": ["sleep", "30"], "resumable": True})
        waiting = gw.client.post("/v1/jobs", json={"argv": ["sleep", "30"], "resumable": True})
        run_id, wait_id = running.json()["id"], waiting.json()["id"]
        wait_state(gw, run_id, "running")
        gw.client.post(f"/v1/jobs/{wait_id}/cancel")
        gw.client.post(f"/v1/jobs/{run_id}/cancel")
        wait_state(gw, run_id, "stopped")
        time.sleep(0.3)
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:
        time.sleep(1.0)
        assert gw.client.get(f"/v1/jobs/{run_id}").json()["state"] == "stopped"
        assert gw.client.get(f"/v1/jobs/{wait_id}").json()["state"] == "cancelled"


def test_orphans_of_the_previous_run_are_stopped_at_start(tmp_path: Path) -> None:
    """A managed tree that survived the previous run (its lifeline died too) is stopped at start."""
    with running_gateway(tmp_path) as gw:
        job_id = gw.client.post("/v1/jobs", json={"argv": ["sleep", "60"]}).json()["id"]
        wait_state(gw, job_id, "running")
        row = None
        for _ in range(50):
            with journal_db(gw.home) as conn:
                row = conn.execute("SELECT pid FROM jobs WHERE id=?", (job_id,)).fetchone()
            if row and row["pid"]:
                break
            time.sleep(0.05)
        assert row is not None and row["pid"]
        leader = psutil.Process(row["pid"])
        gateway = psutil.Process(gw.proc.pid)
        # Kill the gateway and its lifeline but not the job: an orphan that "somehow survived".
        for child in gateway.children():
            if "roomkeeper.processes.lifeline" in " ".join(child.cmdline()):
                child.kill()
        gateway.kill()
        gw.proc.wait()
        time.sleep(0.3)
        assert leader.is_running() and leader.status() != psutil.STATUS_ZOMBIE
    try:
        with running_gateway(tmp_path) as gw:
            assert not leader.is_running() or leader.status() == psutil.STATUS_ZOMBIE
            events = gw.client.get("/v1/history").json()
            orphans = [e for e in events if e["code"] == "orphans_stopped"]
            assert orphans and orphans[0]["numbers"]["pids"] >= 1
    finally:
        with contextlib.suppress(psutil.Error):
            leader.kill()  # ours: never leave it behind


def test_registered_calls_keep_their_marker_until_a_saved_outcome(tmp_path: Path) -> None:
    """A call's marker is durable at registration; only a saved outcome clears it."""
    with running_gateway(tmp_path) as gw:
        call = gw.client.post("/v1/calls", json={"kind": "some.unknown.kind", "owner": "bot"})
        assert call.status_code == 201 and call.json()["pending_marker"] is True
        call_id = call.json()["id"]
        done = gw.client.post(
            f"/v1/calls/{call_id}/outcome", json={"outcome": "succeeded", "numbers": {"rows": 3}}
        ).json()
        assert (done["state"], done["pending_marker"]) == ("succeeded", False)

        failed_id = gw.client.post("/v1/calls", json={"kind": "write"}).json()["id"]
        failed = gw.client.post(
            f"/v1/calls/{failed_id}/outcome", json={"outcome": "failed", "error": "permission"}
        ).json()
        assert (failed["state"], failed["error"]) == ("failed", "permission")
        mixed = gw.client.post("/v1/calls", json={"kind": "write"}).json()["id"]
        refused = gw.client.post(
            f"/v1/calls/{mixed}/outcome", json={"outcome": "succeeded", "error": "oops"}
        )
        assert refused.status_code == 409  # error text is never recorded as a success

        late_id = gw.client.post("/v1/calls", json={"kind": "write"}).json()["id"]
        assert gw.client.post(f"/v1/calls/{late_id}/cancel").json()["state"] == "cancelled"
        late = gw.client.post(f"/v1/calls/{late_id}/outcome", json={"outcome": "succeeded"})
        assert late.status_code == 409 and "cannot retire" in late.json()["detail"]
        assert gw.client.get(f"/v1/calls/{late_id}").json()["pending_marker"] is True

        pending_id = gw.client.post("/v1/calls", json={"kind": "deploy"}).json()["id"]
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:
        assert gw.client.get(f"/v1/calls/{pending_id}").json()["state"] == "uncertain"
        assert gw.client.get(f"/v1/calls/{late_id}").json()["state"] == "cancelled"
        resolved = gw.client.post(f"/v1/calls/{pending_id}/resolve", json={"resolution": "failed"})
        assert resolved.json()["state"] == "failed"


def test_history_refuses_anything_but_codes_and_numbers(tmp_path: Path) -> None:
    """Commands, owners, text and unknown codes cannot enter the recovery history."""
    now = time.time()
    for smuggled in (
        {"command": 1},
        {"jobs": "rm -rf /"},  # type: ignore[dict-item]
        {"jobs": float("nan")},
        {"owner": 0},
        {"argv": 2},
    ):
        with pytest.raises(UsageError):
            HistoryEvent(now, RecoveryCode.RESUMED, smuggled)
    with pytest.raises(UsageError):
        HistoryEvent(now, "gateway_started", {})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        HistoryEvent.from_json('{"at": 1, "code": "my secret token", "numbers": {}}')


def test_history_keeps_no_command_or_owner_from_real_work(tmp_path: Path) -> None:
    """After a crash with real work, GET /v1/history carries codes and numbers only."""
    with running_gateway(tmp_path) as gw:
        job_id = gw.client.post(
            "/v1/jobs", json={"argv": ["sh", "-c", "echo SECRET-ARG; sleep 30"], "owner": "ownerx"}
        ).json()["id"]
        wait_state(gw, job_id, "running")
        kill_whole_tree(gw)
    with running_gateway(tmp_path) as gw:
        text = gw.client.get("/v1/history").text
    assert "SECRET-ARG" not in text and "ownerx" not in text and job_id not in text


def test_history_is_capped_in_count_and_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most 500 events are kept, and the oldest go first when the byte cap is reached."""
    journal = Journal(tmp_path / "journal.db")
    try:
        for i in range(520):
            journal.record_history(HistoryEvent(float(i), RecoveryCode.RESUMED, {"jobs": i}))
        journal.record_history(HistoryEvent(999.0, RecoveryCode.RESUMED, {})).result()
        events = journal.history(limit=1000)
        assert len(events) == 500
        assert events[0].at == 999.0 and events[-1].at == 21.0
        monkeypatch.setattr("roomkeeper.journal.history.MAX_BYTES", 600)
        journal.record_history(HistoryEvent(1000.0, RecoveryCode.RESUMED, {})).result()
        kept = journal.history(limit=1000)
        assert sum(len(e.to_json()) for e in kept) <= 600
        assert kept[0].at == 1000.0
    finally:
        journal.close()


def test_history_cap_follows_its_variable(tmp_path: Path) -> None:
    """ROOMKEEPER_HISTORY_MAX_EVENTS sets how many recovery events a gateway keeps."""
    for _ in range(3):
        with running_gateway(tmp_path, ROOMKEEPER_HISTORY_MAX_EVENTS="2") as gw:
            events = gw.client.get("/v1/history").json()
    assert len(events) == 2


def test_a_cancel_answered_is_a_cancel_saved(tmp_path: Path) -> None:
    """Cancel and stop are durable when answered: a crash right after never re-runs the work."""
    with running_gateway(
        tmp_path, ROOMKEEPER_MAX_RUNNING="1", ROOMKEEPER_MAX_RUNNING_PER_OWNER="1"
    ) as gw:
        running = gw.client.post("/v1/jobs", json={"argv": ["sleep", "30"], "resumable": True})
        waiting = gw.client.post("/v1/jobs", json={"argv": ["sleep", "30"], "resumable": True})
        run_id, wait_id = running.json()["id"], waiting.json()["id"]
        wait_state(gw, run_id, "running")
        assert gw.client.post(f"/v1/jobs/{wait_id}/cancel").json()["state"] == "cancelled"
        gw.client.post(f"/v1/jobs/{run_id}/cancel")
        kill_whole_tree(gw)  # at once: no time to reap the stopped tree
    with running_gateway(tmp_path) as gw:
        time.sleep(1.0)
        assert gw.client.get(f"/v1/jobs/{wait_id}").json()["state"] == "cancelled"
        assert gw.client.get(f"/v1/jobs/{run_id}").json()["state"] == "stopped"


def test_queued_work_survives_an_orderly_restart(tmp_path: Path) -> None:
    """Jobs still queued when the gateway is stopped (SIGTERM) are deferred and run after it."""
    with running_gateway(
        tmp_path, ROOMKEEPER_MAX_RUNNING="1", ROOMKEEPER_MAX_RUNNING_PER_OWNER="1"
    ) as gw:
        blocker = gw.client.post("/v1/jobs", json={"argv": ["sleep", "30"]}).json()["id"]
        wait_state(gw, blocker, "running")  # else both are deferred and `true` waits behind it
        queued = gw.client.post("/v1/jobs", json={"argv": ["true"]}).json()["id"]
        wait_state(gw, queued, "waiting")
    with running_gateway(tmp_path) as gw:
        assert wait_state(gw, queued, "exited")["state"] == "exited"

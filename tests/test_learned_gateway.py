"""The gateway learns sizes: a job without an estimate gets its kind's last peaks; policies."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from roomkeeper.jobs.sizes import shape_key, size_key
from roomkeeper.jobs.spec import JobSpec
from roomkeeper.units import format_bytes
from tests.gateways import RunningGateway, gateway_env, roomkeeper_cli, wait_until

pytestmark = pytest.mark.kernel

ALLOC = "b = bytearray(60 * 10**6); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(0.5)"


def _ended(module_gw: RunningGateway, job_id: str, key: str) -> dict[str, Any]:
    """The job once it has ended and its peak is kept under ``key`` in the journal."""
    wait_until(
        lambda: module_gw.client.get(f"/v1/jobs/{job_id}").json()["ended_at"] is not None,
        f"job {job_id} ending",
        timeout=60,
    )
    # The peak is recorded just after the end is shown: wait for it, as a next run would.
    wait_until(lambda: _peaks_kept(module_gw, key) > 0, "the peak being kept")
    job: dict[str, Any] = module_gw.client.get(f"/v1/jobs/{job_id}").json()
    return job


def _peaks_kept(module_gw: RunningGateway, key: str) -> int:
    with contextlib.closing(sqlite3.connect(module_gw.home / "journal.db", timeout=30)) as conn:
        sql = "SELECT count(*) FROM learned_sizes WHERE key = ?"
        return int(conn.execute(sql, (key,)).fetchone()[0])


def _submit(module_gw: RunningGateway, **body: Any) -> str:
    answer = module_gw.client.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def test_a_job_without_an_estimate_gets_the_learned_size_of_its_kind(
    module_gw: RunningGateway,
) -> None:
    """First run: default; its peak is kept under its kind; the next of that kind learns it."""
    job_id = _submit(module_gw, argv=[sys.executable, "-c", ALLOC], kind="alloc-60")
    first = _ended(module_gw, job_id, "kind:alloc-60")
    assert first["state"] == "exited" and first["exit_code"] == 0, first
    assert (first["estimate_source"], first["kind"]) == ("default", "alloc-60")
    assert first["peak_bytes"] is not None and first["peak_bytes"] > 50 * 10**6
    second = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=['true'], kind='alloc-60')}"
    ).json()
    assert second["estimate_source"] == "learned"
    assert second["estimate_bytes"] == first["peak_bytes"]
    stated = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=['true'], kind='alloc-60', memory_bytes=12345)}"
    ).json()
    assert (stated["estimate_source"], stated["estimate_bytes"]) == ("stated", 12345)


def test_without_a_kind_the_same_argv_and_cwd_learn(
    module_gw: RunningGateway, tmp_path: Path
) -> None:
    """No kind: the hash of argv and cwd is the key; another cwd is another kind."""
    argv = [sys.executable, "-c", ALLOC]
    key = size_key(JobSpec(argv=argv, cwd=str(tmp_path)))
    first = _ended(module_gw, _submit(module_gw, argv=argv, cwd=str(tmp_path)), key)
    assert first["estimate_source"] == "default"
    again = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=argv, cwd=str(tmp_path))}"
    ).json()
    assert (again["estimate_source"], again["estimate_bytes"]) == ("learned", first["peak_bytes"])
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=argv, cwd=str(other))}"
    ).json()
    assert elsewhere["estimate_source"] == "default"


def test_a_job_nothing_was_learned_of_is_told_its_command_shapes_typical_peak(
    module_gw: RunningGateway, tmp_path: Path
) -> None:
    """Two runs of one script with other arguments: a third, never seen, carries their median
    peak as ``shape_bytes``; its estimate is still the default, and a job of its own estimate
    or of another script carries none."""
    script = tmp_path / "alloc.py"
    script.write_text(
        "import sys, time\n"
        "b = bytearray(int(sys.argv[1]) * 10**6); b[::4096] = b'x' * len(b[::4096])\n"
        "time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.3)\n"
    )

    def argv(*args: str) -> list[str]:
        return [sys.executable, str(script), *args]

    # A run cut short teaches its shape nothing (its own line's size is still kept).
    cut_argv = argv("5", "60")
    cut = _submit(module_gw, argv=cut_argv, cwd=str(tmp_path), timeout_s=2)
    cut_key = size_key(JobSpec(argv=cut_argv, cwd=str(tmp_path)))
    assert _ended(module_gw, cut, cut_key)["state"] == "timed_out"

    shape = shape_key(JobSpec(argv=argv(), cwd=str(tmp_path)))
    assert shape is not None
    peaks = []
    for mb in ("60", "90"):
        job = _ended(module_gw, _submit(module_gw, argv=argv(mb), cwd=str(tmp_path)), shape)
        assert job["shape_bytes"] is None and job["exit_code"] == 0, job
        peaks.append(job["peak_bytes"])
    wait_until(lambda: _peaks_kept(module_gw, shape) == 2, "both peaks being kept")
    third = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=argv('30'), cwd=str(tmp_path), memory_policy='pack')}"
    ).json()
    assert third["shape_bytes"] == sorted(peaks)[1] and third["estimate_source"] == "default"
    shown = roomkeeper_cli(gateway_env(module_gw.home.parent), "jobs")
    assert shown.returncode == 0, shown.stderr
    assert f"(default; shape {format_bytes(sorted(peaks)[1])}), pack" in shown.stdout
    stated = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=argv('1'), cwd=str(tmp_path), memory_bytes=10**6)}"
    ).json()
    other = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=[sys.executable, '-V'], cwd=str(tmp_path))}"
    ).json()
    assert stated["shape_bytes"] is None and other["shape_bytes"] is None


def test_memory_policy_is_strict_unless_pack_is_asked_for(module_gw: RunningGateway) -> None:
    """A gateway job is strict by default and may ask for pack; the view says which."""
    strict = module_gw.client.get(f"/v1/jobs/{_submit(module_gw, argv=['true'])}").json()
    pack = module_gw.client.get(
        f"/v1/jobs/{_submit(module_gw, argv=['true'], memory_policy='pack')}"
    ).json()
    assert (strict["memory_policy"], pack["memory_policy"]) == ("strict", "pack")
    listed = {j["id"]: j for j in module_gw.client.get("/v1/jobs").json()}
    assert listed[pack["id"]]["memory_policy"] == "pack"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("memory_policy", "loose", "'strict' or 'pack'"),
        ("memory_policy", 1, "'strict' or 'pack'"),
        ("kind", "has space", "String should match pattern"),
        ("kind", "", "at least 1 character"),
        ("kind", "k" * 201, "at most 200 characters"),
    ],
)
def test_bad_memory_policy_or_kind_is_a_422(
    module_gw: RunningGateway, field: str, value: object, words: str
) -> None:
    """Only the two policies, and a kind that is a name: anything else is refused, in words."""
    answer = module_gw.client.post("/v1/jobs", json={"argv": ["true"], field: value})
    assert answer.status_code == 422, answer.text
    assert answer.json()["reason"] == "invalid_request" and words in answer.text


def test_roomkeeper_jobs_shows_the_estimate_and_where_it_came_from(
    module_gw: RunningGateway, tmp_path: Path
) -> None:
    """The table has an estimate column: size, source, and pack when asked for."""
    _submit(module_gw, argv=["true"], memory_bytes=300 * 10**6, memory_policy="pack")
    _submit(module_gw, argv=["true"], kind="shown-as-default")  # nothing learned of its kind
    env = gateway_env(module_gw.home.parent)
    result = roomkeeper_cli(env, "jobs")
    assert result.returncode == 0, result.stderr
    assert "300.0 MB (stated), pack" in result.stdout
    assert "(default)" in result.stdout
    bad = roomkeeper_cli(env, "run", "--kind", "no/slash", "--", "true")
    assert bad.returncode == 2 and "kind must be 1 to 200 letters" in bad.stderr


def test_a_learned_size_above_the_line_is_asked_for_at_the_line(module_gw: RunningGateway) -> None:
    """A past peak bigger than the line is not the submitter's word: 201, never never_fits."""
    with contextlib.closing(sqlite3.connect(module_gw.home / "journal.db", timeout=30)) as conn:
        conn.execute(
            "INSERT INTO learned_sizes (key, peak_bytes, at) VALUES ('kind:huge', ?, 0)", (2**52,)
        )
        conn.commit()
    job = module_gw.client.get(f"/v1/jobs/{_submit(module_gw, argv=['true'], kind='huge')}").json()
    assert job["estimate_source"] == "learned"
    assert 0 < job["estimate_bytes"] < 2**52
    stated = module_gw.client.post("/v1/jobs", json={"argv": ["true"], "memory_bytes": 2**52})
    assert stated.status_code == 422 and stated.json()["reason"] == "never_fits"

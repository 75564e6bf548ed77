"""Issue 13, "nobody else in": private files, a token jobs cannot take, a Host check, a contract.

Each test names the finding it holds.  Where the behaviour is the kernel's
(file modes, another user's access), a real gateway and real jobs are used.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateways import RunningGateway, running_gateway

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("security"), INHERITED_SECRET="s3cr3t") as g:
        yield g


def finished(gw: RunningGateway, job_id: str, timeout: float = 20) -> dict[str, Any]:
    """The job once it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = gw.client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] not in ("waiting", "running"):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# ------------------------------------------------------------------ files


def test_logs_are_0600_and_directories_0700(gw: RunningGateway) -> None:
    """A job's log is 0600; logs/, the workspace and the journal are the gateway's alone."""
    job_id = gw.client.post("/v1/jobs", json={"argv": ["echo", "hi"]}).json()["id"]
    assert finished(gw, job_id)["exit_code"] == 0
    log = gw.home / "logs" / f"{job_id}.log"
    assert mode(log) == 0o600
    assert mode(gw.home / "logs") == 0o700
    assert mode(gw.home.parent / "ws") == 0o700
    assert mode(gw.home / "journal.db") == 0o600
    assert mode(gw.home) == 0o700


def test_the_systemd_unit_makes_its_state_directory_0700() -> None:
    """StateDirectory= alone gives 0755: the unit asks for 0700."""
    unit = (ROOT / "contrib" / "roomkeeper.service").read_text()
    assert "\nStateDirectoryMode=0700\n" in unit

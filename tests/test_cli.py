"""`roomkeeper probe`, run as a person would: a real subprocess, stdout and stderr apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def probe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    clean.update(ROOMKEEPER_HOME=str(tmp_path / "home"), **env)
    return subprocess.run(
        [sys.executable, "-m", "roomkeeper", "probe", *args],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
        check=False,
    )


def test_json_is_exactly_one_object_on_stdout_and_logs_go_to_stderr(tmp_path: Path) -> None:
    """probe --json prints one JSON object with the contract's fields; the log is on stderr."""
    result = probe(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert result.stdout.count("\n") == 1
    for section, key in [
        ("memory", "used_bytes"),
        ("memory", "limit_bytes"),
        ("memory", "source"),
        ("disk", "free_bytes"),
        ("disk", "total_bytes"),
        ("decision", "admit"),
        ("decision", "reason"),
        ("decision", "summary"),
    ]:
        assert key in report[section]
    assert isinstance(report["memory"]["used_bytes"], int)
    assert "roomkeeper guard is on {reads:" in result.stderr
    assert (tmp_path / "home").is_dir()


def test_a_refusal_is_an_answer_and_exits_zero(tmp_path: Path) -> None:
    """A job too big to fit is refused for memory, and probe still exits 0."""
    result = probe(tmp_path, "--json", "--memory", "100000000M")
    assert result.returncode == 0
    decision = json.loads(result.stdout)["decision"]
    assert (decision["admit"], decision["reason"]) == (False, "memory")


def test_an_unknown_reading_is_an_answer_and_exits_zero(tmp_path: Path) -> None:
    """An unusable workspace makes disk unknown: refused as unknown, exit 0."""
    (tmp_path / "file").write_text("x")
    result = probe(tmp_path, "--json", ROOMKEEPER_WORKSPACE=str(tmp_path / "file" / "sub"))
    assert result.returncode == 0
    decision = json.loads(result.stdout)["decision"]
    assert (decision["admit"], decision["reason"]) == (False, "unknown")


def test_the_table_shows_source_line_pressure_disk_and_decision(tmp_path: Path) -> None:
    """Without --json, a table for a person names each reading and the decision."""
    result = probe(tmp_path, "--memory", "600M", ROOMKEEPER_JOB_DISK_MB="0")
    assert result.returncode == 0, result.stderr
    for word in ("memory source", "headroom line", "memory pressure", "disk", "one more job"):
        assert word in result.stdout
    assert "0.63 GB" in result.stdout  # 600 MiB in decimal GB


@pytest.mark.parametrize("bad", ["lots", "-5M"])
def test_a_bad_size_is_a_usage_error_without_a_traceback(tmp_path: Path, bad: str) -> None:
    """A size that cannot be read exits 2 with a message saying the expected form."""
    result = probe(tmp_path, "--memory", bad)
    assert result.returncode == 2
    assert "must be a size such as 600M" in result.stderr
    assert "Traceback" not in result.stderr

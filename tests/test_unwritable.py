"""A place roomkeeper cannot write: one line saying which and how to choose another, exit 1."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateways import gateway_env

COMMANDS = [("probe",), ("batch",), ("serve", "--port", "0"), ("gateway", "--port", "0")]


@contextlib.contextmanager
def read_only_volume(where: Path) -> Iterator[Path]:
    """A real read-only tmpfs (even root cannot write there); skipped where mount is refused."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def answer(env: dict[str, str], *args: str, stdin: str = "echo hi\n") -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "roomkeeper", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_home_under_a_file_is_refused_in_one_line(tmp_path: Path, command: tuple[str]) -> None:
    """ROOMKEEPER_HOME whose parent is a file: every command says so and exits non-zero."""
    (tmp_path / "file").write_text("")
    env = gateway_env(tmp_path, ROOMKEEPER_HOME=str(tmp_path / "file" / "home"))
    code, err = answer(env, *command)
    assert code != 0
    assert f"cannot write ROOMKEEPER_HOME {tmp_path}/file/home: Not a directory" in err
    assert "ROOMKEEPER_HOME=DIR" in err
    assert "Traceback" not in err


@pytest.mark.kernel
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_read_only_home_is_refused_in_one_line(tmp_path: Path, command: tuple[str]) -> None:
    """A home on a read-only volume: 'Read-only file system' and the way out, no traceback."""
    with read_only_volume(tmp_path / "ro") as ro:
        env = gateway_env(tmp_path, ROOMKEEPER_HOME=str(ro / "home"))
        code, err = answer(env, *command)
    assert code != 0
    assert f"cannot write ROOMKEEPER_HOME {ro}/home: Read-only file system" in err
    assert "Traceback" not in err


@pytest.mark.kernel
def test_batch_refuses_a_read_only_logs_directory(tmp_path: Path) -> None:
    """``batch --logs`` on a read-only volume: nothing runs, one line names the directory."""
    out = tmp_path / "ran"
    with read_only_volume(tmp_path / "ro") as ro:
        code, err = answer(
            gateway_env(tmp_path), "batch", "--logs", str(ro), stdin=f"touch {out}\n"
        )
    assert code == 1
    assert f"cannot write the logs directory {ro}: Read-only file system" in err
    assert "--logs DIR" in err
    assert "Traceback" not in err
    assert not out.exists()

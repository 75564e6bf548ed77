"""The lifeline helper is waited for while it lives and makes progress, not for a fixed 10 s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from roomkeeper.errors import RoomkeeperError
from roomkeeper.processes.lifeline import Lifeline


def wrapper(tmp_path: Path, before: str) -> str:
    """An "interpreter" that runs ``before`` (Python), then becomes the real one."""
    script = tmp_path / "slow-python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        f"{before}\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
    )
    script.chmod(0o755)
    return str(script)


def test_a_slow_start_that_makes_progress_is_waited_out(tmp_path: Path) -> None:
    """11 s of work before the helper even starts (over the old fixed 10 s): it still starts."""
    busy = "end = time.monotonic() + 11\nwhile time.monotonic() < end: sum(range(1000))"
    lifeline = Lifeline(python=wrapper(tmp_path, busy), stall_s=5)
    try:
        lifeline.start()
        assert lifeline.pid is not None
        assert lifeline.statistics().starts == 1
    finally:
        lifeline.close()


def test_a_helper_that_dies_is_reported_at_once(tmp_path: Path) -> None:
    """It exits before it is ready: the error says so, with its status."""
    lifeline = Lifeline(python=wrapper(tmp_path, "sys.exit(3)"))
    with pytest.raises(RoomkeeperError, match=r"exited \(status 3\) before it was ready"):
        lifeline.start()


def test_a_helper_that_makes_no_progress_is_given_up_on(tmp_path: Path) -> None:
    """Asleep and using no CPU for longer than the stall limit: stopped, and said so."""
    lifeline = Lifeline(python=wrapper(tmp_path, "time.sleep(60)"), stall_s=1.5)
    with pytest.raises(RoomkeeperError, match=r"made no progress for 1.5 s and was stopped"):
        lifeline.start()

"""A record's process identity: pid and start time, against real processes."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from roomkeeper.kernel.identity import identity_lives, process_identity


def test_a_running_process_lives_and_an_exited_one_does_not_even_as_a_zombie() -> None:
    """Alive while it runs; gone once killed, before its parent has reaped it and after."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = process_identity(child.pid)
        assert identity_lives(identity)
        child.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.01)
        assert not identity_lives(identity)  # a zombie: not reaped yet
    finally:
        child.kill()
        child.wait()
    assert not identity_lives(identity)


def test_a_reused_pid_or_a_malformed_identity_is_not_the_recorded_process() -> None:
    """Same pid, another start time: someone else's process. Nonsense: nobody's."""
    pid, _, started = process_identity().partition(":")
    assert identity_lives(f"{pid}:{started}")
    assert not identity_lives(f"{pid}:{float(started) - 5:.2f}")
    assert not identity_lives("not-a-pid:1.0")
    assert not identity_lives("")

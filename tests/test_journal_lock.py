"""``roomkeeper journal recover`` never moves a journal from under a process that holds it open."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from roomkeeper.journal.database import Journal
from roomkeeper.journal.lock import JournalInUseError, held_alone
from tests.gateways import gateway_env, roomkeeper_cli

HOLDER = """
import sys, time
from roomkeeper.journal.database import Journal
journal = Journal(sys.argv[1])
print("open", flush=True)
time.sleep(120)
"""


def test_recover_refuses_while_a_process_holds_the_journal_open(tmp_path: Path) -> None:
    """With no supervisor record and no gateway.json (as after a start on a full disk), a
    process that has the journal open still keeps recover away; once it dies, recover runs."""
    env = gateway_env(tmp_path)
    home = Path(env["ROOMKEEPER_HOME"])
    home.mkdir(mode=0o700, parents=True)
    path = home / "journal.db"
    Journal(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        assert not (home / "gateway.json").exists()
        done = roomkeeper_cli(env, "journal", "recover")
        assert done.returncode != 0
        assert "holds the journal" in done.stderr and "Traceback" not in done.stderr
        assert sorted(p.name for p in home.iterdir() if "damaged" in p.name) == []
    finally:
        holder.kill()  # SIGKILL: the kernel lets its lock go
        holder.communicate()
    done = roomkeeper_cli(env, "journal", "recover")
    assert done.returncode == 0, done.stderr
    assert any("damaged" in p.name for p in home.iterdir())


def test_a_journal_cannot_open_while_it_is_being_recovered(tmp_path: Path) -> None:
    """The recovery's exclusive hold keeps a gateway's journal from opening mid-recovery."""
    path = tmp_path / "journal.db"
    Journal(path).close()
    with held_alone(path), pytest.raises(JournalInUseError, match="being recovered"):
        Journal(path)
    Journal(path).close()  # and once it is done, it opens

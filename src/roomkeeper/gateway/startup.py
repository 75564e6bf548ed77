"""What the gateway does at start, and what a full disk made it owe since.

At start, before anything new launches: live leases are restored, start-up
recovery (:mod:`roomkeeper.gateway.recovery`) settles what the previous run
left, and the release hooks the previous run owed are found.  Once it
serves, ``gateway.json`` says where it listens.  A full disk may refuse the
recovery's saves or the run record: then each is owed, and done again once
the journal or the disk takes it (the background loop asks), and until the
recovery is saved no new job starts (recovery would stop its tree).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from roomkeeper.errors import PersistenceError, say_failure_once
from roomkeeper.gateway.context import GatewayContext
from roomkeeper.gateway.home import write_run_record
from roomkeeper.gateway.jobs import DurableJobs
from roomkeeper.gateway.leases import DurableLeases
from roomkeeper.gateway.persistence import Persistence
from roomkeeper.gateway.recovery import recover
from roomkeeper.loopback.hooks import ReleaseHook
from roomkeeper.processes.job_user import JobUser

log = logging.getLogger("roomkeeper")


def say_who_jobs_run_as(job_user: JobUser | None) -> None:
    """Say once, at start, which user managed jobs run as and what that protects."""
    if job_user is not None:
        log.info("managed jobs run as user %s (uid %d)", job_user.name, job_user.uid)
        return
    log.warning(
        "managed jobs run as roomkeeper's own user (uid %d): a job can read the token and "
        "the journal, so roomkeeper protects against accidents, not against a hostile job; "
        "run roomkeeper as root with ROOMKEEPER_JOB_USER=USER to keep jobs out",
        os.geteuid(),
    )


class Startup:
    """The gateway's start-up steps, and those a full disk left owed.

    Args:
        context: the journal the recovery saves to.
        home: ROOMKEEPER_HOME (the jobs' logs, ``gateway.json``).
        boot_id: this gateway process's boot id, in ``gateway.json``.
        jobs: whose owed release hooks are restored.
        leases: restored before recovery.
        persistence: told when the journal cannot save the recovery, and when it has.

    Attributes:
        hooks_due: release hooks of jobs the last run ended without a recorded outcome,
            to be made once the gateway serves.
    """

    def __init__(
        self,
        context: GatewayContext,
        *,
        home: Path,
        boot_id: str,
        jobs: DurableJobs,
        leases: DurableLeases,
        persistence: Persistence,
    ) -> None:
        self._journal = context.journal
        self._home = home
        self._boot_id = boot_id
        self._jobs = jobs
        self._leases = leases
        self._persistence = persistence
        self.hooks_due: list[tuple[str, ReleaseHook]] = []
        # Start-up recovery a full disk refused, with the previous pid: until it is saved, the
        # journal counts as not saving, so no new job starts (recovery would stop its tree).
        self._recovery_due: tuple[int | None] | None = None
        self._run_record_due: tuple[int | None, str | None] | None = None  # refused at start

    @property
    def recovery_due(self) -> bool:
        """Whether start-up recovery is still owed (a full disk refused its saves)."""
        return self._recovery_due is not None

    def refuse_new_work_while_owed(self) -> None:
        """New jobs and calls wait for start-up recovery a full disk left owed (it would
        take their trees and markers for the last run's).

        Raises:
            PersistenceError: recovery is still owed; the message says why and what helps.
        """
        if self._recovery_due is not None:
            raise PersistenceError(
                "new work is refused until start-up recovery has run: a full disk refused "
                "its saves at start, and it runs once the journal can save (free space on "
                f"the volume of {self._home}); try again then"
            )

    def settle(self, previous_pid: int | None) -> None:
        """Before anything launches: restore leases, settle what the previous run left, and
        find the release hooks it owed.

        Args:
            previous_pid: the previous gateway's pid when it did not stop cleanly, else None.
        """
        if self._journal.unwritable is not None:
            self._persistence.note(self._journal.unwritable)
        # Before recovery: on cgroup v2 the last run's job groups are found beside the
        # leaf this process moves into, so it must be there first.
        self._jobs.scheduler.prepare()
        if not self._recover(previous_pid):
            # Saved nothing (a full disk): the resume loop runs it again once the journal can
            # save, before anything new launches (new work is refused until then).
            self._recovery_due = (previous_pid,)
        # Release hooks of jobs the last run ended (or its crash did) without a recorded
        # outcome are made once the gateway serves; deferred jobs get theirs back.
        self.hooks_due = self._jobs.hooks.restore()

    def _recover(self, previous_pid: int | None, *, restore: bool = True) -> bool:
        """Restore live leases and settle what the previous run left, before anything launches;
        whether it was saved.

        Args:
            previous_pid: the previous gateway's pid when it did not stop cleanly, else None.
            restore: restore the leases too (not again when recovery runs late).
        """
        if restore:
            self._leases.restore()
        # Orphans stopped and interrupted work settled before anything new launches.
        try:
            recover(
                self._journal,
                crashed=previous_pid is not None,
                previous_pid=previous_pid,
                logs_dir=self._home / "logs",
            )
        except Exception as err:  # e.g. a full disk: report it and keep serving
            log.error("start-up recovery could not be saved: %s", err)
            self._persistence.note(err)
            return False
        return True

    def recover_late(self) -> None:
        """Start-up recovery that a full disk refused: again, once the journal can save."""
        if self._recovery_due is None or self._journal.unwritable is not None:
            return
        (previous_pid,) = self._recovery_due
        if self._recover(previous_pid, restore=False):
            self._recovery_due = None
            self._persistence.clear()
            log.warning("start-up recovery ran once the journal could save again")

    def write_run_record(self, *, port: int | None, socket: str | None) -> None:
        """Say where we listen in ROOMKEEPER_HOME; owed, when a full disk refuses it."""
        try:
            write_run_record(self._home, boot_id=self._boot_id, port=port, socket=socket)
        except OSError as err:  # a full disk: serve anyway, and say what the CLI lacks
            log.error(
                "could not write %s (%s): the roomkeeper commands cannot find this gateway "
                "until it is written; the API answers on its address",
                self._home / "gateway.json",
                err,
            )
            self._persistence.note(err)
            self._run_record_due = (port, socket)  # written by the resume loop once it can be
            # The previous run's record must not outlive it: the next start would take this
            # run's crash for none, or its pid for the previous one's (unlinking frees space).
            with contextlib.suppress(OSError):
                (self._home / "gateway.json").unlink()

    def _write_run_record_late(self) -> None:
        """Write ``gateway.json`` that a full disk refused at start, once it can be."""
        assert self._run_record_due is not None
        port, socket = self._run_record_due
        with contextlib.suppress(OSError):
            write_run_record(self._home, boot_id=self._boot_id, port=port, socket=socket)
            self._run_record_due = None
            log.warning("wrote %s: the roomkeeper commands find this gateway now", "gateway.json")

    async def catch_up(self) -> None:
        """Do what a full disk refused at start, where it can be done now (on the loop)."""
        if self._run_record_due is not None:
            self._write_run_record_late()
        if self._recovery_due is not None:
            try:
                await asyncio.to_thread(self.recover_late)
            except Exception as err:  # tried again on the next turn of the loop
                say_failure_once("the late start-up recovery", err)

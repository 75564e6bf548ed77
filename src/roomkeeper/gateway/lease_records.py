"""Every change of a lease, saved, and saved again until the journal takes it.

A lease's change (its grant, a heartbeat, its end) is one write of its row.
A save that fails is kept: the lease is *unsaved*, and the background loop
saves its newest state again until a save of it succeeds, so a lease
released while the disk was full is saved released once the disk takes
writes, never restored with its reservation (and its hook made again) at the
next start.  Every save is made on the event loop, in the order of the
changes, and the journal's one writer takes them in that order, so the
newest state is the last written; the journal never makes an ended lease
granted again besides.

A grant is the one change never saved again: not saved, it never was (its
request was answered so).  One whose save did not answer in time is *taken
back*: if its row lands after all, the row is removed.  The outcomes of the
release hooks owed since before this start are kept and saved again the
same way, and so is the expiry, at start, of the leases that passed their
ttl while the gateway was down, when a full disk refused it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from roomkeeper.gateway.persistence import awaited
from roomkeeper.guard.leases import LeaseView
from roomkeeper.journal.database import Journal
from roomkeeper.loopback.hooks import ReleaseHook

log = logging.getLogger("roomkeeper")

Expired = list[tuple[str, ReleaseHook]]
"""Leases an expiry ended with a release hook: their ids and hooks."""


class LeaseRecords:
    """What the journal keeps of each lease as it changes, and what it still owes.

    Args:
        journal: where the leases' rows are written.
        watch: told of every journal write, to report one that fails.

    Attributes:
        unsaved: leases whose newest change failed to save, and since when.
    """

    def __init__(
        self, *, journal: Journal, watch: Callable[[concurrent.futures.Future[Any]], None]
    ) -> None:
        self._journal = journal
        self._watch = watch
        self._lock = threading.Lock()  # the writes settle on the journal's thread
        self._writes: dict[str, concurrent.futures.Future[bool]] = {}  # newest, until saved
        self._newest: dict[str, LeaseView] = {}  # what that write saves, to save it again
        self.unsaved: dict[str, float] = {}
        # Grants answered as not granted while their save was on its way (event loop only):
        # their grant time, the write to watch, and whether that write is the row's removal.
        self._taken_back: dict[str, tuple[float, concurrent.futures.Future[bool], bool]] = {}
        # Hooks owed since before this start: the outcome, and its write (event loop only).
        self._outcomes: dict[str, tuple[str, concurrent.futures.Future[None]]] = {}
        # The start's expiry a full disk refused: the start's time, and the write trying it.
        self._expiry: tuple[float, concurrent.futures.Future[Expired]] | None = None

    @property
    def owed(self) -> int:
        """Lease changes whose save failed and is made again: rows, hook outcomes, and the
        expiry at start (one)."""
        failed = sum(
            1 for _, write in self._outcomes.values() if write.done() and write.exception()
        )
        return len(self.unsaved) + failed + (self._expiry is not None)

    def save(self, lease: LeaseView, *, again: bool = True) -> concurrent.futures.Future[bool]:
        """Write the lease as it stands now (on the event loop, in order with its changes).

        Args:
            lease: the lease's newest state.
            again: save it again while it fails (False for a grant: not saved, it never was).

        Returns:
            The write: False when the id belongs to another grant, whose row stays as it was.
        """
        write = self._journal.record_lease(lease)
        self._watch(write)
        with self._lock:
            self._writes[lease.id] = write
            if again:
                self._newest[lease.id] = lease
            else:
                self._newest.pop(lease.id, None)
        write.add_done_callback(lambda done: self._settled(lease.id, done))
        return write

    def _settled(self, lease_id: str, done: concurrent.futures.Future[bool]) -> None:
        """A write of the lease is done (the journal's thread): saved, or kept unsaved."""
        with self._lock:
            if self._writes.get(lease_id) is not done:
                return  # a newer change's write decides
            if done.exception() is None:
                del self._writes[lease_id]
                self._newest.pop(lease_id, None)
                self.unsaved.pop(lease_id, None)
            elif lease_id in self._newest:
                self.unsaved.setdefault(lease_id, time.time())

    async def settled(self, lease_id: str, what: str, *, then: str) -> None:
        """Wait, within the save deadline, until the lease's newest change is saved; one whose
        save failed is saved again now.

        Raises:
            PersistenceError: the journal refused it (it stays unsaved, saved again later).
            SaveTimeoutError: the journal did not answer in time.
        """
        with self._lock:
            write = self._writes.get(lease_id)
            newest = self._newest.get(lease_id)
        if write is None:
            return
        if write.done() and write.exception() is not None and newest is not None:
            write = self.save(newest)
        await awaited(write, what, then=then)

    def forget(self, lease_id: str) -> None:
        """A grant that was not saved: it never was, and nothing of it is saved again."""
        with self._lock:
            self._writes.pop(lease_id, None)
            self._newest.pop(lease_id, None)
            self.unsaved.pop(lease_id, None)

    def take_back(self, lease: LeaseView) -> None:
        """A grant whose save did not answer in time was answered as not granted: if its row
        lands after all, it is removed (:meth:`retry` watches for it)."""
        with self._lock:
            write = self._writes.pop(lease.id, None)
            self._newest.pop(lease.id, None)
            self.unsaved.pop(lease.id, None)
        if write is not None:
            self._taken_back[lease.id] = (lease.granted_at, write, False)

    def taking_back(self, lease_id: str) -> bool:
        """Whether a grant of this id, answered as not granted, may still land."""
        return lease_id in self._taken_back

    def settle_hook(self, lease_id: str, outcome: str) -> None:
        """Save how a hook owed since before this start went; saved again until it is."""
        write = self._journal.settle_lease_hook(lease_id, outcome)
        self._watch(write)
        self._outcomes[lease_id] = (outcome, write)

    def owe_expiry(self, now: float, write: concurrent.futures.Future[Expired]) -> None:
        """The expiry at start (``now``) of leases past their ttl was not saved (``write``):
        tried again until it is (:meth:`retry` hands over the hooks it makes due)."""
        self._expiry = (now, write)

    def retry(self) -> Expired:
        """Save again what failed to save (on the event loop): each unsaved lease's newest
        state, each owed hook outcome, the expiry at start, and the removal of each
        taken-back grant's row that landed.

        Returns:
            The release hooks, by lease id, of the leases the expiry at start ended, once
            it is saved (they are due now); else none.
        """
        with self._lock:
            again = [
                self._newest[i]
                for i, write in self._writes.items()
                if i in self.unsaved and i in self._newest and write.done()
            ]
        for lease in again:
            self.save(lease)
        for lease_id, (outcome, write) in list(self._outcomes.items()):
            if write.done():
                if write.exception() is None:
                    del self._outcomes[lease_id]
                else:
                    self.settle_hook(lease_id, outcome)
        self._take_back_landed()
        return self._expire_late()

    def _expire_late(self) -> Expired:
        """The expiry at start, tried again; the hooks it made due once it is saved."""
        if self._expiry is None or not self._expiry[1].done():
            return []
        now, write = self._expiry
        if write.exception() is not None:
            again = self._journal.expire_leases(now=now)
            self._watch(again)
            self._expiry = (now, again)
            return []
        self._expiry = None
        log.warning("leases past their ttl at start are saved as expired now; hooks are due")
        return write.result()

    def _take_back_landed(self) -> None:
        """Remove the row of a taken-back grant whose save landed after all; drop the others."""
        for lease_id, (granted_at, write, removing) in list(self._taken_back.items()):
            if not write.done():
                continue
            failed = write.exception() is not None
            if removing and not failed:
                del self._taken_back[lease_id]
                log.warning(
                    "lease %s: its grant's late row is removed (it was not granted)", lease_id
                )
                continue
            if not removing and (failed or not write.result()):
                del self._taken_back[lease_id]  # its row never landed: nothing to take back
                continue
            removal = self._journal.forget_lease_grant(lease_id, granted_at=granted_at)
            self._watch(removal)
            self._taken_back[lease_id] = (granted_at, removal, True)

"""Leases made durable: each grant, heartbeat and end is recorded in the journal.

A grant may wait for room; an end runs the lease's release hook before its
memory is given back; leases past their ttl are expired by a timer; and a
restart restores the leases still within their ttl, with their reservation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from roomkeeper.errors import AlreadyEndedError, UsageError, say_failure_once
from roomkeeper.gateway.refusals import Refusal
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import (
    NOT_RELIEVED,
    RELIEVE_ASKED,
    Leases,
    LeaseState,
    LeaseView,
    guard_key,
)
from roomkeeper.guard.rule import Decision, Reason
from roomkeeper.journal.database import Journal
from roomkeeper.loopback.hooks import HOOK_DUE, HookRunner, ReleaseHook

LEASE_CHECK_EVERY_S = 0.5
UNJUDGED_RELIEF = (
    f"{NOT_RELIEVED}: the gateway restarted before its memory was judged (its hook is never "
    "called again)"
)
LEASE_RETRY_S = 0.25

log = logging.getLogger("roomkeeper")


class DurableLeases:
    """The gateway's leases, with the journal behind every change.

    Args:
        leases: the leases in memory.
        guard: whose reservations restored leases hold again.
        journal: where each lease and each change of state is recorded.
        refusals: recent refusals for the Health page (shared with the gateway).
        closing: whether the gateway is shutting down (no grant, no more waiting).
        watch: told of every journal write, to report one that fails.
        hooks: the pool release hooks run on (never the event loop's default executor,
            which every ``asyncio.to_thread`` of a request shares).
        reclaim_disk: the one prune a refusal for disk gets before it stands (finished
            jobs' trees, down to the guard's line); True when it freed anything.
    """

    def __init__(
        self,
        *,
        leases: Leases,
        guard: Guard,
        journal: Journal,
        refusals: deque[Refusal],
        closing: Callable[[], bool],
        watch: Callable[[concurrent.futures.Future[Any]], None],
        hooks: HookRunner,
        reclaim_disk: Callable[[Decision], bool] | None = None,
    ) -> None:
        self._reclaim_disk = reclaim_disk
        self.leases = leases
        self._hooks = hooks
        self._guard = guard
        self._journal = journal
        self._refusals = refusals
        self._closing = closing
        self._watch = watch
        self._due: list[tuple[str, ReleaseHook]] = []  # hooks owed since before this start

    def restore(self) -> None:
        """Leases granted before a restart and not yet past their ttl keep their reservation;
        the hooks of those that ended meanwhile, or whose hook a crash interrupted, are due
        (:meth:`run_due_hooks`)."""
        now = time.time()
        try:
            self._journal.expire_leases(now=now).result()
        except Exception as err:  # a full disk: the expiry is saved by the next start
            log.error("leases past their ttl could not be saved as expired: %s", err)
        self._due = self._journal.leases_with_hooks_due()
        for saved in self._journal.live_leases(now=now):
            lease = saved
            if saved.relieve_outcome == RELIEVE_ASKED:  # asked before the restart, never judged
                lease = replace(saved, relieve_outcome=UNJUDGED_RELIEF)
                with contextlib.suppress(Exception):  # a full disk: said again next start
                    self._journal.record_relieve(lease.id, UNJUDGED_RELIEF).result()
            self.leases.restore(lease)
            self._guard.hold(
                guard_key(lease.id), lease.terms.memory_bytes or 0, age_s=now - lease.granted_at
            )

    def record(self, lease: LeaseView) -> concurrent.futures.Future[bool]:
        """The lease's change and its row, in one write: watched, and awaited by the caller
        (False: the id is another grant's, whose row was left as it was)."""
        write = self._journal.record_lease(lease)
        self._watch(write)
        return write

    async def grant(
        self, lease_id: str | None, terms: LeaseTerms, *, wait_s: float
    ) -> tuple[LeaseView | None, Decision | None, bool]:
        """Grant a lease on ``terms`` (an id is made when None), waiting up to ``wait_s`` for
        room; (lease, decision, created)."""
        if self._closing():
            raise UsageError("the gateway is shutting down", name="shutdown")
        lease_id = lease_id or uuid.uuid4().hex[:16]
        await self._refuse_an_id_seen_before(lease_id)
        deadline = time.monotonic() + wait_s
        pruned = False
        while True:
            lease, decision = self.leases.grant(lease_id, terms)
            if lease is not None:
                if decision is not None:  # a new grant, not a retried request
                    try:
                        made = await asyncio.wrap_future(self.record(lease))
                    except Exception:
                        # Not saved, so not granted: it holds nothing, and a retry of the
                        # same request tries to save it again.
                        self.leases.withdraw(lease_id)
                        raise
                    if not made:  # the journal knew the id (a grant raced this one)
                        self.leases.withdraw(lease_id)
                        await self._refuse_an_id_seen_before(lease_id)
                return lease, decision, decision is not None
            assert decision is not None
            if not pruned and self._may_prune(decision):
                pruned = True  # one prune per request, then the guard judges again
                if await asyncio.to_thread(self._prune_for, decision):
                    continue
            self._refusals.append(Refusal.of(decision, lease_id))
            if time.monotonic() + LEASE_RETRY_S > deadline or self._closing():
                return None, decision, False
            await asyncio.sleep(LEASE_RETRY_S)

    async def _refuse_an_id_seen_before(self, lease_id: str) -> None:
        """An id the journal knows and memory does not (forgotten past its window, or
        before a restart) is never granted again: the journal, not memory, decides.

        Raises:
            AlreadyEndedError: the id belongs to a lease that ended.
        """
        if self.leases.known(lease_id):
            return  # memory has it: a retried grant (same lease) or its own 409
        seen = await asyncio.to_thread(self._journal.lease_seen, lease_id)
        if seen is not None:
            raise AlreadyEndedError(
                f"lease {lease_id!r} was granted before and is not live now "
                f"({seen.state.value}); a lease id is granted once: use a new id",
                lease_id=lease_id,
            )

    def _may_prune(self, decision: Decision) -> bool:
        """A refusal for disk that a prune could change (disk is the one resource we free)."""
        return (
            self._reclaim_disk is not None
            and decision.reason is Reason.DISK
            and not decision.never_fits
        )

    def _prune_for(self, decision: Decision) -> bool:
        """The prune before a disk refusal stands; a failed prune leaves the refusal as it was."""
        assert self._reclaim_disk is not None
        try:
            return self._reclaim_disk(decision)
        except Exception:
            log.exception("the disk prune before refusing a lease failed")
            return False

    async def end(self, lease_id: str, state: LeaseState = LeaseState.RELEASED) -> LeaseView:
        """End a lease: save its end with its hook due, run the hook, then give its memory
        back, and record how the hook went.

        Saved before the call: a crash during the hook leaves an ended lease (never
        granted again) whose hook the next start makes again, with the same key.
        """
        lease = self.leases.end(lease_id, state)
        if lease is None:  # it had ended already: releasing twice is not an error
            return self.leases.get(lease_id)
        outcome = None
        try:
            if lease.terms.release is not None:
                try:
                    due = replace(lease, hook_outcome=HOOK_DUE)
                    await asyncio.wrap_future(self.record(due))
                except Exception as err:  # a full disk: the hook still runs, memory comes back
                    log.error(
                        "lease %s: its end could not be saved before its hook: %s", lease_id, err
                    )
                outcome = await self._run_hook(lease.terms.release, lease_id)
        finally:  # whatever happened to the hook, the lease's memory is given back
            lease = self.leases.complete(lease_id, outcome)
        await asyncio.wrap_future(self.record(lease))
        return lease

    async def _run_hook(self, hook: ReleaseHook, lease_id: str) -> str:
        """The hook on its own pool, keyed by the lease; this request waits for it, nothing
        else does."""
        keyed = replace(hook, key=f"lease-{lease_id}")
        return await asyncio.wrap_future(self._hooks.submit(keyed))

    async def run_due_hooks(self) -> None:
        """Make the hooks owed since before this start (once each), and record how they went."""
        due, self._due = self._due, []
        for lease_id, hook in due:
            outcome = await self._run_hook(hook, lease_id)
            with contextlib.suppress(Exception):  # a failed save is reported by the watch
                write = self._journal.settle_lease_hook(lease_id, outcome)
                self._watch(write)
                await asyncio.wrap_future(write)
            log.warning(
                "lease %s: its release hook, due since before this start, ran: %s",
                lease_id,
                outcome,
            )

    async def heartbeat(self, lease_id: str, ttl_s: float | None) -> LeaseView:
        """Extend a lease's ttl from now."""
        lease = self.leases.heartbeat(lease_id, ttl_s)
        await asyncio.wrap_future(self.record(lease))
        return lease

    async def expiry_loop(self) -> None:
        """End leases past their ttl (a timer; runs until cancelled)."""
        while True:
            for lease_id in self.leases.due():
                try:
                    await self.end(lease_id, LeaseState.EXPIRED)
                except Exception as err:  # the timer must go on; the lease is tried again
                    say_failure_once(f"expiring lease {lease_id}", err)
            await asyncio.sleep(LEASE_CHECK_EVERY_S)

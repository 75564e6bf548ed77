"""Leases made durable: each grant, heartbeat and end is recorded in the journal.

A grant may wait for room (between its tries it waits as its caller says: the
API gives its place in line back meanwhile); an end runs the lease's release
hook before its memory is given back; leases past their ttl are expired by a
timer; and a restart restores the leases still within their ttl, with their
reservation.  Each save is :mod:`~roomkeeper.gateway.lease_records`'s: a
request waits for it within the save deadline, and one that failed is saved
again until the journal takes it.  Leases that expired while the gateway was
down are saved expired at start, or, when a full disk refuses that, once the
journal saves; their hooks are made then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from roomkeeper.errors import (
    AlreadyEndedError,
    PersistenceError,
    SaveTimeoutError,
    UsageError,
    say_failure_once,
)
from roomkeeper.gateway.lease_records import LeaseRecords
from roomkeeper.gateway.persistence import FREE_SPACE, awaited, saved
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
from roomkeeper.jobs.sizes import KIND_PREFIX, lease_size
from roomkeeper.journal.database import Journal
from roomkeeper.loopback.hook_calls import HookRunner
from roomkeeper.loopback.hooks import HOOK_DUE, ReleaseHook

LEASE_CHECK_EVERY_S = 0.5
UNJUDGED_RELIEF = (
    f"{NOT_RELIEVED}: the gateway restarted before its memory was judged (its hook is never "
    "called again)"
)
LEASE_RETRY_S = 0.25  # a waiting grant is judged again this often, and as a lease ends

Pause = Callable[[float, asyncio.Event | None], Awaitable[None]]
"""How a waiting grant waits: at most so many seconds, less once the event is set."""


async def sleep_or_woken(seconds: float, wake: asyncio.Event | None = None) -> None:
    """Sleep ``seconds``, or until ``wake`` is set if that comes first."""
    if wake is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), seconds)


class LeaseEnds:
    """What a grant waiting for room waits on besides its retry: the next lease's end."""

    def __init__(self) -> None:
        # One event at a time, on the loop that waits on it (an event belongs to one loop).
        self._next: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def next(self) -> asyncio.Event:
        """The event the next lease's end sets, on the running loop."""
        loop = asyncio.get_running_loop()
        if self._next is None or self._next[0] is not loop:
            self._next = (loop, asyncio.Event())
        return self._next[1]

    def fire(self) -> None:
        """A lease ended: wake everything waiting on the next end."""
        if self._next is not None:
            self._next[1].set()
            self._next = None


def learned_terms(
    terms: LeaseTerms, journal: Journal, guard: Guard, default_memory: int | None
) -> LeaseTerms:
    """``terms`` at its kind's learned size (:func:`~roomkeeper.jobs.sizes.lease_size`,
    under the guard's line) when it asks no memory, else at ``default_memory``; as asked
    when it asks memory."""
    if terms.memory_bytes is not None:
        return terms
    peaks = [] if terms.kind is None else journal.recent_peaks(KIND_PREFIX + terms.kind)
    line = guard.check(memory_bytes=0).memory_line_bytes if peaks else None
    learned = lease_size(peaks, line)
    return replace(terms, memory_bytes=default_memory if learned is None else learned)


NOT_GRANTED = f"the lease is not granted and holds nothing: ask again once it saves; {FREE_SPACE}"
SAVED_LATER = f"it holds in this run and is saved as soon as the journal takes it; {FREE_SPACE}"

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
        self.records = LeaseRecords(journal=journal, watch=watch)
        self._due: list[tuple[str, ReleaseHook]] = []  # hooks owed since before this start
        self._owed_ids: set[str] = set()  # every lease whose owed hook this run makes, once
        self._more_due = asyncio.Event()
        self._ends = LeaseEnds()

    def restore(self) -> None:
        """Leases granted before a restart and not yet past their ttl keep their reservation;
        the hooks of those that ended meanwhile, or whose hook a crash interrupted, are due
        (:meth:`run_due_hooks`)."""
        now = time.time()
        expiry = self._journal.expire_leases(now=now)
        self._watch(expiry)
        try:
            saved(expiry, "the expiry of leases past their ttl", then="saved once it can be")
        except PersistenceError as err:  # a full disk: saved, and hooks made, once it saves
            log.error("%s; their hooks are made then", err)
            self.records.owe_expiry(now, expiry)
        self._owe_hooks(self._journal.leases_with_hooks_due())
        for kept in self._journal.live_leases(now=now):
            lease = kept
            if kept.relieve_outcome == RELIEVE_ASKED:  # asked before the restart, never judged
                lease = replace(kept, relieve_outcome=UNJUDGED_RELIEF)
                with contextlib.suppress(PersistenceError):  # a full disk: said next start
                    write = self._journal.record_relieve(lease.id, UNJUDGED_RELIEF)
                    saved(write, f"lease {lease.id!r}'s relief", then="")
            self.leases.restore(lease)
            self._guard.hold(
                guard_key(lease.id), lease.terms.memory_bytes or 0, age_s=now - lease.granted_at
            )

    async def grant(
        self,
        lease_id: str | None,
        terms: LeaseTerms,
        *,
        wait_s: float,
        pause: Pause = sleep_or_woken,
        default_memory: int | None = None,
    ) -> tuple[LeaseView | None, Decision | None, bool]:
        """Grant a lease on ``terms`` (an id is made when None), waiting up to ``wait_s`` for
        room; (lease, decision, created).

        Args:
            lease_id: the holder's id for it, or None.
            terms: what the holder asks for.
            wait_s: how long to wait for room before a refusal stands.
            pause: how the request waits between tries (the API's gives its place in line
                back while it waits); a lease's end wakes it at once.
            default_memory: the memory asked when ``terms`` asks none and its kind has
                learned nothing (the guard's estimate when None).  Each try takes what the
                kind learned meanwhile: a call that waits starts at the size its kind was
                last seen to take.

        Raises:
            UsageError: the gateway is shutting down (``shutdown``).
            AlreadyEndedError: the id belongs to a lease that ended.
            PersistenceError: the grant was not saved, so not granted.
            SaveTimeoutError: the grant's save did not answer in time, so it is not granted.
        """
        if self._closing():
            raise UsageError("the gateway is shutting down", name="shutdown")
        lease_id = lease_id or uuid.uuid4().hex[:16]
        if self.records.taking_back(lease_id):
            raise SaveTimeoutError(
                f"lease {lease_id!r}: the journal has not answered yet for an earlier grant "
                "under this id (answered as not granted); ask again in a moment"
            )
        await self._refuse_an_id_seen_before(lease_id)
        asked = terms
        deadline = time.monotonic() + wait_s
        pruned = False
        while True:
            terms = await asyncio.to_thread(self.learned, asked, default_memory)
            lease, decision = self.leases.grant(lease_id, terms)
            if lease is not None:
                if decision is None:  # a retried request: answered as the lease's saves stand
                    await self.records.settled(lease_id, f"lease {lease_id!r}", then=SAVED_LATER)
                    return lease, None, False
                await self._save_grant(lease)
                return lease, decision, True
            assert decision is not None
            if not pruned and self._may_prune(decision):
                pruned = True  # one prune per request, then the guard judges again
                if await asyncio.to_thread(self._prune_for, decision):
                    continue
            self._refusals.append(Refusal.of(decision, lease_id))
            if time.monotonic() + LEASE_RETRY_S > deadline:
                return None, decision, False
            if self._closing():
                raise UsageError(
                    "the gateway is shutting down: the lease was not granted", name="shutdown"
                )
            await pause(LEASE_RETRY_S, self._ends.next())

    def learned(self, terms: LeaseTerms, default_memory: int | None = None) -> LeaseTerms:
        """``terms`` sized as :func:`learned_terms` says, from this gateway's runs."""
        return learned_terms(terms, self._journal, self._guard, default_memory)

    async def _save_grant(self, lease: LeaseView) -> None:
        """Save a new grant before it is answered.  Not saved, it never was: it holds
        nothing, and a retry of the same request is judged afresh.

        Raises:
            PersistenceError: the journal refused it.
            SaveTimeoutError: no answer in time; a row that lands later is taken back.
            AlreadyEndedError: the journal knew the id (a grant raced this one).
        """
        try:
            made = await awaited(
                self.records.save(lease, again=False),
                f"lease {lease.id!r}'s grant",
                then=NOT_GRANTED,
            )
        except SaveTimeoutError:
            self.leases.withdraw(lease.id)
            self.records.take_back(lease)
            raise
        except Exception:
            self.leases.withdraw(lease.id)
            self.records.forget(lease.id)
            raise
        if not made:  # the journal knew the id (a grant raced this one)
            self.leases.withdraw(lease.id)
            self.records.forget(lease.id)
            await self._refuse_an_id_seen_before(lease.id)

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
        granted again) whose hook the next start makes again, with the same key.  An end
        the journal does not take is kept and saved again until it does.

        Raises:
            PersistenceError: the end holds in this run but is not saved yet.
            SaveTimeoutError: the same, the journal not answering in time.
        """
        then = (
            f"lease {lease_id!r} has ended in this run (its memory given back, its hook made "
            f"if it has one) and its end is saved as soon as the journal takes it; {FREE_SPACE}"
        )
        lease = self.leases.end(lease_id, state)
        if lease is None:  # it had ended already: releasing twice is not an error
            await self.records.settled(lease_id, f"lease {lease_id!r}'s end", then=then)
            return self.leases.get(lease_id)
        outcome, late = None, False
        try:
            if lease.terms.release is not None:
                due = self.records.save(replace(lease, hook_outcome=HOOK_DUE))
                try:
                    await awaited(due, f"lease {lease_id!r}'s end", then="its hook is made")
                except PersistenceError as err:  # the hook still runs, memory comes back
                    log.error("%s", err)
                    late = isinstance(err, SaveTimeoutError)
                outcome = await self._run_hook(lease.terms.release, lease_id)
        finally:  # whatever happened to the hook, the lease's memory is given back
            lease = self.leases.complete(lease_id, outcome)
            write = self.records.save(lease)
            self._ends.fire()  # wake every grant waiting for room
        # A journal that did not answer before the hook will not answer now: say so at once.
        await awaited(write, f"lease {lease_id!r}'s end", then=then, timeout_s=0 if late else None)
        return lease

    async def _run_hook(self, hook: ReleaseHook, lease_id: str) -> str:
        """The hook on its own pool, keyed by the lease; this request waits for it, nothing
        else does."""
        keyed = replace(hook, key=f"lease-{lease_id}")
        return await asyncio.wrap_future(self._hooks.submit(keyed))

    def _owe_hooks(self, found: list[tuple[str, ReleaseHook]]) -> None:
        """Hooks owed since before this start, each lease's once, for :meth:`run_due_hooks`."""
        for lease_id, hook in found:
            if lease_id not in self._owed_ids:
                self._owed_ids.add(lease_id)
                self._due.append((lease_id, hook))
        if self._due:
            self._more_due.set()

    async def run_due_hooks(self) -> None:
        """Make the hooks owed since before this start (once each), and record how they went;
        then those a late expiry makes owed.  Runs until cancelled."""
        while True:
            while self._due:
                lease_id, hook = self._due.pop(0)
                outcome = await self._run_hook(hook, lease_id)
                self.records.settle_hook(lease_id, outcome)  # saved again until it is
                log.warning(
                    "lease %s: its release hook, due since before this start, ran: %s",
                    lease_id,
                    outcome,
                )
            self._more_due.clear()
            await self._more_due.wait()

    def save_owed(self) -> None:
        """Save again what failed to save (on the event loop); the leases a late expiry
        ended get their hooks."""
        self._owe_hooks(self.records.retry())

    async def heartbeat(self, lease_id: str, ttl_s: float | None) -> LeaseView:
        """Extend a lease's ttl from now.

        Raises:
            PersistenceError: the new ttl holds in this run but is not saved yet.
            SaveTimeoutError: the same, the journal not answering in time.
        """
        lease = self.leases.heartbeat(lease_id, ttl_s)
        await awaited(
            self.records.save(lease),
            f"lease {lease_id!r}'s heartbeat",
            then=SAVED_LATER,
        )
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

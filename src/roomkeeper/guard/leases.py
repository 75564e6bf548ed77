"""Leases: admission for work roomkeeper does not spawn (an agent dispatcher's turns).

A dispatcher asks for a lease before it starts a turn in another server and
gives it back when the turn ends.  A lease holds a young reservation of its
full estimate (less its share of the container's growth, where the gateway
attributes one: :mod:`~roomkeeper.guard.attribution`) from grant
until the warm-up window ends, it is released, or it expires, whichever
comes first.  Leases take no job slot; besides the guard's memory line,
granted leases are capped in total and per owner (a dispatcher that asks for
zero-byte leases in a loop is refused, not granted without end), and ended
leases are remembered only up to a cap, like finished jobs (the journal keeps
every one).  A holder that stops heartbeating lets its lease expire, so a
crashed dispatcher does not hold memory forever.

Ending is two steps so the release hook runs *before* the memory is offered
to waiting work: :meth:`Leases.end` marks the lease ended and hands back
its hook; :meth:`Leases.complete` releases the reservation and records how
the hook went.

A lease may also carry a ``relieve`` hook: under sustained memory pressure
the relief ladder calls it once to ask the holder to end that turn now
(:meth:`Leases.ask_relief`).  Its state then says why it ended: ``relieved``,
whoever ends it, unless the relief was found to give nothing back first (a
failed hook, no memory back in time); its ``relieve_outcome`` says whether
the memory came back.

What a holder asks for is a :class:`~roomkeeper.guard.lease_terms.LeaseTerms`, declared
once; a lease holds its terms whole, beside what happened to it since.
:func:`lease_fields` and :func:`lease_of` turn a lease into one flat mapping of
field names and back: the shape of the journal's row and of the API's answer.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from roomkeeper.errors import AlreadyEndedError, QueueFullError, UnknownJobError, UsageError
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.rule import Decision

MAX_GRANTED = 256  # leases granted at once, all owners together
MAX_GRANTED_PER_OWNER = 64  # leases granted at once to one owner
KEEP_ENDED = 1000  # ended leases kept in memory; the journal keeps every one


class LeaseState(enum.Enum):
    """Where a lease stands."""

    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    RELIEVED = "relieved"  # ended after the ladder asked its holder to end the turn


RELIEVE_ASKED = "asked"  # a relieve outcome while its memory is awaited
NOT_RELIEVED = "not relieved"  # how an outcome that gave nothing back begins


@dataclass(frozen=True, slots=True)
class LeaseView:
    """A snapshot of one lease; times are wall-clock seconds.

    Attributes:
        id: the lease's id, the holder's or one made for it.
        terms: what it was granted with (its memory as reserved, its ttl as last renewed).
        state: where it stands.
        granted_at: when it was granted.
        expires_at: when it expires without a heartbeat.
        ended_at: when it ended.
        hook_outcome: how its release hook went (``due`` while a crash may have cut it).
        relieve_outcome: how its relief stands: None until asked, then :data:`RELIEVE_ASKED`,
            then what came of it.
    """

    id: str
    terms: LeaseTerms
    state: LeaseState
    granted_at: float
    expires_at: float
    ended_at: float | None = None
    hook_outcome: str | None = None
    relieve_outcome: str | None = None

    @property
    def relief_stands(self) -> bool:
        """Its holder was asked to end the turn, and that was not found to give nothing back:
        an end now is the relief's."""
        outcome = self.relieve_outcome
        return outcome is not None and not outcome.startswith(NOT_RELIEVED)


LEASE_FIELDS = (
    *(f.name for f in fields(LeaseView) if f.name != "terms"),
    *(f.name for f in fields(LeaseTerms)),
)
"""A lease's fields by name, flat: its own, then its terms' (no name is in both)."""


def lease_fields(lease: LeaseView) -> dict[str, Any]:
    """The lease as one flat mapping, each of :data:`LEASE_FIELDS` to its value."""
    own = {f.name: getattr(lease, f.name) for f in fields(LeaseView) if f.name != "terms"}
    return {**own, **{f.name: getattr(lease.terms, f.name) for f in fields(LeaseTerms)}}


def lease_of(values: Mapping[str, Any]) -> LeaseView:
    """The lease a flat mapping of :data:`LEASE_FIELDS` holds (:func:`lease_fields` undone)."""
    terms = LeaseTerms(**{f.name: values[f.name] for f in fields(LeaseTerms)})
    own = {f.name: values[f.name] for f in fields(LeaseView) if f.name != "terms"}
    return LeaseView(terms=terms, **own)


def guard_key(lease_id: str) -> str:
    """The guard's reservation key for a lease (kept apart from job ids)."""
    return f"lease:{lease_id}"


class Leases:
    """Every lease of this gateway run.

    Args:
        guard: the guard whose young reservations leases hold.
        clock: monotonic seconds (expiry).
        wall: wall-clock seconds (timestamps people read).
        max_granted: leases granted at once, in total.
        max_granted_per_owner: leases granted at once to one owner.
        keep_ended: ended leases remembered (the oldest are forgotten first).
    """

    def __init__(
        self,
        guard: Guard,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_granted: int = MAX_GRANTED,
        max_granted_per_owner: int = MAX_GRANTED_PER_OWNER,
        keep_ended: int = KEEP_ENDED,
    ) -> None:
        self._guard = guard
        self._max_granted = max_granted
        self._max_granted_per_owner = max_granted_per_owner
        self._keep_ended = keep_ended
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._leases: dict[str, LeaseView] = {}
        self._deadlines: dict[str, float] = {}  # monotonic expiry of granted leases
        self._ended: Counter[str] = Counter()
        self._without_hook = 0  # ended with no release hook: their sessions may stay
        # Ended, their release hooks not run yet: their sessions are still held.
        self._finishing: set[str] = set()
        self._completed: dict[str, None] = {}  # ended, hook run: oldest first

    def grant(self, lease_id: str, terms: LeaseTerms) -> tuple[LeaseView | None, Decision | None]:
        """Ask the guard for room for ``terms``; on a yes, hold it as a lease.

        Returns:
            (the lease, the decision); a lease that is already granted is
            returned again with no decision (a retried request).

        Raises:
            AlreadyEndedError: the id belongs to a lease that already ended.
            UsageError: a value is out of range.
            QueueFullError: ``leases_full`` or ``owner_leases_full``: a cap on granted
                leases is reached (the guard was not asked).
        """
        if not terms.ttl_s > 0:
            raise UsageError(f"ttl_s must be > 0 (got {terms.ttl_s})", name="ttl_s")
        with self._lock:
            existing = self._leases.get(lease_id)
            if existing is not None:
                if existing.state is LeaseState.GRANTED:
                    return existing, None
                raise AlreadyEndedError(
                    f"lease {lease_id!r} already ended ({existing.state.value}); use a new id",
                    lease_id=lease_id,
                )
            self._check_caps(terms.owner)
            decision = self._guard.admit(
                guard_key(lease_id), memory_bytes=terms.memory_bytes, disk_bytes=terms.disk_bytes
            )
            if not decision.admit:
                return None, decision
            if terms.memory_bytes is None:  # it holds what the guard reserved for it
                terms = replace(terms, memory_bytes=decision.estimate_bytes)
            now = self._wall()
            lease = LeaseView(lease_id, terms, LeaseState.GRANTED, now, now + terms.ttl_s)
            self._leases[lease_id] = lease
            self._deadlines[lease_id] = self._clock() + terms.ttl_s
            return lease, decision

    def _check_caps(self, owner: str) -> None:
        """Refuse a new grant past the caps on granted leases (lock held)."""
        granted = [v for v in self._leases.values() if v.state is LeaseState.GRANTED]
        if len(granted) >= self._max_granted:
            raise QueueFullError(
                f"{len(granted)} leases are granted, the most at once; "
                "release one or wait for one to end",
                reason="leases_full",
                owner=owner,
            )
        mine = sum(1 for v in granted if v.terms.owner == owner)
        if mine >= self._max_granted_per_owner:
            raise QueueFullError(
                f"owner {owner!r} holds {mine} granted leases, the most one owner may; "
                "release one of them first",
                reason="owner_leases_full",
                owner=owner,
            )

    def restore(self, lease: LeaseView) -> None:
        """Take back a lease granted before a restart, as the journal kept it, whole (the
        caller re-reserves its memory); it expires when it would have."""
        with self._lock:
            self._leases[lease.id] = lease
            self._deadlines[lease.id] = self._clock() + max(0.0, lease.expires_at - self._wall())

    def heartbeat(self, lease_id: str, ttl_s: float | None = None) -> LeaseView:
        """Extend a granted lease by its ttl (or a new one) from now.

        Raises:
            UnknownJobError: no such lease.
            AlreadyEndedError: the lease already ended.
        """
        with self._lock:
            lease = self._get(lease_id)
            if lease.state is not LeaseState.GRANTED:
                raise AlreadyEndedError(
                    f"lease {lease_id!r} already ended ({lease.state.value})", lease_id=lease_id
                )
            ttl = lease.terms.ttl_s if ttl_s is None else ttl_s
            if not ttl > 0:
                raise UsageError(f"ttl_s must be > 0 (got {ttl})", name="ttl_s")
            self._deadlines[lease_id] = self._clock() + ttl
            terms = replace(lease.terms, ttl_s=ttl)
            lease = replace(lease, terms=terms, expires_at=self._wall() + ttl)
            self._leases[lease_id] = lease
            return lease

    def withdraw(self, lease_id: str) -> None:
        """Undo a grant whose record could not be saved: the lease never was, its room is
        free again, and a retry of the same request is judged afresh."""
        with self._lock:  # the guard is told under it, as a grant asks it (no grant between)
            self._leases.pop(lease_id, None)
            self._deadlines.pop(lease_id, None)
            self._guard.release_shared(guard_key(lease_id), self._holding_keys())

    def end(self, lease_id: str, state: LeaseState = LeaseState.RELEASED) -> LeaseView | None:
        """Mark a granted lease ended; returns it (its hook still to run), None if it had ended.

        Raises:
            UnknownJobError: no such lease.
        """
        with self._lock:
            lease = self._get(lease_id)
            if lease.state is not LeaseState.GRANTED:
                return None
            if state is LeaseState.RELEASED and lease.relief_stands:
                state = LeaseState.RELIEVED  # its holder ended the turn because we asked
            lease = replace(lease, state=state, ended_at=self._wall())
            self._leases[lease_id] = lease
            self._deadlines.pop(lease_id, None)
            self._ended[state.value] += 1
            self._without_hook += lease.terms.release is None
            self._finishing.add(lease_id)
            return lease

    def ask_relief(self, lease_id: str) -> LeaseView | None:
        """Mark a granted lease's relief as asked (once ever); the lease, or None when it is
        not granted, carries no relieve hook, or was asked before."""
        with self._lock:
            lease = self._leases.get(lease_id)
            if (
                lease is None
                or lease.state is not LeaseState.GRANTED
                or lease.terms.relieve is None
                or lease.relieve_outcome is not None
            ):
                return None
            lease = replace(lease, relieve_outcome=RELIEVE_ASKED)
            self._leases[lease_id] = lease
            return lease

    def settle_relief(self, lease_id: str, outcome: str) -> LeaseView:
        """Record how the relief went (an outcome from :data:`NOT_RELIEVED` on means it gave
        nothing back)."""
        with self._lock:
            lease = replace(self._get(lease_id), relieve_outcome=outcome)
            self._leases[lease_id] = lease
            return lease

    def relievable(self) -> list[LeaseView]:
        """Granted leases with a relieve hook that was never called."""
        with self._lock:
            return [
                v
                for v in self._leases.values()
                if v.state is LeaseState.GRANTED
                and v.terms.relieve is not None
                and v.relieve_outcome is None
            ]

    def unrelievable(self) -> tuple[int, int]:
        """(granted leases the ladder cannot relieve now: no relieve hook, or asked already;
        what they reserve together)."""
        with self._lock:
            found = [
                v
                for v in self._leases.values()
                if v.state is LeaseState.GRANTED
                and (v.terms.relieve is None or v.relieve_outcome is not None)
            ]
            return len(found), sum(v.terms.memory_bytes or 0 for v in found)

    def reserved(self) -> int:
        """What our leases reserve together: the granted ones, and the ended ones whose release
        hook has not finished (their sessions are still held)."""
        with self._lock:
            return sum(v.terms.memory_bytes or 0 for v in self._holding())

    def complete(self, lease_id: str, hook_outcome: str | None) -> LeaseView:
        """After the hook ran: release the reservation and record how the hook went.

        The other leases that hold a reservation reserve their whole estimates again until
        their shares of the container's growth are told afresh: some of what they were
        told may be this lease's work
        (:meth:`~roomkeeper.guard.admission.Guard.release_shared`)."""
        with self._lock:  # the guard is told under it, as a grant asks it (no grant between)
            self._finishing.discard(lease_id)
            self._guard.release_shared(guard_key(lease_id), self._holding_keys())
            lease = replace(self._get(lease_id), hook_outcome=hook_outcome)
            self._leases[lease_id] = lease
            self._completed[lease_id] = None
            self._forget_oldest_ended()
            return lease

    def _holding_keys(self) -> list[str]:
        """The guard's keys of the leases that hold a reservation (lock held)."""
        return [guard_key(v.id) for v in self._holding()]

    def _holding(self) -> list[LeaseView]:
        """The granted leases, and the ended ones whose release hook has not finished: their
        reservations stand, and their sessions may still hold memory (lock held)."""
        return [
            v
            for v in self._leases.values()
            if v.state is LeaseState.GRANTED or v.id in self._finishing
        ]

    def holding(self) -> list[LeaseView]:
        """The leases that hold a reservation: granted, or ended with their release hook
        still to finish."""
        with self._lock:
            return self._holding()

    def _forget_oldest_ended(self) -> None:
        """Keep at most ``keep_ended`` completed leases, forgetting the oldest (lock held)."""
        while len(self._completed) > self._keep_ended:
            oldest = next(iter(self._completed))  # dicts keep insertion order
            del self._completed[oldest]
            self._leases.pop(oldest, None)

    def due(self) -> list[str]:
        """Ids of granted leases whose ttl has passed without a heartbeat."""
        now = self._clock()
        with self._lock:
            return [i for i, deadline in self._deadlines.items() if now >= deadline]

    def known(self, lease_id: str) -> bool:
        """Whether this run remembers the lease (granted, or ended within the window)."""
        with self._lock:
            return lease_id in self._leases

    def get(self, lease_id: str) -> LeaseView:
        """One lease.

        Raises:
            UnknownJobError: no such lease.
        """
        with self._lock:
            return self._get(lease_id)

    def views(self) -> list[LeaseView]:
        """Every lease of this run."""
        with self._lock:
            return list(self._leases.values())

    def counts(self) -> dict[str, int]:
        """How many leases are granted now, and how many ended each way."""
        with self._lock:
            granted = sum(1 for v in self._leases.values() if v.state is LeaseState.GRANTED)
            return {"granted": granted, **dict(self._ended)}

    def sessions(self) -> dict[str, dict[str, int]]:
        """Granted leases per agent session (those that named one): how many, and the memory
        they hold, so a person sees which session holds what."""
        found: dict[str, dict[str, int]] = {}
        with self._lock:
            for lease in self._leases.values():
                if lease.state is not LeaseState.GRANTED or lease.terms.session is None:
                    continue
                held = found.setdefault(lease.terms.session, {"leases": 0, "memory_bytes": 0})
                held["leases"] += 1
                held["memory_bytes"] += lease.terms.memory_bytes or 0
        return found

    def ended_without_hook(self) -> int:
        """Leases of this run that ended with no release hook (their sessions may stay)."""
        with self._lock:
            return self._without_hook

    def _get(self, lease_id: str) -> LeaseView:
        try:
            return self._leases[lease_id]
        except KeyError:
            raise UnknownJobError(f"no lease has the id {lease_id!r}", job_id=lease_id) from None

"""A lease's terms: what its holder asks for, declared once.

:class:`LeaseTerms` is the one declaration of a lease's asked-for fields.  The
lease in memory (:class:`~roomkeeper.guard.leases.LeaseView`) holds it whole,
the journal's row is written and read by its field names, and the API builds
it from the request by the same names; a test holds the API's models and the
journal's columns equal to it.  A new term is one field here, one in the
API's request and answer models, and its column's migration.
"""

from __future__ import annotations

from dataclasses import dataclass

from roomkeeper.loopback.hooks import ReleaseHook

DEFAULT_TTL_S = 300.0


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """What a lease's holder asks for.

    Once granted, the lease's terms say what it holds: ``memory_bytes`` is its
    reservation (the guard's estimate when none was asked), ``ttl_s`` the last
    heartbeat's.

    Attributes:
        owner: who holds it; the caps on granted leases count per owner.
        memory_bytes: the memory its turn is expected to take; the guard's default when None.
        disk_bytes: the disk its turn is expected to take; none asked when None.
        ttl_s: seconds it lives without a heartbeat.
        release: the call made when it ends, before its memory is offered to other work.
        relieve: the call the relief ladder may make, once, to ask its holder to end the
            turn now (sustained memory pressure).
        session: the agent session the turn belongs to (a Claude Code or Codex
            ``session_id``), so a person sees which session holds what; None when not told.
        kind: what sort of work the turn is (``agent-Explore``, ``build``): the memory its
            work gave back when it ended teaches the kind's learned size, as a job of that
            ``kind`` does, and a lease of the kind that asks no memory is reserved at it.
    """

    owner: str = "default"
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    ttl_s: float = DEFAULT_TTL_S
    release: ReleaseHook | None = None
    relieve: ReleaseHook | None = None
    session: str | None = None
    kind: str | None = None

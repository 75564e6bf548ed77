"""Leases are bounded: granted ones in total and per owner, ended ones remembered up to a cap."""

from __future__ import annotations

import pytest

from roomkeeper.errors import QueueFullError, UnknownJobError
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import Leases, LeaseState


def leases(**caps: int) -> Leases:
    """Leases over a guard that admits everything, so only the caps can refuse."""
    return Leases(Guard(env={"ROOMKEEPER_GUARD": "off"}), **caps)


def test_granted_leases_are_capped_in_total() -> None:
    """Past the total cap a grant is refused with ``leases_full``; an end makes room again."""
    book = leases(max_granted=3, max_granted_per_owner=3)
    for n in range(3):
        lease, _ = book.grant(f"l{n}", LeaseTerms(owner=f"o{n}", memory_bytes=0))
        assert lease is not None
    with pytest.raises(QueueFullError, match="3 leases are granted, the most at once") as err:
        book.grant("l3", LeaseTerms(owner="o3", memory_bytes=0))
    assert err.value.reason == "leases_full"
    book.end("l0")
    book.complete("l0", None)
    lease, _ = book.grant("l3", LeaseTerms(owner="o3", memory_bytes=0))
    assert lease is not None and lease.state is LeaseState.GRANTED


def test_granted_leases_are_capped_per_owner() -> None:
    """One owner past its cap is refused with ``owner_leases_full``; another owner is not."""
    book = leases(max_granted=10, max_granted_per_owner=2)
    book.grant("a1", LeaseTerms(owner="a", memory_bytes=0))
    book.grant("a2", LeaseTerms(owner="a", memory_bytes=0))
    with pytest.raises(QueueFullError, match="owner 'a' holds 2 granted leases") as err:
        book.grant("a3", LeaseTerms(owner="a", memory_bytes=0))
    assert err.value.reason == "owner_leases_full"
    lease, _ = book.grant("b1", LeaseTerms(owner="b", memory_bytes=0))
    assert lease is not None


def test_a_retried_grant_is_not_counted_against_the_cap() -> None:
    """Asking again for a granted id returns it, even when the caps are reached."""
    book = leases(max_granted=1, max_granted_per_owner=1)
    first, _ = book.grant("x", LeaseTerms(owner="a", memory_bytes=0))
    again, decision = book.grant("x", LeaseTerms(owner="a", memory_bytes=0))
    assert again == first and decision is None


def test_ended_leases_are_remembered_only_up_to_a_cap() -> None:
    """150 leases granted and released: only the newest ``keep_ended`` are still in memory."""
    book = leases(max_granted=10, max_granted_per_owner=10, keep_ended=20)
    for n in range(150):
        book.grant(f"l{n}", LeaseTerms(owner="a", memory_bytes=0))
        book.end(f"l{n}")
        book.complete(f"l{n}", "ok 204")
    kept = [v.id for v in book.views()]
    assert kept == [f"l{n}" for n in range(130, 150)]
    with pytest.raises(UnknownJobError):
        book.get("l0")
    assert book.counts()["released"] == 150

"""The refusals kept for the Health page: when, why, and whose work was refused.

The gateway keeps the latest :data:`REFUSALS_KEPT` in memory (nothing on
disk); its durable jobs and leases add to them, and ``GET /v1/feed`` shows
them, newest first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from roomkeeper.guard.rule import Decision, Word

REFUSALS_KEPT = 20


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal of the guard, as the Health page lists it.

    Attributes:
        at: when it was refused (``time.time()``).
        reason: why (the guard's reason, or the cluster's or the scheduler's word).
        summary: the guard's numbers, in words (under 200 characters, no path).
        subject: the id of the job or lease that was refused.
    """

    at: float
    reason: Word
    summary: str
    subject: str

    @classmethod
    def of(cls, decision: Decision, subject: str, *, at: float | None = None) -> Refusal:
        """The refusal ``decision`` gave ``subject`` (a job or lease id), at ``at`` or now."""
        return cls(
            at=time.time() if at is None else at,
            reason=decision.reason,
            summary=decision.summary,
            subject=subject,
        )

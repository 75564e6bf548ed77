"""Registered calls: a client's own side-effecting tool calls, with roomkeeper's save-first promise.

A client registers a call before it dispatches it (``POST /v1/calls``); the
answer comes only once a durable pending marker is written.  Only a persisted
outcome clears the marker (``succeeded`` or ``failed``).  No kind is assumed
read-only: every registered call is marked, whatever its kind.  A result that
arrives after the call was cancelled cannot retire its marker, and a failed
step stays a failure.  After a crash, a pending call is ``uncertain`` until a
person or the client resolves it.  Each request waits for its save within the
save deadline (:mod:`~roomkeeper.gateway.persistence`).
"""

from __future__ import annotations

import concurrent.futures
import enum
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from roomkeeper.errors import CallStateError, NotEndedError, UnknownJobError
from roomkeeper.gateway.persistence import FREE_SPACE, saved
from roomkeeper.journal.calls import CallRow
from roomkeeper.journal.database import Journal


class CallState(enum.Enum):
    """Where a registered call stands."""

    PENDING = "pending"  # dispatched, outcome not yet saved
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # its marker stays: what it did is unknown
    UNCERTAIN = "uncertain"  # pending when the gateway died


@dataclass(frozen=True, slots=True)
class CallView:
    """A registered call as the API shows it."""

    id: str
    kind: str
    owner: str
    resumable: bool
    state: CallState
    created_at: float
    ended_at: float | None
    numbers: Mapping[str, float]
    error: str | None
    pending_marker: bool

    def to_json(self) -> dict[str, Any]:
        """The API's JSON form."""
        return {
            "id": self.id,
            "kind": self.kind,
            "owner": self.owner,
            "resumable": self.resumable,
            "state": self.state.value,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "numbers": dict(self.numbers),
            "error": self.error,
            "pending_marker": self.pending_marker,
        }


_T = TypeVar("_T")


class Calls:
    """Registered calls, kept in the journal (every method waits for durability).

    Args:
        journal: where the calls are kept.
        watch: told of every journal write, to report one that fails.
    """

    def __init__(
        self, journal: Journal, *, watch: Callable[[concurrent.futures.Future[Any]], None]
    ) -> None:
        self._journal = journal
        self._watch = watch

    def _saved(self, write: concurrent.futures.Future[_T], what: str, then: str) -> _T:
        """Wait for ``write`` within the save deadline; watched, so a failure is reported.

        Raises:
            PersistenceError: the journal refused it.
            SaveTimeoutError: the journal did not answer in time.
        """
        self._watch(write)
        return saved(write, what, then=f"{then}; {FREE_SPACE}")

    def register(self, kind: str, owner: str, *, resumable: bool = False) -> CallView:
        """Write the call and its pending marker durably, in one transaction.

        Raises:
            PersistenceError: not saved, so not registered.
            SaveTimeoutError: the journal did not answer in time: the call may be registered
                once it does, under the id the message names.
        """
        call_id = uuid.uuid4().hex[:16]
        write = self._journal.register_call(
            call_id, kind=kind, owner=owner, resumable=resumable, at=time.time()
        )
        self._saved(
            write,
            f"call {call_id!r}",
            "do not dispatch it; if GET /v1/calls/ID finds it later, cancel or resolve it",
        )
        return self.get(call_id)

    def outcome(
        self,
        call_id: str,
        *,
        succeeded: bool,
        numbers: Mapping[str, float] | None = None,
        error: str | None = None,
    ) -> CallView:
        """Save the call's outcome and only then clear its marker.

        Raises:
            CallStateError: the call is not pending (a late result after a
                cancel cannot retire its marker), or a success came with error text.
        """
        if succeeded and error:
            raise CallStateError(
                "a succeeded outcome carries no error text; report it as failed", call_id=call_id
            )
        call = self.get(call_id)
        if call.state is not CallState.PENDING:
            raise CallStateError(
                f"call {call_id!r} is {call.state.value}: a result arriving now cannot retire "
                "its pending marker"
                + ("; resolve it instead" if call.state is CallState.UNCERTAIN else ""),
                call_id=call_id,
            )
        state = CallState.SUCCEEDED if succeeded else CallState.FAILED
        if not self._settle(call_id, state, numbers, error, only_from=(CallState.PENDING,)):
            raise CallStateError(
                f"call {call_id!r} changed while its result arrived (cancelled?): "
                "the result cannot retire its pending marker",
                call_id=call_id,
            )
        return self.get(call_id)

    def cancel(self, call_id: str) -> CallView:
        """Cancel a pending call; its marker stays, since what it did is unknown."""
        call = self.get(call_id)
        if call.state is CallState.PENDING:
            write = self._journal.cancel_call(call_id, at=time.time())
            self._saved(write, f"call {call_id!r}'s cancel", "ask again")
        return self.get(call_id)

    def remove(self, call_id: str) -> None:
        """Forget a call whose outcome is saved (succeeded or failed).

        Raises:
            UnknownJobError: no call has that id.
            NotEndedError: ``not_ended`` while it is pending, ``in_doubt`` while it is
                uncertain or cancelled (what it did is unknown: resolve it first).
        """
        call = self.get(call_id)
        if call.state is CallState.PENDING:
            raise NotEndedError(
                f"call {call_id!r} is pending: save its outcome (POST /v1/calls/{call_id}/outcome)"
                f" or cancel it (POST /v1/calls/{call_id}/cancel) first",
                work_id=call_id,
                reason="not_ended",
            )
        if call.state in (CallState.UNCERTAIN, CallState.CANCELLED):
            raise NotEndedError(
                f"call {call_id!r} is {call.state.value}: what it did is not known; resolve it "
                f"first (POST /v1/calls/{call_id}/resolve)",
                work_id=call_id,
                reason="in_doubt",
            )
        write = self._journal.forget_call(call_id)
        if not self._saved(write, f"call {call_id!r}'s removal", "ask again"):
            raise CallStateError(
                f"call {call_id!r} changed while it was being removed", call_id=call_id
            )

    def resolve(self, call_id: str, resolution: str) -> CallView:
        """A person or the client settles an uncertain call: succeeded, failed, or rerun.

        Raises:
            CallStateError: the call is not uncertain.
        """
        call = self.get(call_id)
        settleable = (
            CallState.UNCERTAIN,
            CallState.CANCELLED,
        )  # a cancelled call's effect is unknown too
        if call.state not in settleable or (
            resolution == "rerun" and call.state is not CallState.UNCERTAIN
        ):
            raise CallStateError(
                f"call {call_id!r} is {call.state.value}: only uncertain calls can be rerun, "
                "and uncertain or cancelled ones settled",
                call_id=call_id,
            )
        if resolution == "rerun":  # pending again, under a fresh marker
            write = self._journal.rerun_call(call_id, at=time.time())
            self._saved(write, f"call {call_id!r}'s rerun", "ask again")
        else:
            state = CallState.SUCCEEDED if resolution == "succeeded" else CallState.FAILED
            if not self._settle(call_id, state, None, None, only_from=settleable):
                raise CallStateError(
                    f"call {call_id!r} changed while it was being resolved", call_id=call_id
                )
        return self.get(call_id)

    def _settle(
        self,
        call_id: str,
        state: CallState,
        numbers: Mapping[str, float] | None,
        error: str | None,
        *,
        only_from: tuple[CallState, ...],
    ) -> bool:
        """Save the outcome and clear the marker in one transaction; False if the state moved."""
        write = self._journal.settle_call(
            call_id,
            state=state.value,
            numbers=numbers,
            error=error,
            only_from=[s.value for s in only_from],
            at=time.time(),
        )
        return self._saved(write, f"call {call_id!r}'s outcome", "its marker stays; ask again")

    def get(self, call_id: str) -> CallView:
        """One call.

        Raises:
            UnknownJobError: no call has that id.
        """
        row = self._journal.call(call_id)
        if row is None:
            raise UnknownJobError(f"no call has the id {call_id!r}", job_id=call_id)
        return _view(row)

    def list(self, *, state: str | None = None) -> list[CallView]:
        """Calls, newest first, optionally in one state."""
        return [_view(row) for row in self._journal.calls(state=state)]


def _view(row: CallRow) -> CallView:
    return CallView(
        id=row.id,
        kind=row.kind,
        owner=row.owner,
        resumable=row.resumable,
        state=CallState(row.state),
        created_at=row.created_at,
        ended_at=row.ended_at,
        numbers=row.numbers,
        error=row.error,
        pending_marker=row.pending_marker,
    )

"""The gateway's leases as the relief ladder may relieve them.

A lease admits a turn that runs in another process; when that turn grows far
past its lease, only the container's headroom protects everything else.  A
holder that gives a ``relieve`` hook (a loopback call, like ``release``)
lets the ladder ask it to end the turn now.  :class:`LeaseRelief` is the
pressure monitor's :class:`~roomkeeper.relief.monitor.LeaseTarget`: it lists
the leases that may be relieved, calls a hook once (keyed ``relieve-<id>``),
and records how it went: in the lease (its ``relieve_outcome``), in the
journal and in the recovery history (numbers only).  A lease counted relieved
ends ``relieved`` if its holder has not ended it already, so its holder sees
why.

Once means once: the ask is saved before the call is made (a restart never
calls it again; a lease whose ask was saved and never judged is found not
relieved at the next start), and reliefs have a pool of their own, so a
call never waits behind hung release hooks and fires after its relief was
given up.  It runs on the monitor's thread; the end of a lease belongs to
the event loop, so it is handed there (``end``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from roomkeeper.gateway.leases import DurableLeases
from roomkeeper.guard.leases import RELIEVE_ASKED, LeaseState
from roomkeeper.journal.database import Journal
from roomkeeper.journal.history import HistoryEvent, RecoveryCode
from roomkeeper.loopback.hook_calls import run_hook
from roomkeeper.loopback.hooks import ReleaseHook
from roomkeeper.relief.ladder import Live

log = logging.getLogger("roomkeeper")

RELIEF_WORKERS = 2  # relieve hooks called at once (one victim at a time: one, then a late one)
SAVE_BEFORE_CALL_S = 2.0  # the ask must be saved within this, or the hook is not called


class LeaseRelief:
    """Relieves the gateway's leases for the pressure monitor.

    Args:
        leases: the durable leases.
        journal: where the relief's outcome and its history event go.
        watch: told of every journal write, to report one that fails.
        end: ends a lease that was relieved (on the event loop), given its id.
        clock: the monitor's monotonic seconds (a lease's age is told on it).
        wall: wall-clock seconds (leases are granted on it).
    """

    def __init__(
        self,
        *,
        leases: DurableLeases,
        journal: Journal,
        watch: Callable[[concurrent.futures.Future[None]], None],
        end: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._leases = leases.leases
        self._journal = journal
        self._watch = watch
        self._end = end
        self._clock = clock
        self._wall = wall
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=RELIEF_WORKERS, thread_name_prefix="roomkeeper-relieve"
        )

    def relievable(self) -> list[Live]:
        """Granted leases whose relieve hook was never called, as the ladder ranks work."""
        offset = self._clock() - self._wall()  # a wall time on the monitor's clock
        return [
            Live(
                job_id=v.id,
                started=v.granted_at + offset,
                footprint=0,  # its turn runs elsewhere: never measured here
                estimate=v.terms.memory_bytes or 0,
                suspendable=False,
                lease=True,
            )
            for v in self._leases.relievable()
        ]

    def unrelievable(self) -> tuple[int, int]:
        """Granted leases without a relieve hook, and what they reserve."""
        return self._leases.unrelievable()

    def relieve(self, lease_id: str, why: str) -> concurrent.futures.Future[str] | None:
        """Call the lease's relieve hook once, on the reliefs' own pool, after the ask is
        saved; None when it cannot be relieved now."""
        lease = self._leases.ask_relief(lease_id)
        if lease is None or lease.terms.relieve is None:
            return None
        hook = replace(lease.terms.relieve, key=f"relieve-{lease_id}")
        return self._pool.submit(self._call, lease_id, hook)

    def _call(self, lease_id: str, hook: ReleaseHook) -> str:
        """Save the ask, then make the call; its outcome in words."""
        write = self._journal.record_relieve(lease_id, RELIEVE_ASKED)
        try:
            saved = write.result(timeout=SAVE_BEFORE_CALL_S)
        except Exception as err:  # not saved: a restart could not know it was made
            return f"failed: the ask could not be saved ({type(err).__name__})"
        if not saved:  # asked the moment it was granted, before its row was written
            return "failed: the lease was not saved yet"
        return run_hook(hook)

    def settle(self, lease_id: str, relieved: bool, outcome: str, freed: int) -> None:
        """Record how the relief went; end a relieved lease its holder has not ended yet."""
        lease = self._leases.settle_relief(lease_id, outcome)
        self._journal.record_relieve(lease_id, outcome)  # a lost outcome: "asked" at restart
        code = RecoveryCode.LEASE_RELIEVED if relieved else RecoveryCode.LEASE_NOT_RELIEVED
        numbers = {"freed_bytes": freed, "lease_bytes": lease.terms.memory_bytes or 0}
        self._watch(self._journal.record_history(HistoryEvent(self._wall(), code, numbers)))
        if relieved and lease.state is LeaseState.GRANTED:
            self._end(lease_id)

    def close(self) -> None:
        """Let a call in flight end (within its deadline); make no new one."""
        self._pool.shutdown(wait=True, cancel_futures=True)

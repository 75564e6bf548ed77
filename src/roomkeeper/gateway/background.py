"""What the gateway runs on its event loop while it serves, until it shuts down.

Beside the loops its parts bring (the Health page's chart, the baseline, the
supervisor's heartbeats), the gateway's own: lease expiry, the release hooks
owed since before this start, and the resume loop, which every
:data:`RESUME_CHECK_S` resumes the next deferred job (while nothing holds
automatic work), catches up on what a full disk refused at start (the
expiry of leases past their ttl among it), and saves again each job and
lease change that could not be saved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from roomkeeper.errors import say_failure_once
from roomkeeper.gateway.doubt import WorkInDoubt
from roomkeeper.gateway.jobs import DurableJobs
from roomkeeper.gateway.leases import DurableLeases
from roomkeeper.gateway.startup import Startup

RESUME_CHECK_S = 0.5


class Background:
    """The gateway's tasks: started together when it serves, stopped together at shutdown.

    Args:
        startup: what a full disk left owed at start, and the hooks owed since before.
        jobs: whose unsaved changes are saved again, and whose owed hooks are made.
        leases: whose expiry runs, whose owed hooks are made, and whose unsaved changes are
            saved again.
        doubt: resumes the next deferred job.
        may_resume: whether nothing holds automatic work now (closing, a journal that
            cannot save, recovery mode).
    """

    def __init__(
        self,
        *,
        startup: Startup,
        jobs: DurableJobs,
        leases: DurableLeases,
        doubt: WorkInDoubt,
        may_resume: Callable[[], bool],
    ) -> None:
        self._startup = startup
        self._jobs = jobs
        self._leases = leases
        self._doubt = doubt
        self._may_resume = may_resume
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, *loops: Coroutine[Any, Any, None]) -> None:
        """Start ``loops`` (the parts' own) and the gateway's, as tasks on the running loop."""
        self._tasks += [asyncio.create_task(loop) for loop in loops]
        self._tasks += [
            asyncio.create_task(self._leases.expiry_loop()),
            asyncio.create_task(self._leases.run_due_hooks()),
            asyncio.create_task(self._jobs.hooks.run_due(self._startup.hooks_due)),
            asyncio.create_task(self._resume_loop()),
        ]

    def adopt(self, tasks: list[asyncio.Task[None]]) -> None:
        """Tasks started elsewhere (the supervisor's heartbeats), stopped with these."""
        self._tasks += tasks

    async def stop(self) -> None:
        """Cancel every task and wait until each has ended."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def resume_next(self) -> str | None:
        """Resume the oldest deferred job if none is resuming now (one at a time)."""
        if not self._may_resume():
            return None  # recovery mode holds automatic resumption
        return self._doubt.resume_next()

    async def _resume_loop(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.resume_next)
            except Exception as err:  # the loop must go on: said once, tried again
                say_failure_once("resuming deferred work", err)
            await self._startup.catch_up()
            try:
                self._leases.save_owed()  # on the loop: in order with the leases' own changes
            except Exception as err:
                say_failure_once("saving unsaved lease changes again", err)
            if self._jobs.unsaved:
                try:
                    await asyncio.to_thread(self._jobs.retry_unsaved)
                except Exception as err:
                    say_failure_once("saving unsaved job changes again", err)
            await asyncio.sleep(RESUME_CHECK_S)

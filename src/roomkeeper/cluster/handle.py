"""The gateway's side of one job on a Ray node: a :class:`~roomkeeper.jobs.book.Handle`.

The scheduler polls it like a local tree (it has no local pid, so no
pidfd: the scheduler's loop polls every 50 ms).  Its life, driven by
:meth:`RayHandle.poll`, never blocking:

1. ``begin`` is pending while Ray places the runner actor and the node's
   guard judges the job.
2. Refused by the node's guard: the poll ends with a :class:`Settlement`
   ``REFUSED`` and the scheduler puts the job back in line.  Admitted: the
   node's answer (node, remote pid, headroom) is told to the backend, and
   ``finish`` is asked.
3. ``finish`` resolves: the output goes into the job's log file here, and
   the exit status is the poll's.  The actor dies instead (node lost, worker
   killed): ``LOST``, and the scheduler makes the job ``uncertain``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from roomkeeper.cluster.node import Begun, Finished, NodeJob
from roomkeeper.guard.rule import Reason
from roomkeeper.jobs.book import RemoteEnd, Settlement
from roomkeeper.jobs.spec import MemoryPeak, PeakMethod

log = logging.getLogger("roomkeeper")

ENDED_CODE = -1  # the poll's value for a job that ended without a status of its own
CALL_TIMEOUT_S = 30.0  # for a stop call to a live actor, beyond its grace


class RayHandle:
    """One job's runner actor on the cluster, as the scheduler sees it.

    Args:
        ray: the ``ray`` module.
        actor: the job's :class:`~roomkeeper.cluster.node.NodeRunner` actor.
        job: what was sent.
        log_path: the job's log file here, which receives its output.
        on_begun: told once the node started the job (the backend's per-node table).
        on_closed: told when the handle is closed.
    """

    def __init__(
        self,
        ray: ModuleType,
        actor: Any,
        job: NodeJob,
        *,
        log_path: str,
        on_begun: Callable[[str, Begun], None],
        on_closed: Callable[[str], None],
    ) -> None:
        self._ray, self._actor, self._job = ray, actor, job
        self._log_path = log_path
        self._on_begun, self._on_closed = on_begun, on_closed
        self._lock = threading.Lock()
        self._begin_ref: Any = actor.begin.remote(job)
        self._finish_ref: Any = None
        self._code: int | None = None
        self._settled: Settlement | None = None
        self._peak: MemoryPeak | None = None
        self.begun: Begun | None = None

    @property
    def pid(self) -> int | None:
        """None: the tree runs on another machine (its pid there is ``begun.pid``)."""
        return None

    def poll(self) -> int | None:
        """The job's exit status once it ended (ENDED_CODE when it has a settlement)."""
        with self._lock:
            if self._code is not None:
                return self._code
            if self._finish_ref is None:
                self._poll_begin()
            else:
                self._poll_finish()
            return self._code

    def _ready(self, ref: Any) -> bool:
        ready, _ = self._ray.wait([ref], timeout=0)
        return bool(ready)

    def _poll_begin(self) -> None:
        if not self._ready(self._begin_ref):
            return
        try:
            begun: Begun = self._ray.get(self._begin_ref)
        except Exception as err:
            self._lost(err, "before it was known to have started")
            return
        if not begun.admitted:
            end = RemoteEnd.FAILED if begun.error else RemoteEnd.REFUSED
            reason = None if begun.error else _reason(begun.reason)
            where = f"node {begun.host} ({begun.node_id[:12]})"
            self._settle(Settlement(end, reason, f"{where}: {begun.summary}"))
            return
        self.begun = begun
        self._on_begun(self._job.job_id, begun)
        self._finish_ref = self._actor.finish.remote()

    def _poll_finish(self) -> None:
        if not self._ready(self._finish_ref):
            return
        try:
            finished: Finished = self._ray.get(self._finish_ref)
        except Exception as err:
            self._lost(err, "mid-job")
            return
        with open(self._log_path, "ab") as out:
            out.write(finished.output)
        if finished.peak_bytes is not None and finished.peak_method is not None:
            self._peak = MemoryPeak(finished.peak_bytes, PeakMethod(finished.peak_method))
        self._code = finished.exit_code

    def _lost(self, err: Exception, when: str) -> None:
        where = "" if self.begun is None else f" on node {self.begun.host}"
        kind = type(err).__name__
        summary = f"the Ray node{where} or its runner was lost {when} ({kind}); never re-run"
        log.warning("job %s: %s: %s", self._job.job_id, summary, err)
        self._settle(Settlement(RemoteEnd.LOST, None, summary))

    def _settle(self, settled: Settlement) -> None:
        self._settled, self._code = settled, ENDED_CODE

    def settlement(self) -> Settlement | None:
        """How it ended when not by itself: refused, lost, or failed to start; else None."""
        with self._lock:
            return self._settled

    def footprint_bytes(self) -> int:
        """Its estimate: the tree is measured on its node, by the node's guard."""
        return self._job.memory_bytes

    def peak(self) -> MemoryPeak:
        """The tree's peak, as the node measured it.

        Raises:
            LookupError: the node measured none (the scheduler then records none).
        """
        if self._peak is None:
            raise LookupError(f"no peak came back for job {self._job.job_id}")
        return self._peak

    def stop(self, grace: float = 5.0) -> int | None:
        """Stop the remote tree (SIGTERM, ``grace``, SIGKILL); one not started yet never starts.

        A runner Ray has not placed within ``grace`` is ended instead: the
        poll then settles it as lost, and the scheduler, which asked for the
        stop, records the stop (a tree it may have started dies with its
        runner's lifeline).
        """
        with contextlib.suppress(Exception):
            ready, _ = self._ray.wait([self._begin_ref], timeout=grace)
            if not ready:
                self._ray.kill(self._actor, no_restart=True)
                return None
            self._ray.get(self._actor.stop.remote(grace), timeout=grace + CALL_TIMEOUT_S)
        return None

    def close(self) -> None:
        """End the actor, so its resources go back to Ray (``finish`` cleaned up the node)."""
        with contextlib.suppress(Exception):
            self._ray.kill(self._actor, no_restart=True)
        self._on_closed(self._job.job_id)


def _reason(value: str) -> Reason:
    try:
        return Reason(value)
    except ValueError:
        return Reason.UNKNOWN

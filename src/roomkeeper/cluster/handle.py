"""The gateway's side of one job on a Ray node: a :class:`~roomkeeper.jobs.book.Handle`.

The scheduler polls it like a local tree (it has no local pid, so no
pidfd: the scheduler's loop polls every 50 ms).  The job is one streaming
Ray task (:func:`roomkeeper.cluster.node.run_job`); :meth:`RayHandle.poll`
reads its answers as they come, never blocking:

1. Nothing yet while Ray places the task and the node's guard judges the job.
2. Refused by the node's guard: the poll ends with a :class:`Settlement`
   ``REFUSED`` and the scheduler puts the job back in line.  Admitted: the
   node's answer (node, remote pid, headroom) is told to the backend.
3. The tree ended: its output goes into the job's log file here, and its
   exit status is the poll's.  The task failed instead (node lost, worker
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
from roomkeeper.errors import SuspendError
from roomkeeper.guard.rule import Reason
from roomkeeper.jobs.book import RemoteEnd, Settlement
from roomkeeper.trees.peaks import MemoryPeak, PeakMethod

log = logging.getLogger("roomkeeper")

ENDED_CODE = -1  # the poll's value for a job that ended without a status of its own


class RayHandle:
    """One job's task on the cluster, as the scheduler sees it.

    Args:
        ray: the ``ray`` module.
        answers: the task's streaming answers (an ``ObjectRefGenerator``).
        job: what was sent.
        log_path: the job's log file here, which receives its output.
        on_begun: told once the node started the job (the backend's per-node table).
        on_closed: told when the handle is closed.
    """

    def __init__(
        self,
        ray: ModuleType,
        answers: Any,
        job: NodeJob,
        *,
        log_path: str,
        on_begun: Callable[[str, Begun], None],
        on_closed: Callable[[str], None],
    ) -> None:
        self._ray, self._answers, self._job = ray, answers, job
        self._log_path = log_path
        self._on_begun, self._on_closed = on_begun, on_closed
        self._lock = threading.Lock()
        self._code: int | None = None
        self._settled: Settlement | None = None
        self._peak: MemoryPeak | None = None
        self._stop_asked = False
        self.begun: Begun | None = None

    @property
    def pid(self) -> int | None:
        """None: the tree runs on another machine (its pid there is ``begun.pid``)."""
        return None

    def poll(self) -> int | None:
        """The job's exit status once it ended (ENDED_CODE when it has a settlement)."""
        with self._lock:
            if self._code is None:
                self._read()
            return self._code

    def _read(self) -> None:
        """Take the task's next answer if it has come, or its failure if it failed."""
        try:
            if self._answers.next_ready():
                answer = self._ray.get(next(self._answers))
            elif self._ready(self._answers.completed()):
                self._ray.get(self._answers.completed())  # raises the task's failure
                answer = None  # ended without a last answer: cannot happen, treated as lost
            else:
                return
        except Exception as err:
            self._lost(err)
            return
        if isinstance(answer, Begun):
            self._begun(answer)
        elif isinstance(answer, Finished):
            self._finished(answer)
        else:
            self._lost(LookupError("the node's runner ended without an answer"))

    def _ready(self, ref: Any) -> bool:
        ready, _ = self._ray.wait([ref], timeout=0)
        return bool(ready)

    def _begun(self, begun: Begun) -> None:
        if not begun.admitted:
            end = RemoteEnd.FAILED if begun.error else RemoteEnd.REFUSED
            reason = None if begun.error else _reason(begun.reason)
            where = f"node {begun.host} ({begun.node_id[:12]})"
            self._settle(Settlement(end, reason, f"{where}: {begun.summary}"))
            return
        self.begun = begun
        self._on_begun(self._job.job_id, begun)

    def _finished(self, finished: Finished) -> None:
        with open(self._log_path, "ab") as out:
            out.write(finished.output)
        if finished.peak_bytes is not None and finished.peak_method is not None:
            self._peak = MemoryPeak(finished.peak_bytes, PeakMethod(finished.peak_method))
        if finished.timed_out:
            # The node's timer can fire before the gateway's round stops it at the same
            # deadline: either way it timed out, never "exited" with the signal's status.
            log.info("job %s: its node stopped it at its deadline", self._job.job_id)
            self._settle(Settlement(RemoteEnd.DEADLINE, None, "stopped at its deadline"))
            return
        self._code = finished.exit_code

    def _lost(self, err: Exception) -> None:
        if self._stop_asked:  # our own cancel ended the task: not a loss
            summary = "stopped: its Ray task was cancelled, and the node stopped its whole tree"
            self._settle(Settlement(RemoteEnd.LOST, None, summary))
            return
        where = "" if self.begun is None else f" on node {self.begun.host}"
        when = "before it was known to have started" if self.begun is None else "mid-job"
        kind = type(err).__name__
        summary = f"the Ray node{where} or its worker was lost {when} ({kind}); never re-run"
        log.warning("job %s: %s: %s", self._job.job_id, summary, err)
        self._settle(Settlement(RemoteEnd.LOST, None, summary))

    def _settle(self, settled: Settlement) -> None:
        self._settled, self._code = settled, ENDED_CODE

    def settlement(self) -> Settlement | None:
        """How it ended when not by itself: refused, lost, or failed to start; else None."""
        with self._lock:
            return self._settled

    @property
    def suspendable(self) -> bool:
        """Never: the tree runs on another machine, where its node's guard watches it."""
        return False

    def halt(self) -> None:
        """Nothing: a tree on another machine is never suspended from here."""

    def suspend(self, *, timeout: float = 0.0) -> object:
        """A tree on another machine cannot be suspended from here.

        Raises:
            SuspendError: always.
        """
        raise SuspendError(self._job.job_id, "it runs on another machine of the Ray cluster")

    def resume(self) -> object:
        """A tree on another machine is never suspended from here, so never resumed.

        Raises:
            SuspendError: always.
        """
        raise SuspendError(self._job.job_id, "it runs on another machine of the Ray cluster")

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
        """Cancel the task: a queued one never starts, a running one stops its whole tree.

        The node stops the tree with the job's ``stop_grace_s`` (SIGTERM, then
        SIGKILL); the poll then settles it, and the scheduler records the stop.
        """
        self._stop_asked = True
        with contextlib.suppress(Exception):
            self._ray.cancel(self._answers)
        return None

    def close(self) -> None:
        """Forget the job in the backend's per-node table."""
        self._on_closed(self._job.job_id)


def _reason(value: str) -> Reason:
    try:
        return Reason(value)
    except ValueError:
        return Reason.UNKNOWN

"""The gateway's side of one job on a Ray node: a :class:`~roomkeeper.jobs.handle.Handle`.

The scheduler polls it like a local tree (it has no local pid, so no
pidfd: the scheduler's loop polls every 50 ms), with its lock held; so a
poll only reads what the handle's own thread has found, and never calls
Ray.  That thread sends the job (one streaming Ray task,
:func:`roomkeeper.cluster.node.run_job`) and reads its answers as they
come, blocking in Ray as long as Ray takes, under no lock of the scheduler's:

1. Nothing yet while Ray places the task and the node's guard judges the job.
2. Refused by the node's guard: the poll ends with a :class:`Settlement`
   ``REFUSED`` and the scheduler puts the job back in line.  Admitted: the
   node's answer (node, remote pid, headroom) is told to the backend, and
   the job's log file here is created (0600).
3. While the tree runs, its output comes in bounded pieces as it is written,
   each appended to the job's log here as it arrives
   (:mod:`roomkeeper.cluster.output`), so its output shows while it runs.
4. The tree ended and every piece has come: its exit status is the poll's
   (its deadline passed on the node: ``DEADLINE``).  The task failed instead
   (node lost, worker killed): ``LOST``, and the scheduler makes the job
   ``uncertain``.

A stop cancels the task from a thread of its own, so a node slow to stop
its tree holds nothing here; the job ends when the node says it has.  Ray
drops a cancelled task's answers, so the output the stream did not bring is
then fetched from the node (from the offset reached) before the job ends:
what a stopped job wrote is kept.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from roomkeeper.cluster.node import Begun, Finished, NodeJob
from roomkeeper.cluster.output import LogAppender, Output
from roomkeeper.errors import SuspendError, say_failure_once
from roomkeeper.guard.rule import Reason, Word
from roomkeeper.jobs.handle import RemoteEnd, Settlement
from roomkeeper.processes.peaks import MemoryPeak, PeakMethod
from roomkeeper.relief.ladder import PressureReason

log = logging.getLogger("roomkeeper")

ENDED_CODE = -1  # the poll's value for a job that ended without a status of its own
FORCE_AFTER_S = 10.0  # after the node's stop grace: a cancel not carried out is forced
COLLECT_IDLE_S = 60.0  # a stopped job's output: no further piece for this long, it is given up


class RayHandle:
    """One job's task on the cluster, as the scheduler sees it.

    Args:
        ray: the ``ray`` module.
        send: sends the task and gives its streaming answers (an ``ObjectRefGenerator``);
            called on the handle's own thread.
        job: what is sent.
        log_path: the job's log file here, which receives its output.
        on_begun: told once the node started the job (the backend's per-node table).
        on_closed: told when the handle is closed.
        collect: sends the task that fetches a stopped job's output from its node
            (node id, output directory, offset, seconds to wait for the tree to
            stop) and gives its streaming answers; called on the handle's own thread.
    """

    def __init__(
        self,
        ray: ModuleType,
        send: Callable[[], Any],
        job: NodeJob,
        *,
        log_path: str,
        on_begun: Callable[[str, Begun], None],
        on_closed: Callable[[str], None],
        collect: Callable[[str, str, int, float], Any],
    ) -> None:
        self._ray, self._send, self._job = ray, send, job
        self._log = LogAppender(log_path, job.job_id)
        self._on_begun, self._on_closed = on_begun, on_closed
        self._collect = collect
        self._lock = threading.Lock()
        self._answers: Any = None
        self._code: int | None = None
        self._settled: Settlement | None = None
        self._peak: MemoryPeak | None = None
        self._stop_asked = False
        self._answered = threading.Event()  # set once the task's answers have ended
        self.begun: Begun | None = None
        self._thread = threading.Thread(
            target=self._follow, name=f"ray-job-{job.job_id}", daemon=True
        )
        self._thread.start()

    @property
    def pid(self) -> int | None:
        """None: the tree runs on another machine (its pid there is ``begun.pid``)."""
        return None

    def poll(self) -> int | None:
        """The job's exit status once it ended (ENDED_CODE when it has a settlement)."""
        with self._lock:
            return self._code

    def _follow(self) -> None:
        """Send the task, then take its answers until its last (this handle's thread)."""
        try:
            self._follow_answers()
        except Exception as err:
            with self._lock:
                if self._code is None:
                    self._lost(err)
        finally:
            self._answered.set()
            self._log.close()

    def _follow_answers(self) -> None:
        with self._lock:
            if self._stop_asked:  # stopped before it was sent: it never started
                summary = "stopped before it was sent to the cluster"
                self._settle(Settlement(RemoteEnd.REFUSED, None, summary))
                return
        try:
            answers = self._send()
        except Exception as err:  # never sent, so never ran: it failed to start
            log.warning("job %s could not be sent to the Ray cluster: %s", self._job.job_id, err)
            summary = f"not started: it could not be sent to the Ray cluster ({err})"
            with self._lock:
                self._settle(Settlement(RemoteEnd.FAILED, None, summary))
            return
        with self._lock:
            self._answers = answers
            cancel = self._stop_asked
        if cancel:
            self._cancel(answers)
        ended = self._take_answers(answers)
        if ended is None:
            return
        self._answered.set()  # no forced cancel waits for the collection below
        with self._lock:
            stopped, begun = self._stop_asked, self.begun
        if stopped and begun is not None and begun.output_dir is not None:
            self._collect_rest(begun, begun.output_dir)
        with self._lock:
            if self._code is None:
                self._lost(ended)

    def _take_answers(self, answers: Any) -> Exception | None:
        """Take the task's answers in order; None once the last came, else why they ended."""
        try:
            for ref in answers:
                answer = self._ray.get(ref)
                if isinstance(answer, Output):
                    self._log.append(answer.data)  # before the last answer a poll sees
                    continue
                if isinstance(answer, Begun) and answer.admitted:
                    self._log.open()  # it runs, so it has a log (outside the lock a poll takes)
                with self._lock:
                    if not self._take(answer):
                        return None
            return LookupError("the node's runner ended without an answer")
        except Exception as err:
            return err

    def _collect_rest(self, begun: Begun, directory: str) -> None:
        """A stopped job's output its stream did not bring, fetched from its node.

        The node keeps it until fetched; the collection there waits for the
        tree to be stopped (its grace, or the forced cancel after it), so what
        the tree wrote meanwhile comes too.  A node lost meanwhile loses it.
        """
        stopped_within = self._job.stop_grace_s + FORCE_AFTER_S + COLLECT_IDLE_S
        wait_s = stopped_within + COLLECT_IDLE_S  # for each piece: the first waits for the stop
        try:
            rest = self._collect(begun.node_id, directory, self._log.received, stopped_within)
            while True:
                ready, _ = self._ray.wait([rest], timeout=wait_s)
                if not ready:
                    log.warning(
                        "job %s: the rest of its output did not come from node %s within %.0f s",
                        self._job.job_id,
                        begun.host,
                        wait_s,
                    )
                    with contextlib.suppress(Exception):
                        self._ray.cancel(rest, force=True)
                    return
                ref = next(rest, None)
                if ref is None:
                    return
                answer = self._ray.get(ref)
                if isinstance(answer, Output):
                    self._log.append(answer.data)
        except Exception as err:
            log.warning(
                "job %s: the rest of its output could not be fetched from node %s: %s",
                self._job.job_id,
                begun.host,
                err,
            )

    def _take(self, answer: Any) -> bool:
        """Record one answer (lock held); whether more answers are to come."""
        if isinstance(answer, Begun):
            self._begun(answer)
            return self._code is None
        if isinstance(answer, Finished):
            self._finished(answer)
            return False
        self._lost(LookupError(f"the node's runner answered {type(answer).__name__}"))
        return False

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
        if finished.peak_bytes is not None and finished.peak_method is not None:
            self._peak = MemoryPeak(finished.peak_bytes, PeakMethod(finished.peak_method))
        if finished.pressure is not None:
            # Its node's ladder stopped it: the gateway queues it again with a grown
            # estimate, as it does a local tree it stopped itself.
            where = "its node" if self.begun is None else f"node {self.begun.host}"
            summary = f"stopped for memory pressure on {where}: {finished.pressure}"
            end = RemoteEnd.PRESSURE
            self._settle(Settlement(end, None, summary, finished.rate, finished.never_fits))
            return
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
    def local(self) -> bool:
        """Never: its memory is in its node's reading, not in this container's."""
        return False

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

    def cpu_seconds(self) -> float | None:
        """None: the tree uses its node's cores, not this machine's."""
        return None

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
        Not sent yet: it never will be.
        """
        with self._lock:
            self._stop_asked = True
            answers = self._answers
        if answers is not None:
            self._cancel(answers)
        return None

    def _cancel(self, answers: Any) -> None:
        """Ask Ray to cancel the task, from a thread of its own: nothing waits for Ray.

        The node stops the tree when the cancel reaches the task (a KeyboardInterrupt
        there).  A cancel seen to get lost under load (the task ran on, untouched)
        is forced after the node's stop grace and FORCE_AFTER_S: Ray ends the
        worker, and the worker's lifeline kills the tree.
        """

        def cancel() -> None:
            try:
                self._ray.cancel(answers)
            except Exception as err:  # forced below if the node never stops it
                say_failure_once(f"cancelling job {self._job.job_id} on its node", err)
            if self._answered.wait(self._job.stop_grace_s + FORCE_AFTER_S):
                return
            log.warning(
                "job %s: its node did not stop it within %.0f s of the cancel; "
                "ending its Ray worker instead",
                self._job.job_id,
                self._job.stop_grace_s + FORCE_AFTER_S,
            )
            try:
                self._ray.cancel(answers, force=True)
            except Exception as err:
                say_failure_once(f"ending the Ray worker of job {self._job.job_id}", err)

        name = f"ray-cancel-{self._job.job_id}"
        threading.Thread(target=cancel, name=name, daemon=True).start()

    def close(self) -> None:
        """Forget the job in the backend's per-node table."""
        self._on_closed(self._job.job_id)


def _reason(value: str) -> Word:
    """The node's reason word: the guard's, or the ladder's ``pressure`` (the node holds)."""
    with contextlib.suppress(ValueError):
        return PressureReason.from_code(value)
    try:
        return Reason.from_code(value)
    except ValueError:
        return Reason.UNKNOWN

"""The runner on a Ray node: ask that node's guard, run the job as a managed tree, report back.

One :class:`NodeRunner` actor per job, placed by Ray on a node with the
job's memory estimate and CPU need free in Ray's bookkeeping.  Ray's
``memory`` resource is bookkeeping only, so before anything starts the
runner asks a :class:`~roomkeeper.guard.admission.Guard` of its own: the
same rule and readings as the gateway's, of *this* node's container.  A
refusal is reported back (:class:`Begun` with ``admitted`` False) and the
gateway puts the job back in line; nothing was started.

Admitted, the command runs as a managed tree (:func:`roomkeeper.jobs.launch.launch`:
its own session and process group, output in a file, whole-tree stop) under
a lifeline of the runner's, so that the tree dies with the runner's worker
even when the node is killed.  :meth:`NodeRunner.finish` waits for it (or for
its deadline, then stops it) and hands back the exit status and the output;
:meth:`NodeRunner.stop` stops the whole tree when the job is cancelled.

The node's guard reads the node's own ``ROOMKEEPER_*`` variables, and over
them the ``KEY=VALUE`` lines of the file ROOMKEEPER_NODE_SETTINGS names, read
afresh for every job: a node's settings change without restarting it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from roomkeeper.errors import LaunchError
from roomkeeper.guard.admission import Guard
from roomkeeper.jobs.launch import LaunchSpec, launch
from roomkeeper.jobs.lifeline import Lifeline
from roomkeeper.jobs.process import ManagedProcess

STOP_GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL when the deadline passes on the node


@dataclass(frozen=True, slots=True)
class NodeJob:
    """What the gateway sends a node: the command, its estimates, the time it has left.

    Attributes:
        job_id: the gateway's id for the job.
        argv: the command (one string of shell text when ``shell``).
        shell: run ``argv[0]`` with ``/bin/sh -c``.
        cwd: its working directory on the node; the runner's own when None.
        env: its whole environment; the node worker's when None.
        nice: the niceness it runs at.
        memory_bytes: its memory estimate, asked of the node's guard.
        disk_bytes: its disk estimate; the node's ROOMKEEPER_JOB_DISK_MB when None.
        deadline_s: seconds it has left when sent; no deadline when None.
    """

    job_id: str
    argv: tuple[str, ...]
    shell: bool
    cwd: str | None
    env: Mapping[str, str] | None
    nice: int
    memory_bytes: int
    disk_bytes: int | None
    deadline_s: float | None


@dataclass(frozen=True, slots=True)
class Begun:
    """The node's answer to :meth:`NodeRunner.begin`.

    Attributes:
        node_id: Ray's id of the node that judged it.
        host: that node's host name.
        admitted: whether the node's guard let it start (then it runs).
        reason: the node guard's reason (a :class:`~roomkeeper.guard.rule.Reason` value).
        summary: the node guard's words, or why it could not start.
        pid: the tree's leader on the node (None when it did not start).
        headroom_bytes: the node's memory line less its use, as its guard read it.
        error: it was admitted but could not start (missing command, bad cwd).
    """

    node_id: str
    host: str
    admitted: bool
    reason: str
    summary: str
    pid: int | None
    headroom_bytes: int | None
    error: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """How the tree ended on the node: its status, its output, its peak."""

    exit_code: int
    output: bytes
    peak_bytes: int | None
    peak_method: str | None
    timed_out: bool


def node_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This node's variables, with the lines of ROOMKEEPER_NODE_SETTINGS' file over them.

    A missing file adds nothing; lines without ``=`` and ``#`` comments are skipped.
    """
    merged = dict(os.environ if env is None else env)
    path = merged.get("ROOMKEEPER_NODE_SETTINGS")
    if not path:
        return merged
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as lines:
        for line in lines:
            key, sep, value = line.strip().partition("=")
            if sep and key and not key.startswith("#"):
                merged[key.strip()] = value.strip()
    return merged


def _headroom(line: int | None, used: int | None) -> int | None:
    """The memory line less what is used (negative: over the line), or None if unknown."""
    if line is None or used is None:
        return None
    return line - used


class NodeRunner:
    """One job on one node (a Ray actor: Ray calls these methods on the node's worker).

    Ray runs it with several threads, so :meth:`stop` can come while
    :meth:`finish` waits.
    """

    def __init__(self) -> None:
        self._dir: str | None = None  # made once admitted: a refusal leaves nothing behind
        self._lifeline = Lifeline()
        self._process: ManagedProcess | None = None
        self._deadline_s: float | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    def _where(self) -> tuple[str, str]:
        """Ray's id of this node and its host name."""
        from roomkeeper.cluster.ray_import import load_ray

        node_id: str = load_ray().get_runtime_context().get_node_id()
        return node_id, socket.gethostname()

    def begin(self, job: NodeJob) -> Begun:
        """Ask this node's guard, then start the job as a managed tree if it was admitted."""
        node_id, host = self._where()
        guard = Guard(env=node_environment())
        decision = guard.admit(job.job_id, memory_bytes=job.memory_bytes, disk_bytes=job.disk_bytes)
        memory = decision.memory
        headroom = _headroom(
            decision.memory_line_bytes, None if memory is None else memory.used_bytes
        )
        if not decision.admit:
            return Begun(
                node_id, host, False, decision.reason.value, decision.summary, None, headroom
            )
        self._dir = tempfile.mkdtemp(prefix="roomkeeper-node-")
        spec = LaunchSpec(
            argv=job.argv,
            log_path=os.path.join(self._dir, "output.log"),
            cwd=job.cwd,
            env=job.env,
            nice=job.nice,
            shell=job.shell,
            use_cgroup=False,
            use_freezer=False,
        )
        with self._lock:
            if self._stopped.is_set():  # cancelled before it could start: nothing runs
                return Begun(node_id, host, False, "ok", "cancelled before it started", None, None)
            try:
                self._process = launch(job.job_id, spec, lifeline=self._lifeline)
            except LaunchError as err:
                self._cleanup()
                return Begun(node_id, host, False, "ok", str(err), None, headroom, error=True)
        self._deadline_s = job.deadline_s
        return Begun(
            node_id,
            host,
            True,
            decision.reason.value,
            decision.summary,
            self._process.pid,
            headroom,
        )

    def finish(self) -> Finished:
        """Wait for the tree to end (stopping it at its deadline); its status and output.

        The runner's directory and lifeline go with it: the answer holds the output.
        """
        process = self._process
        if process is None:
            raise LaunchError("?", "finish() before a successful begin()")
        code = process.wait(timeout=self._deadline_s)
        timed_out = code is None
        if timed_out:
            code = process.stop(STOP_GRACE_SECONDS)
        process.close()
        code = process.poll() if code is None else code
        peak = None
        with contextlib.suppress(Exception):
            peak = process.peak()
        with open(process.log_path, "rb") as log:
            output = log.read()
        self._cleanup()
        return Finished(
            exit_code=-9 if code is None else code,
            output=output,
            peak_bytes=None if peak is None else peak.bytes,
            peak_method=None if peak is None else peak.method.value,
            timed_out=timed_out,
        )

    def stop(self, grace: float) -> int | None:
        """Stop the whole tree (SIGTERM, ``grace`` seconds, SIGKILL); its leader's status."""
        with self._lock:
            self._stopped.set()
            process = self._process
        return None if process is None else process.stop(grace)

    def _cleanup(self) -> None:
        """End the lifeline (its tree has ended) and remove the runner's directory."""
        self._lifeline.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

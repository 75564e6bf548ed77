"""The runner on a Ray node: ask that node's guard, run the job as a managed tree, report back.

One Ray task per job (:func:`run_job`, a streaming generator), placed by Ray
on a node with the job's memory estimate and CPU need free in Ray's
bookkeeping, and run on one of that node's pooled workers.  Ray's ``memory``
resource is bookkeeping only, so before anything starts the task asks a
:class:`~roomkeeper.guard.admission.Guard` of its own: the same rule and
readings as the gateway's, of *this* node's container.  A refusal is the
task's one answer (:class:`Begun` with ``admitted`` False) and the gateway
puts the job back in line; nothing was started.

Admitted, the command runs as a managed tree (:func:`roomkeeper.processes.launch.launch`:
its own session and process group, output in a file, whole-tree stop) under
the worker's lifeline, so that the tree dies with the worker even when the
node is killed.  The task's first answer (:class:`Begun`: node, pid,
headroom, where its output is kept) comes as soon as the tree runs; then its
output, in bounded pieces as it is written (:class:`~roomkeeper.cluster.output.Output`,
see :mod:`roomkeeper.cluster.output`); its last (:class:`Finished`: exit
status, peak) when the tree has ended or its deadline passed (then the tree
is stopped) and every piece has been sent.  A cancel stops the whole tree and
leaves its output on the node for the gateway to collect.

The node's guard reads the node's own ``ROOMKEEPER_*`` variables, and over
them the ``KEY=VALUE`` lines of the file ROOMKEEPER_NODE_SETTINGS names, read
afresh for every job: a node's settings change without restarting it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from roomkeeper.cluster.output import (
    CHUNK_BYTES,
    LogTail,
    Output,
    hold,
    let_go,
    log_path,
    make_directory,
    sweep_uncollected,
)
from roomkeeper.errors import LaunchError
from roomkeeper.guard.admission import Guard, Rerun
from roomkeeper.processes.launch import LaunchSpec, launch
from roomkeeper.processes.lifeline import Lifeline
from roomkeeper.processes.process import ManagedProcess

WATCH_PREFIX = "roomkeeper-watch-"  # a node's watch is the Ray actor named this and its id
WATCH_NAMESPACE = "roomkeeper"  # the gateway's namespace on the cluster, where it is named
STOP_GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL when the deadline passes on the node
WAIT_STEP_S = 0.1  # a cancel interrupts Python code only between steps, not inside a poll


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
        stop_grace_s: SIGTERM to SIGKILL when it is cancelled.
        restartable: it may be stopped for memory pressure and run again.
        last_run: the last run it is allowed: its node's ladder stops it last.
        rerun_peak: a re-run's peak in its run stopped for memory pressure (None: a first
            run): its grown estimate is asked at most at the room it would have on the node
            with none of our jobs running there, never below that peak.
        runs_again: a stop for pressure queues it again: its node's ladder may stop it,
            frozen, to let an older frozen tree go on.
        watched: its node must run a watch (:mod:`roomkeeper.cluster.watch`) before
            the job may start there; False when the gateway turned node monitors off.
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
    stop_grace_s: float = STOP_GRACE_SECONDS
    restartable: bool = False
    last_run: bool = False
    rerun_peak: int | None = None
    runs_again: bool = False
    watched: bool = False


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
        output_dir: where its output is kept on the node while it runs (and, once it
            is stopped, until the gateway collects it); None when it did not start.
    """

    node_id: str
    host: str
    admitted: bool
    reason: str
    summary: str
    pid: int | None
    headroom_bytes: int | None
    error: bool = False
    output_dir: str | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """How the tree ended on the node: its status and its peak (its output came before).

    ``pressure`` is set when the node's watch stopped it for memory pressure: its words,
    with ``rate`` (bytes per second it grew by then) and ``never_fits`` (it alone
    outgrew the node).
    """

    exit_code: int
    peak_bytes: int | None
    peak_method: str | None
    timed_out: bool
    pressure: str | None = None
    rate: float = 0.0
    never_fits: bool = False


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


_LIFELINE = Lifeline()  # its helper starts with the worker's first job


def worker_lifeline() -> Lifeline:
    """This worker process's lifeline, shared by the jobs it runs one after another.

    Ray reuses its workers from task to task, so the helper starts once per
    worker, not once per job; when the worker dies (its node lost, SIGKILL
    included) the helper kills every tree still registered.
    """
    _LIFELINE.start()
    return _LIFELINE


def _where() -> tuple[str, str]:
    """Ray's id of this node and its host name."""
    from roomkeeper.cluster.ray_import import load_ray

    node_id: str = load_ray().get_runtime_context().get_node_id()
    return node_id, socket.gethostname()


def _spec(job: NodeJob, tail: LogTail) -> LaunchSpec:
    return LaunchSpec(
        argv=job.argv,
        log_path=tail.path,
        cwd=job.cwd,
        env=job.env,
        nice=job.nice,
        shell=job.shell,
        use_cgroup=False,
        use_freezer=False,
    )


def run_job(job: NodeJob) -> Iterator[Begun | Output | Finished]:
    """The Ray task on the node: yields :class:`Begun`, then (if it started) the job's
    :class:`~roomkeeper.cluster.output.Output` as it is written, then :class:`Finished`.

    A watched job starts only where the node's watch runs and does not hold
    launches (else the node refuses it, reason ``pressure``, and it waits in
    the gateway's queue); its tree is told to the watch, which may suspend or
    stop it, and a stop for memory pressure comes back in :class:`Finished`.

    A cancel from the gateway (``ray.cancel``) arrives as KeyboardInterrupt
    while the tree runs (or as GeneratorExit, where it arrives in Ray's code
    between two answers); the whole tree is then stopped (SIGTERM, the grace,
    SIGKILL) before the task ends, and its output is left for the gateway to
    collect (:func:`~roomkeeper.cluster.output.collect_output`): Ray takes no
    answer from a cancelled task.
    """
    _let_cancels_in()
    node_id, host = _where()
    watch = _watch(node_id) if job.watched else None
    held = _held(watch) if job.watched else None
    if held is not None:
        yield Begun(node_id, host, False, PRESSURE_CODE, held, None, None)
        return
    # A re-run's estimate is a forecast grown from its stopped run: asked as is, it can
    # exceed what any node holds beside Ray's own processes, and the job would wait for
    # ever at the head of its line; the gateway's guard caps it the same way.
    rerun = None if job.rerun_peak is None else Rerun(job.rerun_peak, _ours(watch))
    decision = Guard(env=node_environment()).admit(
        job.job_id,
        memory_bytes=job.memory_bytes,
        disk_bytes=job.disk_bytes,
        rerun=rerun,
        worst_case=rerun is not None and job.last_run,
    )
    memory = decision.memory
    headroom = _headroom(decision.memory_line_bytes, None if memory is None else memory.used_bytes)
    if not decision.admit:
        yield Begun(node_id, host, False, decision.reason.value, decision.summary, None, headroom)
        return
    with contextlib.suppress(OSError):
        sweep_uncollected()
    directory = make_directory()
    tail = LogTail(log_path(directory))
    lock, kept = None, False
    try:
        lock = hold(directory)  # let go once the tree is stopped: a collection waits for that
        try:
            process = launch(job.job_id, _spec(job, tail), lifeline=worker_lifeline())
        except LaunchError as err:
            yield Begun(node_id, host, False, "ok", str(err), None, headroom, error=True)
            return
        try:
            _tell(
                watch,
                "track",
                job.job_id,
                process.pid,
                job.memory_bytes,
                job.restartable,
                job.last_run,
                runs_again=job.runs_again,
            )
            yield Begun(
                node_id,
                host,
                True,
                decision.reason.value,
                decision.summary,
                process.pid,
                headroom,
                output_dir=directory,
            )
            timed_out = yield from _follow(process, job.deadline_s, tail)
            process.close()  # what is left of the tree, before the last of its output
            stopped = _tell(watch, "ended", job.job_id)
            yield from tail.rest()
            yield _finished(process, timed_out, stopped)
        except BaseException:  # a cancel (KeyboardInterrupt), or the stream closed early
            with contextlib.suppress(OSError):  # a tree its watch suspended dies of SIGTERM
                os.killpg(process.pid, signal.SIGCONT)
            process.stop(job.stop_grace_s)
            kept = True
            with contextlib.suppress(Exception):
                _tell(watch, "ended", job.job_id, wait=False)
            raise
        finally:
            process.close()
    finally:
        tail.close()
        if lock is not None:
            let_go(lock, left=directory if kept else None)
        if not kept:
            shutil.rmtree(directory, ignore_errors=True)


WARM_HOLD_S = 1.0  # long enough that a node's warm-ups run side by side, each on its own worker


def warm_worker() -> str:
    """A task that only starts a worker on its node and keeps it busy a moment.

    Ray starts a worker process for a node's first tasks (seconds on a busy
    machine: the interpreter, Ray, this module) and keeps about one idle worker
    per CPU afterwards.  Run as a node joins, these start the workers the
    first jobs there find ready; they hold no CPU of Ray's, so no job waits
    behind them.
    """
    time.sleep(WARM_HOLD_S)
    return _where()[0]


PRESSURE_CODE = "pressure"  # the word of a node that holds launches (PressureReason.PRESSURE)
WATCH_CALL_S = 10.0  # a node's watch answers a runner within this, or the runner goes on


def _watch(node_id: str) -> Any:
    """This node's watch (a Ray actor handle), None when none runs here."""
    from roomkeeper.cluster.ray_import import load_ray

    try:
        return load_ray().get_actor(watch_name(node_id), namespace=WATCH_NAMESPACE)
    except ValueError:  # not started yet, or gone with the gateway that started it
        return None


def watch_name(node_id: str) -> str:
    """The Ray actor name of a node's watch (:mod:`roomkeeper.cluster.watch`)."""
    return f"{WATCH_PREFIX}{node_id}"


def _ours(watch: Any) -> int:
    """What our trees on this node hold now, as its watch last read them (0 without one)."""
    try:
        held = _tell(watch, "ours")
    except Exception:  # a forecast capped at less room: the job may wait longer, no more
        return 0
    return int(held or 0)


def _held(watch: Any) -> str | None:
    """Why the node refuses to start a job now: no watch runs there, or it holds launches."""
    if watch is None:
        return "its node's pressure monitor is not running yet; the job waits for it"
    try:
        why: str | None = _tell(watch, "holds")
    except Exception as err:
        return f"its node's pressure monitor did not answer ({type(err).__name__})"
    return None if why is None else f"memory pressure on the node: {why}"


def _tell(watch: Any, method: str, *args: Any, wait: bool = True, **named: Any) -> Any:
    """Call the node's watch (None: none watches, so nothing to tell); its answer."""
    if watch is None:
        return None
    from roomkeeper.cluster.ray_import import load_ray

    ref = getattr(watch, method).remote(*args, **named)
    return load_ray().get(ref, timeout=WATCH_CALL_S) if wait else None


def _let_cancels_in() -> None:
    """Make sure a cancel from the gateway reaches this task as KeyboardInterrupt.

    Ray delivers a cancel as an interrupt of the worker's main thread, which
    does nothing where SIGINT is ignored, and a node started in the background
    of a script inherits SIGINT ignored (a shell ignores it for its background
    jobs): every cancel was lost there, and the trees ran on.  The task runs on
    the worker's main thread, so it can restore Python's own handler.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _follow(
    process: ManagedProcess, deadline_s: float | None, tail: LogTail
) -> Generator[Output, None, bool]:
    """Send the tree's output as it is written until the tree ends or its deadline passes.

    A piece at a time, then a short wait unless the piece was full (more is
    waiting); a cancel interrupts only between steps, not inside a poll.

    Returns:
        Whether its deadline passed first (then the tree was stopped).
    """
    end = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        data = tail.read()
        if data:
            yield Output(data)
        pause = 0.0 if len(data) == CHUNK_BYTES else WAIT_STEP_S
        if process.wait(timeout=pause) is not None:
            return False
        if end is not None and time.monotonic() >= end:
            process.stop(STOP_GRACE_SECONDS)
            return True


def _finished(process: ManagedProcess, timed_out: bool, stopped: Any) -> Finished:
    """The closed tree's status and peak, and how its node's watch stopped it, if it did
    (a :class:`~roomkeeper.cluster.watch.PressureStop`, else None)."""
    peak = None
    with contextlib.suppress(Exception):
        peak = process.peak()
    code = process.poll()
    return Finished(
        exit_code=-9 if code is None else code,
        peak_bytes=None if peak is None else peak.bytes,
        peak_method=None if peak is None else peak.method.value,
        timed_out=timed_out,
        pressure=None if stopped is None else stopped.why,
        rate=0.0 if stopped is None else stopped.rate,
        never_fits=False if stopped is None else stopped.never_fits,
    )

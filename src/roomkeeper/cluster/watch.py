"""The ladder on a Ray node: one pressure monitor per node, for the trees run there.

Each job's runner (:func:`roomkeeper.cluster.node.run_job`) runs on one of
its node's pooled Ray workers, one job after another; no runner sees the
others.  So each node runs one :class:`NodeWatch`, a Ray actor pinned to it
and named for it (:func:`watch_name`), started by the gateway's backend when
it first sees the node.  In that one process the gateway's own
:class:`~roomkeeper.relief.monitor.PressureMonitor` reads the node's memory
the way the gateway reads its container's (the node's cgroup in any layout,
else the machine; :meth:`roomkeeper.guard.admission.Guard.pressure_reading`)
and climbs the same ladder over every tree running there: hold, suspend the
newest, resume, stop restartable work first, never the oldest, and stop a
frozen tree that would run again (the gateway says so at the launch), for
which the frozen trees have waited together as long as it ran, and whose
memory alone lets the oldest frozen one go on.  The watch times each tree's
run and suspensions itself, on its monotonic clock.

A runner tells its watch of its tree once it runs (:meth:`NodeWatch.track`)
and asks it, when the tree has ended, whether the watch stopped it
(:meth:`NodeWatch.ended`): such a job comes back to the gateway as stopped for
memory pressure, and is queued again there with its grown estimate.  Before a
job starts its runner asks whether the node holds launches
(:meth:`NodeWatch.holds`): past the line, in the cooldown after a stop, or
with a tree suspended, it refuses, and the job waits in the gateway's queue.

The trees are other processes' children: the watch acts on them by pid,
through the members it has seen (psutil compares start times, so a reused
pid is never signalled), with SIGSTOP and SIGCONT for a suspension and
SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`, for a stop.

The gateway's backend drains each watch every second (:meth:`NodeWatch.report`):
the steps taken since the last drain (:class:`NodeStep`, each with the node's
id and host), whether the node holds and for how long, and what its
suspended trees hold.  Ray's own memory monitor is left on as the last net;
:func:`ray_acts_first` says when its threshold is set where it would kill
before this ladder has stopped anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import psutil

from roomkeeper.cluster.node import node_environment
from roomkeeper.config import read_pressure_settings
from roomkeeper.errors import SuspendError
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.lines import Reading
from roomkeeper.guard.rule import gb
from roomkeeper.kernel.proc import recent_scan, tree_members
from roomkeeper.processes.peaks import tree_footprint
from roomkeeper.processes.suspension import Suspension
from roomkeeper.relief.cooldown import Cooldown
from roomkeeper.relief.ladder import Live
from roomkeeper.relief.monitor import MonitorPace, PressureMonitor, ReliefEvent, arm_container

log = logging.getLogger("roomkeeper")

STOP_GRACE_S = 2.0  # SIGTERM to SIGKILL for a tree stopped for pressure: memory is short
SUSPEND_TIMEOUT_S = 2.0  # a tree that does not stop in this time is let go on
RATE_WINDOW_S = 2.0  # a stopped tree's growth rate is measured over this much of its past
STEPS_KEPT = 1000  # steps not drained yet (the gateway drains every second)
RAY_THRESHOLD_DEFAULT = 0.95  # Ray's memory monitor kills at this share of the node's memory


@dataclass(frozen=True, slots=True)
class NodeStep:
    """One step of the ladder a node took, as the gateway records it.

    Attributes:
        node_id: Ray's id of the node.
        host: its host name.
        step: the rung (a :class:`~roomkeeper.relief.ladder.Step` value).
        job_id: the job it acted on (None for a hold).
        used_bytes: the node's used memory when it was decided.
        limit_bytes: the node's limit.
        footprint_bytes: the job's memory then (0 for a hold).
        reaction_s: from the crossing to the step (None for a resume).
        why: the numbers, in words.
        never_fits: a stop of a job that alone outgrows the node.
    """

    node_id: str
    host: str
    step: str
    job_id: str | None
    used_bytes: int
    limit_bytes: int
    footprint_bytes: int
    reaction_s: float | None
    why: str
    never_fits: bool = False


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What a node's watch tells the gateway at each drain.

    Attributes:
        node_id: Ray's id of the node.
        host: its host name.
        holding: whether the node holds launches now (pressure, cooldown, a suspended tree).
        cooling_s: seconds its cooldown holds still.
        suspended: the suspended trees and what each holds (job id, bytes).
        steps: the steps taken since the last drain, oldest first.
        warning: a word on the node's set-up (Ray's threshold), None when all is well.
    """

    node_id: str
    host: str
    holding: bool
    cooling_s: float
    suspended: tuple[tuple[str, int], ...]
    steps: tuple[NodeStep, ...]
    warning: str | None


@dataclass(frozen=True, slots=True)
class PressureStop:
    """How the watch stopped a tree: its words, how fast it grew, whether it fits alone."""

    why: str
    rate: float
    never_fits: bool


@dataclass
class _Tree:
    """One job's tree on this node, as the watch follows it from outside (times in the
    watch's monotonic seconds)."""

    job_id: str
    pid: int
    started: float
    estimate: int
    restartable: bool
    last_run: bool
    runs_again: bool = False
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    history: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    suspension: Suspension | None = None
    suspended_at: float | None = None  # when its suspension now began; None while it runs
    suspended_before_s: float = 0.0  # its earlier suspensions, together
    stopped: PressureStop | None = None

    @property
    def suspended(self) -> bool:
        """Frozen now."""
        return self.suspended_at is not None

    def run_times(self, now: float) -> tuple[float, float]:
        """Seconds it has run, its suspensions left out, and seconds suspended now."""
        waiting = 0.0 if self.suspended_at is None else max(0.0, now - self.suspended_at)
        ran = max(0.0, now - self.started - self.suspended_before_s - waiting)
        return ran, waiting

    def mark_suspended(self, now: float) -> None:
        self.suspended_at = now

    def mark_running(self, now: float) -> None:
        """Going on (or stopped): its suspension now counts with the earlier ones."""
        if self.suspended_at is not None:
            self.suspended_before_s += max(0.0, now - self.suspended_at)
        self.suspended_at = None


def ray_acts_first(env: Mapping[str, str], reading: Reading) -> str | None:
    """Why Ray's memory monitor would kill on this node before the ladder stops anything;
    None when the ladder's stop line comes first (or Ray's monitor is off).

    Ray kills the newest retriable task once the node's memory passes
    RAY_memory_usage_threshold (a share of its memory, 0.95 unless set).
    """
    if env.get("RAY_memory_monitor_refresh_ms", "").strip() == "0":
        return None
    raw = env.get("RAY_memory_usage_threshold", "").strip()
    try:
        threshold = float(raw) if raw else RAY_THRESHOLD_DEFAULT
    except ValueError:
        return f"RAY_memory_usage_threshold={raw!r} is not a number"
    at = int(threshold * reading.limit)
    if at > reading.stop_line:
        return None
    wanted = min(0.99, (reading.stop_line / reading.limit) + 0.01) if reading.limit else 0.99
    return (
        f"Ray's memory monitor kills at {threshold:g} of this node's memory ({gb(at)} GB), "
        f"at or below roomkeeper's stop line ({gb(reading.stop_line)} of {gb(reading.limit)} "
        f"GB): Ray would kill before roomkeeper suspends or stops anything; start the node "
        f"with RAY_memory_usage_threshold={wanted:.2f} or more"
    )


class NodeTrees:
    """The node's trees as the ladder's :class:`~roomkeeper.relief.monitor.Target`.

    Args:
        clock: monotonic seconds.
        grace_s: SIGTERM to SIGKILL for a stopped tree.
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, grace_s: float = STOP_GRACE_S
    ) -> None:
        self._clock = clock
        self._grace_s = grace_s
        self._lock = threading.Lock()
        self._trees: dict[str, _Tree] = {}
        self._stopping: list[_Tree] = []  # stopped, members perhaps still alive
        self.holding = False

    def track(self, tree: _Tree) -> None:
        """Follow a tree that began running."""
        tree.suspension = Suspension(
            tree.job_id,
            cgroup=None,
            freezer_group=None,
            members=lambda: self._members(tree),
            send=lambda pid, sig: _send(tree, pid, sig),
            known=lambda: set(tree.seen) | {tree.pid},
        )
        with self._lock:
            self._trees[tree.job_id] = tree

    def forget(self, job_id: str) -> PressureStop | None:
        """The tree's runner saw it end: stop following it; how the watch stopped it, if so."""
        with self._lock:
            tree = self._trees.pop(job_id, None)
        return None if tree is None else tree.stopped

    def ours(self) -> int:
        """What the trees followed here held when last read (stopped ones still count)."""
        with self._lock:
            trees = list(self._trees.values())
        return sum(t.history[-1][1] for t in trees if t.history)

    def suspended(self) -> list[tuple[str, int]]:
        """The suspended trees and what each held when last read."""
        with self._lock:
            trees = [t for t in self._trees.values() if t.suspended and t.stopped is None]
        return [(t.job_id, t.history[-1][1] if t.history else 0) for t in trees]

    def _members(self, tree: _Tree) -> set[int]:
        """The tree's pids now (its session, and every descendant of one seen before)."""
        pids = tree_members(recent_scan(max_age_s=0.05), tree.pid, None, seeds=tree.seen)
        for pid in pids - set(tree.seen):
            with contextlib.suppress(psutil.Error):
                tree.seen[pid] = psutil.Process(pid)
        for pid in set(tree.seen) - pids:
            del tree.seen[pid]
        return set(tree.seen)

    def _alive(self, tree: _Tree) -> bool:
        """Whether any member of the tree still runs (zombies hold no memory)."""
        for proc in list(tree.seen.values()):
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
        return False

    # ------------------------------------------------------ the ladder's Target

    def live_jobs(self) -> list[Live]:
        """Every tree followed and still running here, with its footprint now."""
        with self._lock:
            trees = [t for t in self._trees.values() if t.stopped is None]
        live = []
        now = self._clock()
        for tree in trees:
            self._members(tree)
            if not self._alive(tree):
                continue  # ended: its runner forgets it soon
            footprint = tree_footprint(tree.seen.values())
            tree.history.append((now, footprint))
            ran_s, suspended_s = tree.run_times(now)
            live.append(
                Live(
                    job_id=tree.job_id,
                    started=tree.started,
                    footprint=footprint,
                    estimate=tree.estimate,
                    suspended=tree.suspended,
                    restartable=tree.restartable,
                    last_run=tree.last_run and footprint <= tree.estimate,
                    runs_again=tree.runs_again,
                    ran_s=ran_s,
                    suspended_s=suspended_s,
                )
            )
        return live

    def hold_for_pressure(self, hold: bool) -> None:
        """Remember whether the node holds launches (runners ask before starting a job)."""
        self.holding = hold

    def suspend_for_pressure(self, job_id: str, *, trial: bool = False) -> bool:
        """Suspend the job's tree (SIGSTOP to every member); whether it is suspended now."""
        return job_id in self.suspend_all_for_pressure([job_id])

    def suspend_all_for_pressure(self, job_ids: list[str]) -> list[str]:
        """Suspend several trees, each halted before any is walked; the ones suspended."""
        with self._lock:
            trees = [self._trees[j] for j in job_ids if j in self._trees]
        trees = [t for t in trees if not t.suspended and t.stopped is None]
        for tree in trees:
            assert tree.suspension is not None
            with contextlib.suppress(Exception):  # a halt only speeds the suspension up
                tree.suspension.halt()
        done = []
        for tree in trees:
            assert tree.suspension is not None
            try:
                tree.suspension.suspend(SUSPEND_TIMEOUT_S)
            except SuspendError as err:
                log.warning("memory pressure: job %s could not be suspended: %s", tree.job_id, err)
                continue
            tree.mark_suspended(self._clock())
            done.append(tree.job_id)
        return done

    def resume_after_pressure(self, job_id: str) -> bool:
        """Let a suspended tree go on (SIGCONT); whether it runs now."""
        with self._lock:
            tree = self._trees.get(job_id)
        if tree is None or not tree.suspended or tree.suspension is None:
            return False
        try:
            tree.suspension.resume()
        except SuspendError as err:
            log.warning("job %s could not be resumed: %s", job_id, err)
            return False
        tree.mark_running(self._clock())
        return True

    def stop_in_progress(self) -> bool:
        """Whether a tree stopped for pressure still has a member alive."""
        with self._lock:
            self._stopping = [t for t in self._stopping if self._alive(t)]
            return bool(self._stopping)

    def stop_for_pressure(self, job_id: str, why: str, *, never_fits: bool) -> bool:
        """Stop the job's tree: SIGTERM (a suspended tree is let go on to die of it), then
        SIGKILL after the grace; its runner reports it stopped for memory pressure."""
        with self._lock:
            tree = self._trees.get(job_id)
            if tree is None or tree.stopped is not None:
                return False
            tree.stopped = PressureStop(why, _rate(tree.history, RATE_WINDOW_S), never_fits)
            self._stopping.append(tree)
        members = self._members(tree)
        self._signal(tree, signal.SIGTERM)
        if tree.suspension is not None:
            tree.suspension.resume_quietly(listed=members)
        tree.mark_running(self._clock())
        timer = threading.Timer(self._grace_s, self._signal, (tree, signal.SIGKILL))
        timer.daemon = True
        timer.start()
        return True

    def _signal(self, tree: _Tree, sig: int) -> None:
        for pid in self._members(tree) | {tree.pid}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                _send(tree, pid, sig)


def _send(tree: _Tree, pid: int, sig: int) -> None:
    """Signal one member seen before, never a process that took its pid since."""
    proc = tree.seen.get(pid)
    try:
        if proc is None:
            proc = psutil.Process(pid)
            if os.getsid(pid) != tree.pid and pid != tree.pid:
                raise ProcessLookupError(pid)
        if not proc.is_running():
            raise ProcessLookupError(pid)
        proc.send_signal(sig)
    except (psutil.NoSuchProcess, OSError) as err:
        raise ProcessLookupError(pid) from err
    except psutil.AccessDenied as err:
        raise PermissionError(f"pid {pid}: {err}") from err


def _stamp(env: Mapping[str, str]) -> tuple[int, int] | None:
    """When the node's settings file (ROOMKEEPER_NODE_SETTINGS) last changed, and its size;
    None when there is none."""
    path = env.get("ROOMKEEPER_NODE_SETTINGS")
    if not path:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


def _rate(history: deque[tuple[float, int]], window_s: float) -> float:
    """Bytes per second the tree grew by over the last ``window_s`` of its readings."""
    if len(history) < 2:
        return 0.0
    end_at, end = history[-1]
    start_at, start = next(((t, b) for t, b in history if end_at - t <= window_s), history[0])
    return 0.0 if end_at <= start_at else (end - start) / (end_at - start_at)


class NodeWatch:
    """A node's pressure monitor over the trees its runners start (a Ray actor's body).

    Args:
        node_id: Ray's id of the node it runs on.
        env: the node's variables; its own, with its ROOMKEEPER_NODE_SETTINGS file over
            them, when None.
    """

    def __init__(self, node_id: str, env: Mapping[str, str] | None = None) -> None:
        self.node_id = node_id
        self.host = socket.gethostname()
        self._fixed = env is not None
        self._env = node_environment() if env is None else dict(env)
        self._settings_seen = _stamp(self._env)
        self._clock = time.monotonic
        self._trees = NodeTrees(clock=self._clock)
        self._guard = Guard(env=self._env)
        self._cooldown = Cooldown(self._clock)
        self._steps: deque[NodeStep] = deque(maxlen=STEPS_KEPT)
        self._monitor = PressureMonitor(
            target=self._trees,
            read=self._reading,
            cooldown=self._cooldown,
            settings=lambda: read_pressure_settings(self._env),
            pace=MonitorPace(clock=self._clock, arm=arm_container),
            on_step=self._note,
        )
        self._warning: str | None = None
        self._started = False

    def start(self) -> str | None:
        """Start reading (once); the word on Ray's threshold, None when all is well."""
        if not self._started:
            self._started = True
            reading = self._reading()
            self._warning = None if reading is None else ray_acts_first(self._env, reading)
            if self._warning is not None:
                log.warning("node %s: %s", self.host, self._warning)
            self._monitor.start()
        return self._warning

    def _reading(self) -> Reading | None:
        """The node's reading, under its settings as they are now: the node's settings file
        is read again when it changed, as each job's guard reads it afresh."""
        if not self._fixed and _stamp(self._env) != self._settings_seen:
            self._env = node_environment()
            self._settings_seen = _stamp(self._env)
            self._guard = Guard(env=self._env)
        return self._guard.pressure_reading()

    def holds(self) -> str | None:
        """Why the node holds launches now, in words; None when a job may start."""
        left = self._cooldown.remaining()
        cooling = f"cooldown after a stop for memory pressure, {left:.0f} s left"
        if self._trees.holding:
            suspended = len(self._trees.suspended())
            why = "its pressure monitor holds launches"
            why += f" ({suspended} job(s) suspended there)" if suspended else ""
            return why + (f", {cooling}" if left > 0 else "")
        return cooling if left > 0 else None

    def track(
        self,
        job_id: str,
        pid: int,
        estimate: int,
        restartable: bool,
        last_run: bool,
        runs_again: bool = False,
    ) -> None:
        """A runner's tree began: follow it from now on (``runs_again``: a stop for pressure
        queues it again, so the ladder may stop it, frozen, to let an older one go on)."""
        self._trees.track(
            _Tree(
                job_id,
                pid,
                self._clock(),
                max(0, estimate),
                restartable,
                last_run,
                runs_again=runs_again,
            )
        )

    def ended(self, job_id: str) -> PressureStop | None:
        """A runner's tree ended: how the watch stopped it, None when it did not."""
        return self._trees.forget(job_id)

    def ours(self) -> int:
        """What the trees run here hold together, as last read: the room a re-run would have
        with none of them is the node's line less the rest of its use."""
        return self._trees.ours()

    def report(self) -> NodeReport:
        """The steps since the last report, and whether the node holds now."""
        steps = []
        while self._steps:
            steps.append(self._steps.popleft())
        cooling = self._cooldown.remaining()
        return NodeReport(
            node_id=self.node_id,
            host=self.host,
            holding=self._trees.holding or cooling > 0,
            cooling_s=cooling,
            suspended=tuple(self._trees.suspended()),
            steps=tuple(steps),
            warning=self._warning,
        )

    def close(self) -> None:
        """Stop reading."""
        self._monitor.close()

    def _note(self, event: ReliefEvent) -> None:
        self._steps.append(
            NodeStep(
                node_id=self.node_id,
                host=self.host,
                step=event.step.value,
                job_id=event.job_id,
                used_bytes=event.used_bytes,
                limit_bytes=event.limit_bytes,
                footprint_bytes=event.footprint_bytes,
                reaction_s=event.reaction_s,
                why=event.why,
                never_fits=event.never_fits,
            )
        )

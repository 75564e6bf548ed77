"""The Ray backend: where the gateway's admitted jobs go when ROOMKEEPER_BACKEND=ray.

:class:`RayBackend` connects to the cluster (ROOMKEEPER_RAY_ADDRESS), and gives
the scheduler its two seams: :meth:`RayBackend.place`, asked instead of the
gateway's guard (the jobs do not run in the gateway's container), and
:meth:`RayBackend.launch`, the launcher.

Placement keeps our fairness in our queue, not in Ray's: a job is sent only
when some live node could hold its memory estimate now, counting what our own
jobs already hold there; a job larger than every node waits with that said,
for a larger node to join.  Launched, a job is one Ray task
(:func:`~roomkeeper.cluster.node.run_job`) with ``memory`` = its estimate,
``num_cpus`` = ROOMKEEPER_RAY_JOB_CPUS and ``max_retries=0`` (the journal,
not Ray, decides what may run again), and its deadline is the time it has
left.  Its output comes back in pieces as it is written, at most
:data:`~roomkeeper.cluster.output.IN_FLIGHT_CHUNKS` of them sent and not yet
taken (the task's generator backpressure; :mod:`roomkeeper.cluster.output`);
a stopped job's rest is fetched by a small task pinned to its node
(:func:`~roomkeeper.cluster.output.collect_output`, no CPU asked, so a full
node runs it too).  A task, not an actor: Ray runs it on a pooled worker, where an actor
would start a fresh worker process for every job (about 3 s a job on the
2-core development machine, against tens of milliseconds).

:meth:`RayBackend.nodes` is each node's memory, our jobs there, and the
headroom its guard last read, for ``/v1/status``, the Health page and ``/metrics``.

Nothing of Ray's runs under the scheduler's lock or on the event loop, and
nothing waits for Ray without a deadline: the node table is read by a
thread of its own (:data:`NODES_FRESH_S`), and placement and the views use
the last table read; each job's task is sent and followed by its handle's
own thread (:mod:`roomkeeper.cluster.handle`).  When the table has not been
read for :data:`UNREACHABLE_AFTER_S` (the head is gone, or frozen), the
cluster is *unreachable*: placement refuses with that reason, so jobs wait
instead of failing, and needs-you says ``cluster unreachable``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roomkeeper.cluster.handle import RayHandle
from roomkeeper.cluster.node import Begun, NodeJob, run_job, warm_worker
from roomkeeper.cluster.output import IN_FLIGHT_CHUNKS, collect_output
from roomkeeper.cluster.ray_import import load_ray
from roomkeeper.cluster.watch import NodeStep
from roomkeeper.cluster.watches import NodeWatches
from roomkeeper.errors import UsageError
from roomkeeper.guard.rule import Decision, Reason, Word
from roomkeeper.jobs.spec import SchedulerReason
from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.relief.ladder import PressureReason
from roomkeeper.units import GB

log = logging.getLogger("roomkeeper")

NODES_FRESH_S = 1.0  # how often Ray's node table is read
WATCH_START_POLL_S = 0.05  # how often a node's watch still starting is asked whether it runs
UNREACHABLE_AFTER_S = 5.0  # no table read for this long: the cluster is unreachable
CONNECT_TIMEOUT_S = 5.0  # for the head's port to accept a connection
INIT_TIMEOUT_S = 60.0  # for ray.init to connect the gateway as the cluster's driver
SHUTDOWN_TIMEOUT_S = 10.0  # for ray.shutdown when the gateway stops
NAMESPACE = "roomkeeper"


class ClusterReason(Word):
    """Why placement on the cluster holds a job back, beside the rule's and the scheduler's."""

    CLUSTER_UNREACHABLE = "cluster_unreachable", "cluster unreachable: waiting for it to answer"


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node of the cluster as the gateway sees it.

    Attributes:
        node_id: Ray's id of the node.
        address: its address in the cluster.
        alive: whether Ray counts it alive.
        memory_bytes: its Ray ``memory`` resource (what Ray may place there).
        cpus: its Ray ``CPU`` resource.
        reserved_bytes: what our jobs running there hold of it (their estimates).
        jobs: our jobs running there.
        headroom_bytes: its memory line less its use, as its guard last read it
            (when a job was judged there); None before any.
        headroom_at: when that was read (wall-clock seconds).
        held: its pressure monitor holds launches now (past its line, its cooldown, or a
            tree suspended there): placement passes it over.
        suspended_jobs: our trees suspended there (still holding their memory).
        steps: how many steps of the ladder its monitor took, by step, since we connected.
    """

    node_id: str
    address: str
    alive: bool
    memory_bytes: int
    cpus: float
    reserved_bytes: int
    jobs: int
    headroom_bytes: int | None
    headroom_at: float | None
    held: bool = False
    suspended_jobs: int = 0
    steps: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class _Placed:
    node_id: str
    memory_bytes: int


def _check_answers(address: str) -> None:
    """Fail at once when nothing listens at the head's address.

    ``ray.init`` itself waits minutes for an absent head, and a gateway
    start that hangs says nothing.

    Raises:
        UsageError: no connection within CONNECT_TIMEOUT_S.
    """
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise UsageError(
            f"no Ray cluster answers at ROOMKEEPER_RAY_ADDRESS={address!r} ({err}); start its "
            "head with `ray start --head --port PORT`, or fix the address",
            name="ROOMKEEPER_RAY_ADDRESS",
            value=address,
        ) from err


def _gb(value: int) -> str:
    return f"{value / GB:.2f} GB"


def node_job(job_id: str, spec: LaunchSpec, *, watched: bool) -> NodeJob:
    """What a node is sent of a launch: the command, its estimates, the time it has left, and
    what its node's ladder needs to judge it (``watched``: the node runs a watch)."""
    return NodeJob(
        job_id=job_id,
        argv=tuple(spec.argv) if not isinstance(spec.argv, str) else (spec.argv,),
        shell=spec.shell,
        cwd=spec.cwd,
        env=None if spec.env is None else dict(spec.env),
        nice=spec.nice,
        memory_bytes=spec.memory_bytes,
        disk_bytes=spec.disk_bytes,
        deadline_s=spec.deadline_s,
        restartable=spec.restartable,
        last_run=spec.last_run,
        rerun_peak=spec.rerun_peak,
        runs_again=spec.runs_again,
        watched=watched,
    )


class RayBackend:
    """The cluster connection, the placement check and the per-node table.

    Args:
        address: the head's ``HOST:PORT``.
        job_cpus: the ``num_cpus`` each job asks for.
        wall: wall-clock seconds (when a headroom was read).
        watch_nodes: run a pressure monitor on every node (:mod:`roomkeeper.cluster.watch`);
            without, nothing watches a job once its node admitted it.

    Raises:
        UsageError: Ray is not installed, or the cluster does not answer at ``address``.
    """

    def __init__(
        self,
        address: str,
        *,
        job_cpus: float = 1.0,
        wall: Callable[[], float] = time.time,
        watch_nodes: bool = True,
    ) -> None:
        self._ray = load_ray()
        self.on_step: Callable[[NodeStep], None] | None = None  # told of each node's steps
        self._watches = NodeWatches(self._ray, NAMESPACE) if watch_nodes else None
        self.address = address
        self._job_cpus = job_cpus
        self._wall = wall
        self._lock = threading.Lock()
        self._placed: dict[str, _Placed] = {}
        self._sent: dict[str, int] = {}  # launched, node not known yet: job -> estimate
        self._headroom: dict[str, tuple[int, float]] = {}
        self._nodes: list[dict[str, Any]] = []
        self._resources: dict[str, dict[str, float]] = {}  # as each node last listed them
        self._nodes_at = time.monotonic()  # when the table was last read (or we connected)
        self._closing = threading.Event()
        _check_answers(address)
        try:
            within(INIT_TIMEOUT_S, "connecting to the Ray cluster", self._connect)
        except Exception as err:
            raise UsageError(
                f"no Ray cluster answers at ROOMKEEPER_RAY_ADDRESS={address!r} ({err}); "
                "start its head with `ray start --head --port PORT` or fix the address",
                name="ROOMKEEPER_RAY_ADDRESS",
                value=address,
            ) from err
        self._task = self._ray.remote(run_job)
        self._collect_task = self._ray.remote(collect_output)
        self._warm_task = self._ray.remote(warm_worker)
        self._warmed: set[str] = set()  # nodes whose workers were started as they joined
        self._warm_refused: set[str] = set()  # nodes whose warm-ups Ray refused (said once)
        with contextlib.suppress(Exception):  # a first table now; the thread keeps it fresh
            within(CONNECT_TIMEOUT_S, "reading the Ray node table", self._read_nodes)
        self._reader = threading.Thread(target=self._keep_reading, name="ray-nodes", daemon=True)
        self._reader.start()
        log.info("jobs run on the Ray cluster at %s", address)

    def _connect(self) -> None:
        self._ray.init(
            address=self.address,
            namespace=NAMESPACE,
            log_to_driver=False,
            logging_level=logging.WARNING,
            ignore_reinit_error=True,
        )

    # -------------------------------------------------------------- placement

    def _read_nodes(self) -> None:
        """Read Ray's node table (a call to the head, which may block while it is frozen)."""
        nodes = list(self._ray.nodes())
        with self._lock:
            self._nodes = nodes
            self._nodes_at = time.monotonic()
            for n in nodes:  # a lost node's resources are no longer listed
                if n.get("Alive") and n.get("Resources"):
                    self._resources[n["NodeID"]] = dict(n["Resources"])

    def _keep_reading(self) -> None:
        """The node table, read every NODES_FRESH_S on this thread, never under a caller's lock.

        The nodes' watches are tended at once (from the first table read at
        connect), and every :data:`WATCH_START_POLL_S` while one is starting:
        placement passes over a node until its watch runs, so each second
        waited here would be a second every first job waits.
        """
        failing = False
        pause = 0.0  # the first table was read as we connected
        read_at = time.monotonic()
        while not self._closing.wait(pause):
            try:
                if time.monotonic() - read_at >= NODES_FRESH_S:
                    read_at = time.monotonic()
                    self._read_nodes()
                self._warm_new_nodes()
                self._tend_watches()
            except Exception as err:
                if not failing:
                    log.warning("the Ray cluster's node table could not be read: %s", err)
                failing = True
                continue
            finally:
                starting = self._watches is not None and self._watches.starting()
                pause = WATCH_START_POLL_S if starting else NODES_FRESH_S
            if failing:
                log.warning("the Ray cluster at %s answers again", self.address)
            failing = False

    def unreachable(self) -> str | None:
        """Why the cluster counts as unreachable now, in words; None while it answers."""
        with self._lock:
            silent = time.monotonic() - self._nodes_at
        if silent < UNREACHABLE_AFTER_S:
            return None
        return (
            f"the Ray cluster at {self.address} has not answered for {silent:.0f} s; "
            "jobs wait for it"
        )

    def _live_nodes(self) -> list[dict[str, Any]]:
        """The live nodes of the last table read."""
        with self._lock:
            return [n for n in self._nodes if n.get("Alive")]

    def _reserved_on(self, node_id: str) -> int:
        """Our jobs' estimates there; a suspended tree counts with all it holds, when more."""
        held = {} if self._watches is None else self._watches.suspended(node_id)
        return sum(
            max(p.memory_bytes, held.get(job_id, 0))
            for job_id, p in self._placed.items()
            if p.node_id == node_id
        )

    def _warm_new_nodes(self) -> None:
        """Start the workers of each node that joined, one per CPU (what Ray keeps idle).

        A job sent to a node with no idle worker waits for one to start: on a
        busy 2-core machine its process began 4.1 to 5.5 s after it was sent,
        against at most 0.3 s with workers ready.  The warm-ups are sent once per node, hold
        none of its CPUs (a job sent meanwhile is queued by none of them), and
        are not waited for.  A node whose warm-ups Ray refused is said once and
        tried again at the next read; nothing else waits on it.
        """
        strategy = self._ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        for n in self._live_nodes():
            node_id, cpus = n["NodeID"], float(n["Resources"].get("CPU", 0))
            if node_id in self._warmed or cpus < self._job_cpus or self._closing.is_set():
                continue
            try:
                options = self._warm_task.options(
                    num_cpus=0,
                    max_retries=0,
                    scheduling_strategy=strategy(node_id, soft=False),
                )
                for _ in range(max(1, math.ceil(cpus))):
                    options.remote()
            except Exception as err:
                if node_id not in self._warm_refused:
                    log.warning("the workers of Ray node %s could not be started: %s", node_id, err)
                self._warm_refused.add(node_id)
                continue
            self._warmed.add(node_id)

    def _tend_watches(self) -> None:
        """Start a watch on each new node, take each one's report, pass its steps on."""
        if self._watches is None:
            return
        live = [
            n["NodeID"]
            for n in self._live_nodes()
            if n["Resources"].get("CPU", 0) >= self._job_cpus
        ]
        for step in self._watches.tend(live):
            if self.on_step is not None:
                try:
                    self.on_step(step)
                except Exception:  # recording a node's step must not stop the next
                    log.exception("recording a step of node %s failed", step.host)

    def place(self, job_id: str, memory_bytes: int) -> Decision:
        """Whether some live node could hold ``memory_bytes`` now; the decision says which.

        Refused, with the reason it waits for, when the cluster is unreachable
        (``cluster_unreachable``), when no live node is that large (``memory``,
        set aside until a larger node joins), when every node large enough is
        full of our own jobs' memory (``memory``), or when each of them has
        every CPU taken by our own jobs (``cpu``).
        """
        silent = self.unreachable()
        if silent is not None:
            return Decision(
                job_id,
                False,
                ClusterReason.CLUSTER_UNREACHABLE,
                silent,
                estimate_bytes=memory_bytes,
            )
        nodes = [n for n in self._live_nodes() if n["Resources"].get("CPU", 0) >= self._job_cpus]
        sizes = [int(n["Resources"].get("memory", 0)) for n in nodes]
        held = self._held_nodes([n["NodeID"] for n in nodes])
        ask = f"{_gb(memory_bytes)} of memory and {self._job_cpus:g} CPU"
        if not sizes or max(sizes) < memory_bytes:
            largest = _gb(max(sizes)) if sizes else "none"
            summary = (
                f"no node of the Ray cluster offers {ask} (largest: {largest}, "
                f"{len(nodes)} nodes); waiting for a larger node"
            )
            return Decision(
                job_id, False, Reason.MEMORY, summary, estimate_bytes=memory_bytes, aside=True
            )
        with self._lock:
            room = [
                size - self._reserved_on(n["NodeID"]) for n, size in zip(nodes, sizes, strict=True)
            ]
            cpus = [float(n["Resources"].get("CPU", 0)) - self._cpus_on(n["NodeID"]) for n in nodes]
            # Sent, not begun yet: where it lands is Ray's to choose, so each is counted
            # (memory and a CPU) on the node with the most room that could take it.
            for estimate in sorted(self._sent.values(), reverse=True):
                takers = [
                    i
                    for i in range(len(nodes))
                    if room[i] >= estimate and cpus[i] >= self._job_cpus
                ]
                if takers:
                    most = max(takers, key=lambda i: room[i])
                    room[most] -= estimate
                    cpus[most] -= self._job_cpus
        large = [i for i, r in enumerate(room) if r >= memory_bytes]
        if large and all(nodes[i]["NodeID"] in held for i in large):
            summary = (
                f"every node with room for {ask} is held by its pressure monitor "
                f"({'; '.join(sorted({held[nodes[i]['NodeID']] for i in large}))}); "
                "waiting for one to be free"
            )
            return Decision(
                job_id, False, PressureReason.PRESSURE, summary, estimate_bytes=memory_bytes
            )
        large = [i for i in large if nodes[i]["NodeID"] not in held]
        if not large:
            summary = (
                f"every node that could hold {ask} is full of running jobs "
                f"(most room: {_gb(max(0, *room))}); waiting for one to end"
            )
            return Decision(job_id, False, Reason.MEMORY, summary, estimate_bytes=memory_bytes)
        fits = [i for i in large if cpus[i] >= self._job_cpus]
        if not fits:
            summary = (
                f"every CPU of the {len(large)} Ray nodes with room for {ask} is taken "
                "by our running or just-sent jobs; waiting for one to end"
            )
            return Decision(
                job_id, False, SchedulerReason.CPU, summary, estimate_bytes=memory_bytes
            )
        summary = f"{len(fits)} of {len(nodes)} Ray nodes have room for {ask}"
        # The line a re-run's grown estimate stays under: no node offers Ray more, so an
        # estimate above it would wait for a larger node that may never join.
        return Decision(
            job_id,
            True,
            Reason.OK,
            summary,
            estimate_bytes=memory_bytes,
            memory_line_bytes=max(sizes),
        )

    def _held_nodes(self, node_ids: list[str]) -> dict[str, str]:
        """The nodes placement passes over now, and why: their monitor holds launches (a
        step of the ladder, its cooldown), or has not started yet."""
        if self._watches is None:
            return {}
        return self._watches.held(node_ids)

    def _cpus_on(self, node_id: str) -> float:
        return self._job_cpus * sum(1 for p in self._placed.values() if p.node_id == node_id)

    # --------------------------------------------------------------- launching

    def launch(self, job_id: str, spec: LaunchSpec) -> RayHandle:
        """Send the job to the cluster: one runner task with its estimate and CPU need."""
        job = node_job(job_id, spec, watched=self._watches is not None)
        options = self._task.options(
            memory=max(1, spec.memory_bytes),
            num_cpus=self._job_cpus,
            max_retries=0,
            retry_exceptions=False,
            num_returns="streaming",
            _generator_backpressure_num_objects=IN_FLIGHT_CHUNKS,
        )
        with self._lock:
            self._sent[job_id] = spec.memory_bytes
        # Sent by the handle's own thread: the scheduler calls this with its lock held.
        return RayHandle(
            self._ray,
            lambda: options.remote(job),
            job,
            log_path=spec.log_path,
            on_begun=self._begun,
            on_closed=self._closed,
            collect=self._collect,
        )

    def _collect(self, node_id: str, directory: str, offset: int, wait_s: float) -> Any:
        """Send the task that fetches a stopped job's output from its node; its answers."""
        strategy = self._ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        options = self._collect_task.options(
            num_cpus=0,
            max_retries=0,
            retry_exceptions=False,
            num_returns="streaming",
            _generator_backpressure_num_objects=IN_FLIGHT_CHUNKS,
            scheduling_strategy=strategy(node_id, soft=False),
        )
        return options.remote(directory, offset, wait_s)

    def _begun(self, job_id: str, begun: Begun) -> None:
        with self._lock:
            estimate = self._sent.pop(job_id, 0)
            self._placed[job_id] = _Placed(begun.node_id, estimate)
            if begun.headroom_bytes is not None:
                self._headroom[begun.node_id] = (begun.headroom_bytes, self._wall())

    def _closed(self, job_id: str) -> None:
        with self._lock:
            self._sent.pop(job_id, None)
            self._placed.pop(job_id, None)

    # ------------------------------------------------------------------ views

    def nodes(self) -> list[NodeView]:
        """Every node of the last table read (live or lost), our jobs and its last headroom."""
        watched = self._watches
        with self._lock:
            views = []
            for n in self._nodes:
                node_id = n["NodeID"]
                headroom = self._headroom.get(node_id)
                resources = n.get("Resources") or self._resources.get(node_id, {})
                views.append(
                    NodeView(
                        node_id=node_id,
                        address=str(n.get("NodeManagerAddress", "")),
                        alive=bool(n.get("Alive")),
                        memory_bytes=int(resources.get("memory", 0)),
                        cpus=float(resources.get("CPU", 0)),
                        reserved_bytes=self._reserved_on(node_id),
                        jobs=sum(1 for p in self._placed.values() if p.node_id == node_id),
                        headroom_bytes=None if headroom is None else headroom[0],
                        headroom_at=None if headroom is None else headroom[1],
                        held=node_id in watched.held([node_id]) if watched else False,
                        suspended_jobs=len(watched.suspended(node_id)) if watched else 0,
                        steps=watched.steps(node_id) if watched else (),
                    )
                )
            return views

    def close(self) -> None:
        """Disconnect from the cluster (running jobs were stopped by the scheduler first)."""
        self._closing.set()
        self._reader.join(timeout=NODES_FRESH_S)  # not reading the table while Ray shuts down
        try:
            within(SHUTDOWN_TIMEOUT_S, "disconnecting from the Ray cluster", self._ray.shutdown)
        except Exception as err:  # a frozen head must not hold the gateway's stop
            log.warning("%s", err)


def within(seconds: float, what: str, call: Callable[[], Any]) -> Any:
    """Run ``call`` on a thread of its own; its value, or TimeoutError after ``seconds``.

    A call that never returns is left on its (daemon) thread: nothing waits for it.

    Raises:
        TimeoutError: ``call`` did not return in time (``what`` says what it was doing).
        Exception: what ``call`` raised.
    """
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = call()
        except BaseException as err:
            done["error"] = err

    thread = threading.Thread(target=run, name=f"ray-call: {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} took more than {seconds:g} s")
    if "error" in done:
        raise done["error"]
    return done.get("value")

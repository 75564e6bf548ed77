"""The Ray backend's placement beside its nodes' pressure monitors, and the warning on Ray's
own memory monitor: fast checks with Ray's node table and the watches stood in for.

The real thing (a 3-node cluster in memory groups, each node's ladder
acting) is ``test_ray_pressure.py``; here only the decisions are checked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from roomkeeper.cluster import backend as backend_module
from roomkeeper.cluster.backend import RayBackend, node_job
from roomkeeper.cluster.watch import ray_acts_first
from roomkeeper.guard.lines import Reading
from roomkeeper.jobs.reruns import rerun_estimate
from roomkeeper.processes.launch import LaunchSpec

MB = 1_000_000
GIB = 1 << 30
BIG, SMALL, LATE, OTHER = "b" * 56, "5" * 56, "7" * 56, "0" * 56  # Ray node ids are hex


@dataclass(frozen=True)
class Affinity:
    node_id: str
    soft: bool


@dataclass
class RecordedTask:
    """A remote function whose sends are recorded, never run."""

    ray: TableOnlyRay
    name: str
    chosen: dict[str, Any] = field(default_factory=dict)

    def options(self, **chosen: Any) -> RecordedTask:
        return RecordedTask(self.ray, self.name, chosen)

    def remote(self, *args: Any) -> None:
        strategy = self.chosen.get("scheduling_strategy")
        if strategy is not None and strategy.node_id in self.ray.refusing:
            raise RuntimeError("the raylet refused the task")
        self.ray.sent.append((self.name, self.chosen))


class TableOnlyRay:
    """Ray as the backend's constructor and placement use it: a fixed node table, and tasks
    sent recorded, never run."""

    def init(self, **_: Any) -> None:
        pass

    def __init__(self, table: list[dict[str, Any]]) -> None:
        self.table = table
        self.sent: list[tuple[str, dict[str, Any]]] = []  # (function name, options) per task
        self.refusing: set[str] = set()  # nodes whose tasks are refused
        self.util = SimpleNamespace(
            scheduling_strategies=SimpleNamespace(NodeAffinitySchedulingStrategy=Affinity)
        )

    def remote(self, function: Any) -> Any:
        return RecordedTask(self, function.__name__)

    def nodes(self) -> list[dict[str, Any]]:
        return self.table

    def shutdown(self) -> None:
        pass


class HeldWatches:
    """The nodes' watches as placement reads them: ``holding`` names the held nodes."""

    holding: ClassVar[dict[str, str]] = {}

    def __init__(self, ray: Any, namespace: str) -> None:
        pass

    def tend(self, live: list[str]) -> list[Any]:
        return []

    def starting(self) -> bool:
        return False

    def held(self, node_ids: list[str]) -> dict[str, str]:
        return {n: self.holding[n] for n in node_ids if n in self.holding}

    def suspended(self, node_id: str) -> dict[str, int]:
        return {}

    def steps(self, node_id: str) -> tuple[tuple[str, int], ...]:
        return ()


def node(node_id: str, memory: int) -> dict[str, Any]:
    return {"NodeID": node_id, "Alive": True, "Resources": {"CPU": 2.0, "memory": memory}}


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TableOnlyRay, RayBackend]]:
    """A backend over ``BIG`` and ``SMALL`` whose tasks are recorded, never run; it reads
    Ray's node table every 0.1 s."""
    ray = TableOnlyRay([node(BIG, 2 * GIB), node(SMALL, 300 * MB)])
    monkeypatch.setattr(backend_module, "NODES_FRESH_S", 0.1)
    monkeypatch.setattr(backend_module, "load_ray", lambda: ray)
    monkeypatch.setattr(backend_module, "_check_answers", lambda address: None)
    monkeypatch.setattr(backend_module, "NodeWatches", HeldWatches)
    made = RayBackend("127.0.0.1:1")
    try:
        yield ray, made
    finally:
        made.close()


@pytest.fixture
def backend(
    recorded: tuple[TableOnlyRay, RayBackend], monkeypatch: pytest.MonkeyPatch
) -> RayBackend:
    """A backend over two nodes, ``BIG`` (2 GiB) and ``SMALL`` (300 MB), neither held yet."""
    monkeypatch.setattr(HeldWatches, "holding", {})
    return recorded[1]


def test_placement_passes_over_a_node_its_monitor_holds(backend: RayBackend) -> None:
    """A job both nodes could hold is placed on the one not held: one of two has room."""
    assert backend.place("j1", 100 * MB).summary.startswith("2 of 2 Ray nodes")
    HeldWatches.holding[BIG] = "1 job(s) suspended for memory pressure on it"
    decision = backend.place("j2", 100 * MB)
    assert decision.admit, decision.summary
    assert decision.summary.startswith("1 of 2 Ray nodes"), decision.summary


def test_a_job_only_a_held_node_could_hold_waits_for_pressure(backend: RayBackend) -> None:
    """Only ``BIG`` has room for 1 GB, and its monitor holds: the job waits, reason pressure,
    with the node's words."""
    HeldWatches.holding[BIG] = "memory pressure on it"
    decision = backend.place("j1", 1000 * MB)
    assert not decision.admit
    assert decision.reason.value == "pressure"
    assert "held by its pressure monitor (memory pressure on it)" in decision.summary


def reading(limit: int = GIB) -> Reading:
    return Reading(used=0, limit=limit, headroom_percent=10.0, reserve=0, full_avg10=None, at=0)


def test_rays_default_threshold_is_said_to_kill_first() -> None:
    """Ray's default (0.95) is below a 1 GiB node's stop line (0.975): the warning says so
    and names the value to set."""
    said = ray_acts_first({}, reading())
    assert said is not None
    assert "kills at 0.95" in said
    assert "RAY_memory_usage_threshold=0.99" in said


def test_a_threshold_above_the_stop_line_or_rays_monitor_off_is_no_warning() -> None:
    """0.99 is above the stop line; a refresh of 0 turns Ray's monitor off: nothing to say."""
    assert ray_acts_first({"RAY_memory_usage_threshold": "0.99"}, reading()) is None
    assert ray_acts_first({"RAY_memory_monitor_refresh_ms": "0"}, reading()) is None


def test_a_threshold_that_is_not_a_number_is_said() -> None:
    """A threshold Ray could not read is said as it was written."""
    said = ray_acts_first({"RAY_memory_usage_threshold": "high"}, reading())
    assert said == "RAY_memory_usage_threshold='high' is not a number"


def test_a_placed_job_carries_the_largest_memory_a_node_offers_as_its_line(
    backend: RayBackend,
) -> None:
    """A re-run's grown estimate stays under the line its admission carried: on a cluster it
    is the most ``memory`` any live node offers Ray, so the re-run is never left waiting for
    a larger node (the grown estimates were seen waiting for ever above a 600 MB offer)."""
    decision = backend.place("j1", 100 * MB)
    assert decision.admit
    assert decision.memory_line_bytes == 2 * GIB
    grown = rerun_estimate(
        failed=100 * MB, peak=1900 * MB, rate=200 * MB, ran_s=5, line=decision.memory_line_bytes
    )
    assert grown == 2 * GIB
    assert backend.place("j1-again", grown).admit


def warmed(ray: TableOnlyRay, count: int) -> list[str]:
    """The nodes warm-ups were sent to, once ``count`` were (10 s at most), then two more
    reads of the node table, which must send no more."""
    deadline = time.monotonic() + 10
    while len(ray.sent) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(2 * backend_module.NODES_FRESH_S)
    warmups = [chosen for name, chosen in ray.sent if name == "warm_worker"]
    assert all(chosen["num_cpus"] == 0 for chosen in warmups)  # no job queues behind one
    assert all(not chosen["scheduling_strategy"].soft for chosen in warmups)
    return sorted(chosen["scheduling_strategy"].node_id for chosen in warmups)


def test_each_node_that_joins_has_its_workers_started_once(
    recorded: tuple[TableOnlyRay, RayBackend],
) -> None:
    """One warm-up per CPU of each node as it joins, pinned there, holding no CPU of Ray's;
    none again for a node already warmed; a node that joins later with 1.5 CPUs gets two."""
    ray, _ = recorded
    assert warmed(ray, 4) == sorted([BIG, BIG, SMALL, SMALL])
    ray.table.append({**node(LATE, GIB), "Resources": {"CPU": 1.5, "memory": GIB}})
    assert warmed(ray, 6) == sorted([BIG, BIG, SMALL, SMALL, LATE, LATE])


def test_a_node_whose_warm_ups_are_refused_is_said_once_and_tried_again(
    recorded: tuple[TableOnlyRay, RayBackend], caplog: pytest.LogCaptureFixture
) -> None:
    """Ray refuses ``LATE``'s warm-ups: one warning naming the node, the table still read
    (a node joining after it is warmed), and ``LATE`` warmed once Ray takes them."""
    ray, _ = recorded
    assert warmed(ray, 4) == sorted([BIG, BIG, SMALL, SMALL])
    ray.refusing.add(LATE)
    ray.table.append(node(LATE, GIB))
    time.sleep(3 * backend_module.NODES_FRESH_S)
    ray.table.append(node(OTHER, GIB))
    assert warmed(ray, 6) == sorted([BIG, BIG, SMALL, SMALL, OTHER, OTHER])
    refusals = [r for r in caplog.records if "could not be started" in r.getMessage()]
    assert len(refusals) == 1 and LATE in refusals[0].getMessage()
    assert "node table could not be read" not in caplog.text
    ray.refusing.clear()
    assert warmed(ray, 8) == sorted([BIG, BIG, SMALL, SMALL, OTHER, OTHER, LATE, LATE])


def test_a_node_is_sent_what_its_ladder_needs_to_judge_the_job() -> None:
    """Restartable, its last run or not, whether a stop would queue it again, a re-run's
    peak: each reaches the node as the scheduler launched it."""
    spec = LaunchSpec(
        argv=["make"],
        log_path="/dev/null",
        memory_bytes=700,
        restartable=True,
        last_run=False,
        rerun_peak=600,
        runs_again=True,
        deadline_s=30.0,
    )
    job = node_job("j", spec, watched=True)
    assert (job.restartable, job.last_run, job.runs_again, job.rerun_peak) == (
        True,
        False,
        True,
        600,
    )
    assert (job.memory_bytes, job.deadline_s, job.watched, job.argv) == (700, 30.0, True, ("make",))
    last = node_job("j", replace(spec, last_run=True, runs_again=False), watched=False)
    assert (last.last_run, last.runs_again, last.watched) == (True, False, False)

"""The gateway's side of the nodes' watches: start one on each node, drain its reports.

:class:`NodeWatches` is the backend's: on each read of Ray's node table it
starts a :class:`~roomkeeper.cluster.watch.NodeWatch` actor on every live
node that can run jobs and has none (named for the node, pinned to it, no
CPU asked, owned by the gateway's driver so that it ends with the gateway),
and takes each watch's last :class:`~roomkeeper.cluster.watch.NodeReport`.
Nothing here waits for Ray: a watch's answer is taken once it is there
(``ray.wait`` with no timeout), and the next is asked for at once.

Placement reads what the reports said: a node whose watch has not started
yet, or holds launches (a step of the ladder, its cooldown, a tree suspended
there), is passed over, and a suspended tree counts with all it held.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from roomkeeper.cluster.node import watch_name
from roomkeeper.cluster.watch import NodeReport, NodeStep, NodeWatch

log = logging.getLogger("roomkeeper")


@dataclass
class _Watched:
    """One node's watch as the gateway follows it."""

    actor: Any
    pending: Any  # the answer asked for and not taken yet: start(), then report()
    started: bool = False
    report: NodeReport | None = None
    steps: Counter[str] = field(default_factory=Counter)


class NodeWatches:
    """The watches of the cluster's nodes, started and drained from the backend's thread.

    Args:
        ray: the ``ray`` module.
        namespace: the gateway's Ray namespace (the watches are named there).
    """

    def __init__(self, ray: Any, namespace: str) -> None:
        self._ray = ray
        self._namespace = namespace
        self._actor = ray.remote(NodeWatch)
        self._lock = threading.Lock()
        self._nodes: dict[str, _Watched] = {}

    def tend(self, live: list[str]) -> list[NodeStep]:
        """Start a watch on each of the ``live`` nodes without one; take every answer that
        came; the steps the nodes reported since the last call."""
        with self._lock:
            for gone in set(self._nodes) - set(live):
                del self._nodes[gone]
            watched = dict(self._nodes)
        steps: list[NodeStep] = []
        for node_id in live:
            found = watched.get(node_id)
            if found is None:
                self._start(node_id)
                continue
            steps += self._take(node_id, found)
        return steps

    def _start(self, node_id: str) -> None:
        strategy = self._ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        try:
            actor = self._actor.options(
                name=watch_name(node_id),
                namespace=self._namespace,
                num_cpus=0,
                scheduling_strategy=strategy(node_id, soft=False),
                get_if_exists=True,
            ).remote(node_id)
            pending = actor.start.remote()
        except Exception as err:  # tried again at the next read of the table
            log.warning("the pressure monitor of node %s could not be started: %s", node_id, err)
            return
        with self._lock:
            self._nodes[node_id] = _Watched(actor, pending)

    def _take(self, node_id: str, watched: _Watched) -> list[NodeStep]:
        """The watch's answer, if it came; ask for its next report."""
        ready, _ = self._ray.wait([watched.pending], timeout=0)
        if not ready:
            return []
        try:
            answer = self._ray.get(watched.pending)
        except Exception as err:  # the watch died (its node, its worker): start it again
            log.warning(
                "the pressure monitor of node %s ended (%s); starting it again", node_id, err
            )
            with self._lock:
                self._nodes.pop(node_id, None)
            return []
        steps: list[NodeStep] = []
        with self._lock:
            if isinstance(answer, NodeReport):
                watched.report = answer
                steps = list(answer.steps)
                watched.steps.update(s.step for s in steps)
            elif not watched.started:
                watched.started = True
                log.info("node %s: its pressure monitor runs", node_id[:12])
                if isinstance(answer, str):  # Ray's own monitor is set to kill first
                    log.warning("node %s: %s", node_id[:12], answer)
            watched.pending = watched.actor.report.remote()
        return steps

    def starting(self) -> bool:
        """Whether some node's watch was started and has not said it runs yet."""
        with self._lock:
            return any(not w.started for w in self._nodes.values())

    def held(self, node_ids: list[str]) -> dict[str, str]:
        """Of ``node_ids``, those placement passes over now, each with why in words."""
        held: dict[str, str] = {}
        with self._lock:
            for node_id in node_ids:
                watched = self._nodes.get(node_id)
                if watched is None or not watched.started:
                    held[node_id] = "its pressure monitor is not running yet"
                elif watched.report is not None and watched.report.holding:
                    held[node_id] = _holding(watched.report)
        return held

    def suspended(self, node_id: str) -> dict[str, int]:
        """The suspended trees on the node and what each holds, as last reported."""
        with self._lock:
            watched = self._nodes.get(node_id)
            if watched is None or watched.report is None:
                return {}
            return dict(watched.report.suspended)

    def steps(self, node_id: str) -> tuple[tuple[str, int], ...]:
        """How many steps of each kind the node's monitor reported, by step."""
        with self._lock:
            watched = self._nodes.get(node_id)
            return () if watched is None else tuple(sorted(watched.steps.items()))


def _holding(report: NodeReport) -> str:
    """Why a node holds launches, in words."""
    if report.suspended:
        return f"{len(report.suspended)} job(s) suspended for memory pressure on it"
    if report.cooling_s > 0:
        return f"cooldown after a stop for memory pressure, {report.cooling_s:.0f} s left"
    return "memory pressure on it"

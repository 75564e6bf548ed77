"""``GET /metrics``: Prometheus text exposition, computed at scrape time.

Names follow Prometheus conventions (``_bytes``, ``_seconds``, ``_total``)
and no label takes unbounded values: no owner, job or lease ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from roomkeeper.gateway.waits import WAIT_BUCKETS
from roomkeeper.guard.rule import ADMITTING_REASONS, Reason
from roomkeeper.jobs.spec import JobState, SchedulerReason
from roomkeeper.jobserver.meter import JobserverStatistics, TokenReason
from roomkeeper.relief.monitor import MonitorStatistics

if TYPE_CHECKING:
    from roomkeeper.gateway.service import Gateway


class GatewayCollector(Collector):
    """Reads the gateway's state when Prometheus scrapes."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        g = self._gateway
        sample = g.samples[-1] if g.samples else g.sample()
        for suffix, doc, value in (
            ("memory_used_bytes", "Memory held that cannot be given back.", sample.used_bytes),
            ("memory_limit_bytes", "The effective memory limit.", sample.limit_bytes),
            ("memory_line_bytes", "Limit less headroom and reserve.", sample.line_bytes),
            ("disk_free_bytes", "Free space of the workspace volume.", sample.disk_free_bytes),
        ):
            if value is not None:
                yield GaugeMetricFamily(f"roomkeeper_{suffix}", doc, value=value)
        stats = g.scheduler.statistics()
        jobs = GaugeMetricFamily("roomkeeper_jobs", "Jobs by state in this run.", labels=["state"])
        counts = {
            JobState.WAITING.value: stats.waiting,
            JobState.RUNNING.value: stats.running - stats.suspended,
            JobState.SUSPENDED.value: stats.suspended,
        }
        counts.update(stats.ended)
        for state in JobState:
            jobs.add_metric([state.value], counts.get(state.value, 0))
        yield jobs
        decisions = g.guard.statistics().decisions
        admitted = CounterMetricFamily(
            "roomkeeper_admissions",
            "Admissions by reason (ok, off, no_container).",
            labels=["reason"],
        )
        refused = CounterMetricFamily(
            "roomkeeper_refusals", "Refusals by reason.", labels=["reason"]
        )
        for reason in ADMITTING_REASONS:
            admitted.add_metric([reason.value], decisions.get(reason.value, 0))
        for reason in Reason:  # every other reason of the rule refuses
            if reason not in ADMITTING_REASONS:
                refused.add_metric([reason.value], decisions.get(reason.value, 0))
        # CPU pressure holds a launch before the guard is asked: the scheduler counts it.
        cpu = SchedulerReason.CPU.value
        refused.add_metric([cpu], stats.refusals.get(cpu, 0))
        yield admitted
        yield refused
        cumulative = list(
            zip((str(b) for b in WAIT_BUCKETS), g.durable_jobs.waits.buckets, strict=True)
        )
        yield HistogramMetricFamily(
            "roomkeeper_queue_wait_seconds",
            "Time from submission to start.",
            buckets=[*cumulative, ("+Inf", g.durable_jobs.waits.count)],
            sum_value=g.durable_jobs.waits.sum,
        )
        yield from _pressure_metrics(g.scheduler.pressure_statistics())
        leases = GaugeMetricFamily(
            "roomkeeper_leases", "Leases by state in this run.", labels=["state"]
        )
        for lease_state, count in g.leases.counts().items():
            leases.add_metric([lease_state], count)
        yield leases
        yield CounterMetricFamily(
            "roomkeeper_leases_ended_without_hook",
            "Leases that ended with no release hook (their sessions may stay).",
            value=g.leases.ended_without_hook(),
        )
        yield from _baseline_metrics(g)
        yield from _node_metrics(g)
        yield from _jobserver_metrics(g.scheduler.jobserver_statistics().values())


def _jobserver_metrics(pools: Iterable[JobserverStatistics]) -> Iterator[GaugeMetricFamily]:
    """The running jobs' jobservers, summed (no job id is a label): tokens out, the largest
    step estimate, and how many jobs' last round ended with each reason."""
    pools = list(pools)
    for suffix, doc, value in (
        ("jobs", "Running jobs with a jobserver.", len(pools)),
        ("tokens_out", "Tokens their build tools hold now.", sum(p.tokens_out for p in pools)),
        ("tokens_idle", "Tokens waiting unused in their FIFOs.", sum(p.idle for p in pools)),
        (
            "step_bytes_max",
            "The largest step estimate among them.",
            max((p.step_bytes for p in pools), default=0),
        ),
        ("claim_bytes", "What the guard holds for their steps.", sum(p.claim_bytes for p in pools)),
        ("tokens_lost", "Tokens lost with dead clients, minted again.", sum(p.lost for p in pools)),
        (
            "steps_paused",
            "Steps paused until they can finish below the line beside the rest.",
            sum(p.paused for p in pools),
        ),
    ):
        yield GaugeMetricFamily(f"roomkeeper_jobserver_{suffix}", doc, value=value)
    reasons = GaugeMetricFamily(
        "roomkeeper_jobserver_reason",
        "Running jobs by why their last round gave a token or not (no_room: the guard refused, "
        "a step might not finish below the line, or another job waits for memory).",
        labels=["reason"],
    )
    for reason in TokenReason:
        reasons.add_metric([reason.value], sum(1 for p in pools if p.reason is reason))
    yield reasons


def _baseline_metrics(g: Gateway) -> Iterator[GaugeMetricFamily]:
    """Memory no live work explains, and whether it is said not to come back."""
    watch = g.baseline.watch.statistics()
    if watch.baseline_bytes is not None:
        yield GaugeMetricFamily(
            "roomkeeper_memory_baseline_bytes",
            "Used memory less our running jobs' footprints and granted leases' reservations.",
            value=watch.baseline_bytes,
        )
    yield GaugeMetricFamily(
        "roomkeeper_memory_not_given_back",
        "1 while the baseline has stayed up across job and lease endings.",
        value=int(watch.not_given_back),
    )


def _node_metrics(g: Gateway) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Per Ray node (the ray backend only; a cluster's nodes are few): jobs and memory."""
    nodes = g.nodes()
    if not nodes:
        return
    jobs = GaugeMetricFamily("roomkeeper_node_jobs", "Our jobs running on a node.", labels=["node"])
    memory = GaugeMetricFamily(
        "roomkeeper_node_memory_bytes", "A node's Ray memory resource.", labels=["node"]
    )
    reserved = GaugeMetricFamily(
        "roomkeeper_node_reserved_bytes", "Estimates of our jobs on a node.", labels=["node"]
    )
    headroom = GaugeMetricFamily(
        "roomkeeper_node_headroom_bytes",
        "A node's memory line less its use, as its guard last read it.",
        labels=["node"],
    )
    held = GaugeMetricFamily(
        "roomkeeper_node_held",
        "1 while a node's own pressure monitor holds launches there.",
        labels=["node"],
    )
    steps = CounterMetricFamily(
        "roomkeeper_node_pressure_steps",
        "Steps of the relief ladder a node's own pressure monitor took.",
        labels=["node", "step"],
    )
    for n in nodes:
        for step, count in n.steps:
            steps.add_metric([n.node_id, step], count)
        if not n.alive:
            continue
        held.add_metric([n.node_id], int(n.held))
        jobs.add_metric([n.node_id], n.jobs)
        memory.add_metric([n.node_id], n.memory_bytes)
        reserved.add_metric([n.node_id], n.reserved_bytes)
        if n.headroom_bytes is not None:
            headroom.add_metric([n.node_id], n.headroom_bytes)
    yield from (jobs, memory, reserved, headroom, held, steps)


def _pressure_metrics(
    pressure: MonitorStatistics,
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The relief ladder's steps and its reaction times."""
    steps = CounterMetricFamily(
        "roomkeeper_pressure_steps", "Relief ladder steps taken, by step.", labels=["step"]
    )
    for step, count in (
        ("hold", pressure.holds),
        ("suspend", pressure.suspensions),
        ("resume", pressure.resumes),
        ("stop", pressure.stops),
        ("rerun", pressure.reruns),
        ("relieve", pressure.relieves),
    ):
        steps.add_metric([step], count)
    yield steps
    yield CounterMetricFamily(
        "roomkeeper_leases_relieved",
        "Leases whose holders ended their turn when asked and whose memory came back.",
        value=pressure.relieved,
    )
    yield CounterMetricFamily(
        "roomkeeper_trial_pauses",
        "Pauses of pack jobs on trial (packing, not a relief step).",
        value=pressure.trial_pauses,
    )
    for suffix, doc, value in (
        (
            "p50",
            "Median reaction time, crossing to the step that answered it.",
            pressure.reaction_p50_s,
        ),
        (
            "max",
            "Longest reaction time, crossing to the step that answered it.",
            pressure.reaction_max_s,
        ),
    ):
        if value is not None:
            yield GaugeMetricFamily(f"roomkeeper_pressure_reaction_{suffix}_seconds", doc, value)


def render_metrics(gateway: Gateway) -> tuple[bytes, str]:
    """The exposition text and its content type."""
    registry = CollectorRegistry()
    registry.register(GatewayCollector(gateway))
    return generate_latest(registry), CONTENT_TYPE_LATEST

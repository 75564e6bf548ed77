"""What the gateway says first: needs-you's headline, which leads the Health page too.

A headline comes from a closed vocabulary (:data:`HEADLINES` for the guard's
reasons, :data:`PERSON_HEADLINES` for what needs a person), with the guard's
summary or the numbers as its body: never a path, never a command.  What
needs a person comes first, then what holds admission now, then what
explains why the room keeps shrinking, then the guard's own answer for the
job that waits next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from roomkeeper.config import read_pressure_settings, read_queue_settings
from roomkeeper.gateway.baseline import BaselineKeeper
from roomkeeper.gateway.context import GatewayContext
from roomkeeper.gateway.link import SupervisorLink
from roomkeeper.guard.leases import Leases
from roomkeeper.guard.rule import Decision, Reason, Word, gb
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.spec import SchedulerReason
from roomkeeper.journal.integrity import is_damage
from roomkeeper.kernel.resources import cpu_pressure_percent
from roomkeeper.relief.cooldown import CooldownCause
from roomkeeper.relief.ladder import PressureReason

if TYPE_CHECKING:
    from roomkeeper.cluster.backend import RayBackend

# Every refusing reason of the rule needs one (a test holds it), else the headline would
# say "ok" while the guard refuses.
HEADLINES: dict[Word, str] = {
    Reason.OK: "ok",
    Reason.NO_CONTAINER: "ok",
    Reason.MEMORY: "no room in the container: memory",
    Reason.DISK: "no room in the container: disk",
    SchedulerReason.CPU: "no room: cpu",
    Reason.UNKNOWN: "measurements unavailable",
    Reason.OFF: "guard off",
    PressureReason.PRESSURE: "admission held after pressure",
}
# What needs-you (and the Health page's headline) says first when a person is needed.
PERSON_HEADLINES = (
    "persistence failed",
    "journal damaged",
    "recovery mode",
    "cluster unreachable",
    "uncertain work needs you",
    "memory not given back",
)


class Headlines:
    """Says what holds admission now, and what a person must do, in the gateway's words.

    Args:
        context: the variables (read on each answer) and the journal (work in doubt).
        scheduler: its next waiting job, its guard, its cooldown, its running count.
        leases: how many ended without a release hook.
        baseline: whether memory was not given back, and from what to what.
        cluster: the Ray backend, or None when jobs run here.
        link: whether the supervisor holds the gateway in recovery mode.
        persistence_error: why the journal cannot save now, or None.
    """

    def __init__(
        self,
        context: GatewayContext,
        *,
        scheduler: Scheduler,
        leases: Leases,
        baseline: BaselineKeeper,
        cluster: RayBackend | None,
        link: SupervisorLink,
        persistence_error: Callable[[], str | None],
    ) -> None:
        self._env = context.env
        self._journal = context.journal
        self._scheduler = scheduler
        self._guard = scheduler.guard
        self._leases = leases
        self._baseline = baseline
        self._cluster = cluster
        self._link = link
        self._persistence_error = persistence_error

    def check(self) -> Decision:
        """The guard's answer, now, for the next waiting job's own estimate (the default
        size when nothing waits): the job admission will judge next."""
        following = self._scheduler.next_waiting()
        if following is None:
            return self._guard.check()
        return self._guard.check(
            memory_bytes=following.estimate_bytes, disk_bytes=following.spec.disk_bytes
        )

    def memory_not_given_back(self) -> str | None:
        """While the baseline stays up after endings: what it rose from and to, in words."""
        watch = self._baseline.watch.statistics()
        if not watch.not_given_back or watch.then_bytes is None or watch.judged_bytes is None:
            return None
        without = self._leases.ended_without_hook()
        return (
            f"memory that no running job or granted lease explains rose from "
            f"{gb(watch.then_bytes)} to {gb(watch.judged_bytes)} GB across job and lease "
            f"endings and has not come back ({without} lease(s) ended without a release "
            "hook); work is judged against the room that is left; the status lists the "
            "processes that grew"
        )

    def held_after_pressure(self) -> str | None:
        """While the cooldown holds admission: why, and for how long, in words; else None."""
        cooldown = self._scheduler.cooldown
        left = cooldown.remaining()
        if left <= 0:
            return None
        if cooldown.cause() is CooldownCause.RELIEF:
            return f"admission is held {left:.0f} s more: the supervisor asked for relief"
        if read_pressure_settings(self._env).cooldown_fixed:
            return (
                f"admission is held {left:.0f} s more after a tree was stopped for memory "
                "pressure (ROOMKEEPER_PRESSURE_COOLDOWN)"
            )
        return (
            "admission is held after a tree was stopped for memory pressure, until its "
            "memory is back and the running jobs' forecast fits under the line "
            f"(at most {left:.0f} s more)"
        )

    def needs_you(self, decision: Decision | None = None) -> dict[str, str]:
        """A headline from a closed vocabulary and the guard's summary: no path, no command.

        Args:
            decision: the guard's answer just taken by :meth:`check`, to say instead of
                taking another reading.
        """
        said = self._person_needed()
        if said is not None:
            return said
        held = self.held_after_pressure()
        if held is not None:
            return {"headline": HEADLINES[PressureReason.PRESSURE], "body": held}
        decision = decision if decision is not None else self.check()
        cpu = self._cpu_holds(decision)
        if cpu is not None:
            return cpu
        # After what holds admission now: this one explains why the room keeps shrinking.
        kept = self.memory_not_given_back()
        if kept is not None:
            return {"headline": "memory not given back", "body": f"{kept}; {decision.summary}"}
        return {"headline": HEADLINES.get(decision.reason, "ok"), "body": decision.summary}

    def _person_needed(self) -> dict[str, str] | None:
        """What a person must do before anything else, if anything."""
        persistence_error = self._persistence_error()
        if persistence_error is not None:
            if is_damage(persistence_error):
                return {
                    "headline": "journal damaged",
                    "body": "the journal file is damaged (SQLite finds it malformed); new work "
                    "is refused: stop roomkeeper and run roomkeeper journal recover",
                }
            return {
                "headline": "persistence failed",
                "body": "the journal cannot save (the disk may be full); new work is refused",
            }
        if self._link.recovery_mode:
            return {
                "headline": "recovery mode",
                "body": "the gateway restarted too often: queued jobs, deferred work and "
                "automatic resumption are held until roomkeeper repair",
            }
        # Before older doubts: no new work runs anywhere until the cluster answers again.
        silent = None if self._cluster is None else self._cluster.unreachable()
        if silent is not None:
            return {"headline": "cluster unreachable", "body": silent}
        doubt = self._journal.needs_attention_count()
        if doubt:
            return {
                "headline": "uncertain work needs you",
                "body": f"{doubt} job(s) or call(s) were in flight when the gateway stopped; "
                "resolve each as succeeded, failed or rerun",
            }
        return None

    def _cpu_holds(self, decision: Decision) -> dict[str, str] | None:
        """While CPU pressure holds local launches that the guard would admit: why."""
        # The CPU gate holds local work only: jobs on a cluster use other machines' CPUs.
        if not decision.admit or self._cluster is not None:
            return None
        if not self._scheduler.statistics().running:
            return None
        cpu = cpu_pressure_percent()
        threshold = read_queue_settings(self._env).cpu_pressure_percent
        if cpu is None or cpu <= threshold:
            return None
        return {
            "headline": HEADLINES[SchedulerReason.CPU],
            "body": f"CPU pressure {cpu:.0f} % is above {threshold:.0f} %: "
            "no new job starts until it falls",
        }

"""The relief ladder's real-kernel scenario, run inside a memory cgroup by its caller.

Three restartable jobs (grow.py children) are admitted with small estimates
and grow past them together, more than the group can hold.  The scheduler
and its guard read this process's own group, so its limit is the line.
Prints one JSON object: each job's states in order, its runs, when the
stop came and when anything launched after it, the cooldown, and the
monitor's counts and reaction times.  The caller reads the group's OOM kill
counter (tests/test_ladder_real.py, benchmarks/bench_ladder.py).

Usage: python ladder_scenario.py LOGS_DIR [SIZE_BYTES] [GROW_S] [HOLD_S] [COOLDOWN_S]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from roomkeeper.guard.admission import Guard
from roomkeeper.jobs.queue import Limits
from roomkeeper.jobs.scheduler import Scheduler
from roomkeeper.jobs.settings import SchedulerListeners, SchedulerParts, SchedulerSettings
from roomkeeper.jobs.spec import JobSpec, JobState, JobView

GROW = Path(__file__).resolve().parent / "grow.py"
MIB = 2**20


def main() -> None:
    """Run the three jobs to their ends and print what happened."""
    logs = Path(sys.argv[1])
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 750_000_000
    grow = sys.argv[3] if len(sys.argv) > 3 else "8"
    hold = sys.argv[4] if len(sys.argv) > 4 else "2"
    cooldown = sys.argv[5] if len(sys.argv) > 5 else "3"
    env = {
        **os.environ,
        "ROOMKEEPER_JOB_DISK_MB": "0",
        "ROOMKEEPER_DISK_HEADROOM_PERCENT": "0",
        "ROOMKEEPER_PRESSURE_COOLDOWN": cooldown,
    }
    os.environ["ROOMKEEPER_PRESSURE_COOLDOWN"] = cooldown
    launches: list[tuple[str, float]] = []  # (job, wall time) of every launch, re-runs too
    steps: list[tuple[str, str | None, float]] = []  # (step, job, wall time) of the ladder

    def changed(view: JobView) -> None:
        if view.state is JobState.RUNNING and view.history[-2].state is JobState.WAITING:
            launches.append((view.id, view.history[-1].at))

    scheduler = Scheduler(
        SchedulerSettings(logs_dir=logs, limits=lambda: Limits(32, None, 3, None, 100.0, 0)),
        parts=SchedulerParts(guard=Guard(env=env)),
        listeners=SchedulerListeners(
            on_change=changed,
            on_relief=lambda e: steps.append((e.step.value, e.job_id, time.time())),
        ),
    )
    scheduler.start()
    ids = []
    try:
        for name in ("oldest", "middle", "newest"):
            spec = JobSpec(
                argv=[sys.executable, str(GROW), str(size), grow, hold],
                memory_bytes=100 * MIB,
                restartable=True,
            )
            ids.append(scheduler.submit(spec, job_id=name).id)
            time.sleep(0.3)  # an order of age the ladder can see
        views = [scheduler.wait(i, timeout=300) for i in ids]
    finally:
        scheduler.close(grace=1.0)
    stats = scheduler.pressure_statistics()
    print(
        json.dumps(
            {
                "jobs": {
                    v.id: {
                        "states": [t.state.value for t in v.history],
                        "reasons": [t.reason.value if t.reason else None for t in v.history],
                        "final": v.state.value,
                        "exit_code": v.exit_code,
                    }
                    for v in views
                },
                "steps": steps,
                "launches": launches,
                "cooldown_s": float(cooldown),
                "holds": stats.holds,
                "suspensions": stats.suspensions,
                "resumes": stats.resumes,
                "stops": stats.stops,
                "reruns": stats.reruns,
                "reaction_p50_s": stats.reaction_p50_s,
                "reaction_max_s": stats.reaction_max_s,
                "wakes_on": stats.wakes_on,
                "woken": stats.woken,
                "readings": stats.readings,
            }
        )
    )


if __name__ == "__main__":
    main()

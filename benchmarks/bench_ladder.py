"""The relief ladder's real-kernel scenario, ten times: OOM kills, suspensions, stops, reaction.

Each run makes a fresh 2 GB child memory cgroup (v1 or v2, where roomkeeper
makes job groups), runs ``ladder_scenario.py`` inside it (three jobs of
750 MB admitted at 100 MB each, growing together), reads the kernel's OOM
kill counter, and removes the group.  Prints one line per run and a total.

Needs root and a cgroup memory controller.  Usage:
    python benchmarks/bench_ladder.py [--runs 10] [--size 750000000] [--grow 8] [--cooldown 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from groups import remove_group

from roomkeeper.kernel.job_cgroups import job_cgroup_parent
from roomkeeper.kernel.oom_kills import group_oom_kills as oom_kills
from roomkeeper.kernel.oom_kills import machine_oom_kills

HERE = Path(__file__).resolve().parent
LIMIT = 2_000_000_000


def one_run(parent: Path, version: int, args: argparse.Namespace) -> tuple[int, dict[str, object]]:
    """One scenario in a fresh group: (OOM kills, the scenario's JSON).

    The kills are the larger of the group's own counter and the machine-wide delta.
    """
    group = parent / f"rkladder-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(LIMIT))
        if version == 1:
            with contextlib.suppress(OSError):
                (group / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        joiner = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
        before = machine_oom_kills()
        with tempfile.TemporaryDirectory() as logs:
            argv = [sys.executable, str(HERE / "ladder_scenario.py"), logs, str(args.size)]
            argv += [str(args.grow), str(args.hold), str(args.cooldown)]
            done = subprocess.run(
                joiner + argv, capture_output=True, text=True, check=False, timeout=900
            )
        if done.returncode != 0:
            raise RuntimeError(f"the scenario failed: {done.stderr[-2000:]}")
        kills = max(oom_kills(group, version), machine_oom_kills() - before)
        return kills, json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stuck = remove_group(group)
        if stuck:
            raise OSError(f"could not remove {', '.join(map(str, stuck))}")


def main() -> None:
    """Run the scenario ``--runs`` times and print each run's figures and the totals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--size", type=int, default=750_000_000, help="bytes each job grows to")
    parser.add_argument("--grow", type=float, default=8.0, help="seconds each job takes to grow")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds each job holds its peak")
    parser.add_argument("--cooldown", type=float, default=3.0, help="ROOMKEEPER_PRESSURE_COOLDOWN")
    args = parser.parse_args()
    own = job_cgroup_parent()
    if own is None or os.geteuid() != 0:
        sys.exit("needs root and a cgroup memory controller")
    parent, version = Path(own.directory), own.version
    print(
        f"cgroup v{version}, limit {LIMIT} bytes, 3 jobs of {args.size} bytes over {args.grow} s "
        f"(estimates 100 MiB), cooldown {args.cooldown} s, {args.runs} runs",
        flush=True,
    )
    medians: list[float] = []
    reactions: list[float] = []
    totals = {"oom": 0, "suspensions": 0, "stops": 0, "reruns": 0, "done": 0}
    for n in range(1, args.runs + 1):
        kills, result = one_run(parent, version, args)
        jobs = result["jobs"]
        assert isinstance(jobs, dict)
        done = sum(1 for j in jobs.values() if j["final"] == "exited" and j["exit_code"] == 0)
        p50, worst = result["reaction_p50_s"], result["reaction_max_s"]
        if isinstance(worst, float) and isinstance(p50, float):
            medians.append(p50)
            reactions.append(worst)
        steps = result["steps"]
        assert isinstance(steps, list)
        first_stop = next((j for s, j, _ in steps if s == "stop"), None)
        print(
            f"run {n:2d}: OOM kills {kills}  suspensions {result['suspensions']}  "
            f"stops {result['stops']} (first: {first_stop})  re-runs {result['reruns']}  "
            f"jobs done {done}/3  reaction p50 {_ms(p50)}  max {_ms(worst)}  "
            f"wakes on: {result['wakes_on']}",
            flush=True,
        )
        totals["oom"] += kills
        totals["done"] += done
        for key in ("suspensions", "stops", "reruns"):
            value = result[key]
            assert isinstance(value, int)
            totals[key] += value
    print(
        f"total: OOM kills {totals['oom']}, suspensions {totals['suspensions']}, stops "
        f"{totals['stops']}, re-runs {totals['reruns']}, jobs done {totals['done']}/"
        f"{3 * args.runs}; reaction p50 (median of the runs' p50) "
        f"{_ms(statistics.median(medians))}, max (of every run) {_ms(max(reactions))}"
        if reactions
        else "total: no step was taken"
    )


def _ms(seconds: object) -> str:
    return f"{seconds * 1000:.1f} ms" if isinstance(seconds, float) else "-"


if __name__ == "__main__":
    main()

"""A small container, as people run one: ``roomkeeper batch`` with no sizes, and with sizes 4x too
small under ``--strict``, judged by jobs done, OOM kills and the relief ladder's reaction.

Each job grows to 25..45 % of the container (seeded) over ``--grow`` seconds and holds its
peak for ``--hold`` seconds.  Two runs:

- (1) no ``--job-memory``, the ``pack`` policy: the default estimate must fit the container
  (at most a quarter of its line), and measured growth, trials and the ladder do the rest;
- (2) ``--strict --job-memory S/4``, S the smallest job: every estimate at least 4x too
  small, so only the relief ladder keeps the kernel's OOM killer out.

Where it runs:

- by default, in a fresh child memory group with ``--limit`` (one per run) under this
  process's own group (needs root and a writable cgroup file system; removed afterwards);
- with ``--here``, in this process's own group as it is: the container itself, read-only
  cgroup file system included (the layout Docker and Kubernetes give by default).

Prints, per run: jobs done, OOM kills (the group's counter and the machine's), wall time,
and the ladder's holds, suspensions, stops and reaction p50/max from the batch's summary.

Usage:
    python benchmarks/bench_container.py [--here] [--limit 1G] [--jobs 8] [--grow 3]
        [--hold 2] [--seed 7] [--runs 1,2] [--log-dir DIR] [--env NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_swarm import pressure_figures, run_in_group  # one way to run in a group

from roomkeeper.kernel.job_cgroups import job_cgroup_parent
from roomkeeper.kernel.oom_kills import group_oom_kills, machine_oom_kills
from roomkeeper.kernel.resources import read_pressure_inputs
from roomkeeper.units import parse_size

HERE = Path(__file__).resolve().parent
GROW = HERE / "grow.py"
SHARES = (0.25, 0.45)  # each job's peak, as a share of the container's limit


def own_group() -> tuple[Path | None, int | None, int]:
    """(this process's memory group, its cgroup version, its limit) as roomkeeper reads them."""
    inputs = read_pressure_inputs()
    if inputs.memory.limit_bytes is None:
        sys.exit(f"no memory limit could be read here: {inputs.memory.unknown_reason}")
    directory = None if inputs.directory is None else Path(inputs.directory)
    return directory, inputs.version, inputs.memory.limit_bytes


def run_here(
    argv: list[str], commands: Path, group: Path | None, version: int | None, stderr: Path
) -> tuple[float, int]:
    """Run the batch in this process's own group (the container); (wall s, OOM kills), the
    kills the larger of the group's own count and the machine's."""
    before_group = group_oom_kills(group, version) if group and version else 0
    before_machine = machine_oom_kills()
    start = time.monotonic()
    with commands.open() as lines, stderr.open("w") as err:
        subprocess.run(argv, stdin=lines, stdout=subprocess.DEVNULL, stderr=err, check=False)
    wall = time.monotonic() - start
    kills = machine_oom_kills() - before_machine
    if group and version:
        kills = max(kills, group_oom_kills(group, version) - before_group)
    return wall, kills


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--here", action="store_true", help="run in this process's own group")
    parser.add_argument("--limit", default="1G", help="the child group's limit (not with --here)")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--grow", type=float, default=3.0, help="seconds each job grows")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds each job holds its peak")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", default="1,2", help="which runs: 1 (no sizes), 2 (strict)")
    parser.add_argument("--log-dir", type=Path, help="keep each run's batch stderr here")
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the batch (repeatable)"
    )
    return parser.parse_args()


def report(name: str, jobs: int, completed: int, kills: int, wall: float, stderr: str) -> None:
    """Print one run's figures, the guard's and monitor's own lines, and the batch's last
    words when a job did not finish."""
    print(
        f"{name:34s} done {completed}/{jobs}  OOM kills {kills}  wall {wall:6.1f} s"
        f"  {pressure_figures(stderr)}",
        flush=True,
    )
    guard_line = re.search(r"roomkeeper guard is on \{.*\}", stderr)
    wakes = re.search(r"pressure monitor(?: wakes on)?:? [^\n]*", stderr)
    for found in (guard_line, wakes):
        if found is not None:
            print(f"    {found.group(0)[:300]}", flush=True)
    if completed < jobs:
        print("    " + "\n    ".join(stderr.splitlines()[-15:]), flush=True)


def main() -> None:
    args = parse_args()
    if args.here:
        group, version, limit = own_group()
        where = f"this container ({group}, cgroup v{version})"
    else:
        own = job_cgroup_parent()
        if own is None or os.geteuid() != 0:
            sys.exit("a child group needs root and a writable cgroup memory controller (or --here)")
        group, version, limit = Path(own.directory), own.version, parse_size(args.limit)
        where = f"a fresh child group of {group} per run (cgroup v{version})"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rng = random.Random(args.seed)
        sizes = [int(limit * rng.uniform(*SHARES)) for _ in range(args.jobs)]
        too_small = max(1, min(sizes) // 4)
        print(
            f"{where}, limit {limit / 2**20:.0f} MiB; {args.jobs} jobs of "
            f"{min(sizes) / 1e6:.0f}..{max(sizes) / 1e6:.0f} MB, grow {args.grow} s, "
            f"hold {args.hold} s",
            flush=True,
        )
        # The batch inherits this environment (run_in_group passes no other): none of the
        # caller's ROOMKEEPER_* variables, a fresh home, no CPU gate, then --env.
        for name in [k for k in os.environ if k.startswith("ROOMKEEPER_")]:
            del os.environ[name]
        os.environ.update(ROOMKEEPER_HOME=str(tmp / "home"), ROOMKEEPER_CPU_PRESSURE_PERCENT="100")
        os.environ.update(item.split("=", 1) for item in args.env)
        rk = [sys.executable, "-m", "roomkeeper", "batch", "--quiet"]
        runs = {
            "1": ("(1) no sizes", rk),
            "2": (
                f"(2) --strict --job-memory {too_small // 2**20}M",
                [*rk, "--strict", "--job-memory", f"{too_small // 2**20}M"],
            ),
        }
        for key in args.runs.split(","):
            name, argv = runs[key.strip()]
            done_dir = tmp / f"done-{key}"
            done_dir.mkdir()
            commands = tmp / f"commands-{key}.txt"
            commands.write_text(
                "".join(
                    f"{sys.executable} {GROW} {size} {args.grow} {args.hold} {done_dir / str(i)}\n"
                    for i, size in enumerate(sizes)
                )
            )
            err = tmp / f"stderr-{key}.txt"
            if args.here:
                wall, kills = run_here(argv, commands, group, version, err)
            else:
                assert group is not None and version is not None
                wall, kills = run_in_group(group, version, limit, argv, commands, err)
            stderr = err.read_text()
            if args.log_dir is not None:
                args.log_dir.mkdir(parents=True, exist_ok=True)
                (args.log_dir / f"run-{key}.log").write_text(stderr)
            report(name, args.jobs, len(list(done_dir.iterdir())), kills, wall, stderr)


if __name__ == "__main__":
    main()

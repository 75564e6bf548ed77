"""Overhead: 1,000 jobs of `true` through roomkeeper batch, GNU parallel and xargs, 4 at a time.

Usage: python benchmarks/bench_overhead.py [--jobs 1000] [--repeat 3] [--floor]
Prints jobs per second for each (the median of the repeats).

``--floor`` adds ``launch_floor.py``'s bare loops (the kernel side of a launch alone, with
a job's own groups, pooled groups and none; root and cgroup v1): what no batch that gives
each job its own groups can beat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], stdin: Path, env: dict[str, str]) -> float:
    with stdin.open() as f:
        start = time.monotonic()
        subprocess.run(
            argv, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
        )
        return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--floor", action="store_true", help="add the bare launch loops")
    args = parser.parse_args()
    if shutil.which("parallel") is None:
        sys.exit("GNU parallel is needed: apt-get install -y parallel")
    with tempfile.TemporaryDirectory() as tmp:
        commands = Path(tmp, "true.txt")
        commands.write_text("true\n" * args.jobs)
        env = {**os.environ, "ROOMKEEPER_HOME": str(Path(tmp, "home"))}
        contenders = {
            "roomkeeper batch --max-running 4": [
                sys.executable,
                "-m",
                "roomkeeper",
                "batch",
                "--max-running",
                "4",
                "--quiet",
                "--logs",
                str(Path(tmp, "logs")),
            ],
            "parallel -j4": ["parallel", "-j4"],
            "xargs -P4": ["xargs", "-P4", "-I{}", "sh", "-c", "{}"],
        }
        if args.floor:
            floor = [sys.executable, str(Path(__file__).with_name("launch_floor.py"))]
            modes = ["own", "pooled", "none"]
            probe = subprocess.run(
                [*floor, "--jobs", "1"], capture_output=True, text=True, check=False, env=env
            )
            if probe.returncode != 0:  # not root, or no v1 hierarchies: the loop alone
                said = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
                print(f"bare loops with groups left out: {said}", flush=True)
                modes = ["none"]
            for mode in modes:
                name = "no groups" if mode == "none" else f"{mode} groups"
                contenders[f"bare loop, {name}"] = [
                    *floor,
                    "--groups",
                    mode,
                    "--jobs",
                    str(args.jobs),
                ]
        for name, argv in contenders.items():
            walls = [timed(argv, commands, env) for _ in range(args.repeat)]
            wall = statistics.median(walls)
            print(
                f"{name:34s} {args.jobs / wall:8.1f} jobs/s  (median of {args.repeat}: "
                f"{', '.join(f'{w:.2f}' for w in walls)} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""The cost of each managed job on real short work: a real project's test files, one per line.

Usage: python benchmarks/bench_real_work.py [--project DIR] [--repeat 3] [--copies 2]

The project is attrs (its sdist ships its tests; fetched once with ``pip
download`` into benchmarks/.cache/ unless --project names a checkout with a
``tests/`` folder and a ``src/`` layout).  Each test file is one line,
``python -m pytest -q -p no:cacheprovider FILE`` (``--copies`` times over, so a
few dozen lines), run through ``roomkeeper batch --max-running 4`` and
``parallel -j4``, alternately, ``--repeat`` times.  Prints each run's wall
time, the medians, their ratio, and where the time goes: how busy the four
slots were (the sum of the jobs' own wall times over 4 x the batch's wall
time) for each tool, and, in this process, what one managed launch costs
(the guard's decision, the spawn with its cgroup and lifeline, the reap).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(__file__).parent / ".cache"
SLOTS = 4
PIP_DOWNLOAD = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
BATCH = [sys.executable, "-m", "roomkeeper", "batch", "--max-running", str(SLOTS), "--quiet"]


def project_dir(given: Path | None) -> Path:
    """The project whose tests run: the one given, else attrs' sdist (downloaded once)."""
    if given is not None:
        return given
    found = sorted(CACHE.glob("attrs-*/tests"))
    if found:
        return found[-1].parent
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [*PIP_DOWNLOAD, "attrs==26.1.0", "-d", str(CACHE)],
        check=True,
    )
    archive = next(CACHE.glob("attrs-*.tar.gz"))
    shutil.unpack_archive(archive, CACHE)
    return next(CACHE.glob("attrs-*/tests")).parent


def lines_for(project: Path, copies: int, first: int | None) -> list[str]:
    """One shell line per test file, each run from the project's folder."""
    files = sorted(p.name for p in (project / "tests").glob("test_*.py"))[:first]
    line = (
        "cd {dir} && PYTHONPATH=src {py} -m pytest -q -p no:cacheprovider -x tests/{f} >/dev/null"
    )
    return [
        line.format(dir=project, py=sys.executable, f=name) for _ in range(copies) for name in files
    ]


def run_parallel(commands: Path, tmp: Path) -> tuple[float, float]:
    """Wall time and the sum of the jobs' own run times, from parallel's job log."""
    joblog = tmp / "parallel.log"
    start = time.monotonic()
    with commands.open() as f:
        subprocess.run(
            ["parallel", f"-j{SLOTS}", "--joblog", str(joblog)],
            stdin=f,
            stdout=subprocess.DEVNULL,
            check=False,
        )
    wall = time.monotonic() - start
    rows = joblog.read_text().splitlines()[1:]
    busy = sum(float(row.split("\t")[3]) for row in rows)
    return wall, busy


def run_roomkeeper(commands: Path, tmp: Path) -> tuple[float, float]:
    """Wall time and the sum of the jobs' own wall times, from the batch's summary table."""
    env = {**os.environ, "ROOMKEEPER_HOME": str(tmp / "home")}
    start = time.monotonic()
    with commands.open() as f:
        done = subprocess.run(
            [*BATCH, "--logs", str(tmp / "logs")],
            stdin=f,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            check=False,
        )
    wall = time.monotonic() - start
    table = [row for row in done.stderr.splitlines() if not row.startswith("roomkeeper batch:")]
    busy = sum(float(s) for s in re.findall(r"\s(\d+\.\d+) s(?:\s|$)", "\n".join(table)))
    return wall, busy


def launch_costs(n: int = 40) -> str:
    """What one managed launch costs here: the guard's decision, the spawn, the reap."""
    from roomkeeper import Guard
    from roomkeeper.processes.launch import LaunchSpec, launch
    from roomkeeper.processes.lifeline import Lifeline

    guard = Guard()
    lifeline = Lifeline()
    lifeline.start()
    judge, spawn, reap = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            t0 = time.perf_counter()
            guard.admit(f"c{i}", memory_bytes=1)
            t1 = time.perf_counter()
            handle = launch(
                f"cost{i}", LaunchSpec(argv=["true"], log_path=f"{tmp}/{i}.log"), lifeline=lifeline
            )
            t2 = time.perf_counter()
            while handle.poll() is None:
                time.sleep(0.001)
            handle.close()
            guard.release(f"c{i}")
            reap.append(time.perf_counter() - t2)
            judge.append(t1 - t0)
            spawn.append(t2 - t1)
    lifeline.close()
    ms = lambda xs: f"{statistics.median(xs) * 1000:.1f} ms"  # noqa: E731
    return f"guard decision {ms(judge)}, spawn {ms(spawn)}, run of `true` + reap + close {ms(reap)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--files", type=int, help="only the first N test files (a quick look)")
    args = parser.parse_args()
    if shutil.which("parallel") is None:
        sys.exit("GNU parallel is needed: apt-get install -y parallel")
    project = project_dir(args.project)
    commands = lines_for(project, args.copies, args.files)
    print(f"{len(commands)} lines: the test files of {project.name}, {SLOTS} at a time", flush=True)
    walls: dict[str, list[float]] = {"roomkeeper": [], "parallel": []}
    busy: dict[str, list[float]] = {"roomkeeper": [], "parallel": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        listing = tmp / "commands.txt"
        listing.write_text("\n".join(commands) + "\n")
        for n in range(args.repeat):
            for name, runner in (("parallel", run_parallel), ("roomkeeper", run_roomkeeper)):
                shutil.rmtree(tmp / "logs", ignore_errors=True)
                wall, used = runner(listing, tmp)
                walls[name].append(wall)
                busy[name].append(used / (SLOTS * wall))
                print(
                    f"run {n + 1}: {name:10s} {wall:7.2f} s, slots busy {busy[name][-1]:.0%}",
                    flush=True,
                )
    rk, par = statistics.median(walls["roomkeeper"]), statistics.median(walls["parallel"])
    print(f"median: roomkeeper batch {rk:.2f} s, parallel -j{SLOTS} {par:.2f} s: {rk / par:.3f}x")
    print(
        f"slots busy (median): roomkeeper {statistics.median(busy['roomkeeper']):.0%}, "
        f"parallel {statistics.median(busy['parallel']):.0%}"
    )
    print(f"one managed launch: {launch_costs()}")


if __name__ == "__main__":
    main()

"""A real build: pybind11's unit-test compiles through roomkeeper batch and parallel -jK, in 2 GiB.

Each line compiles one of pybind11's C++ test files with ``g++ -O2`` (CPU bound,
0.5 to 0.9 GB each, 10 to 32 s of one core here). Every contender runs in a
fresh child memory cgroup with ``--limit`` (2 GiB unless given), with a fresh
output folder:

- ``roomkeeper batch``, nothing stated or learned (a fresh ROOMKEEPER_HOME);
- ``parallel -jK`` for K in ``--k``.

For each: wall time, compiles done, OOM kills (the group's counter and the
kernel's), and the CPU seconds every process of the run used (user and system:
what the kernel counts for the contender and every descendant reaped, killed
ones included, as GNU ``time`` reports it); for roomkeeper also its relief
ladder's counts. The last lines name the fastest K that finished every compile
without an OOM kill, roomkeeper's wall against it, and the CPU seconds
roomkeeper's run spent beyond the least a safe count's run did: roomkeeper's own
work (a second or two), what its stops threw away, and the noise between two
runs of the same compiles.

The project is a pybind11 checkout (``--project``; ``git clone
https://github.com/pybind/pybind11``; measured at 22bf5b6): its ``include/`` and
``tests/``. Needs root, a cgroup memory controller, g++, Python's headers
(python3-dev) and GNU parallel. Usage:
    python benchmarks/bench_build.py --project DIR [--limit 2G] [--k 2,3,4] [--files a,b,...]
        [--rounds N]

Two runs of the same compiles minutes apart can differ by many seconds of CPU on a
shared machine, so one round tells little: ``--rounds N`` runs every contender N
times, every other round in the reverse order, and adds the median of the rounds'
ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import signal
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench_swarm import pressure_figures, run_in_group
from groups import end_on_sigterm

from roomkeeper.kernel.job_cgroups import job_cgroup_parent
from roomkeeper.units import format_bytes, parse_size

# Ten test files of 0.5 to 0.9 GB each at -O2 (g++ 12), large and small mixed.
FILES = (
    "test_enum",
    "test_kwargs_and_defaults",
    "test_stl",
    "test_builtin_casters",
    "test_class",
    "test_operator_overloading",
    "test_sequences_and_iterators",
    "test_factory_constructors",
    "test_methods_and_attributes",
    "test_numpy_array",
)


@dataclass(frozen=True, slots=True)
class Run:
    """One contender's run."""

    wall_s: float
    done: int
    kills: int
    cpu_s: float
    pressure: str = ""


def compile_lines(project: Path, files: list[str], out: Path) -> str:
    """One ``g++ -O2 -c`` line per test file, each writing its object into ``out``."""
    includes = f"-I{project / 'include'} -I{sysconfig.get_paths()['include']} -I."
    tests = shlex.quote(str(project / "tests"))
    return "".join(
        f"cd {tests} && g++ -O2 -std=c++17 -fPIC {includes} -c {name}.cpp -o {out / name}.o\n"
        for name in files
    )


def one_run(
    parent: Path,
    version: int,
    limit: int,
    argv: list[str],
    project: Path,
    files: list[str],
    keep: Path | None = None,
) -> Run:
    """``argv`` reading the compile lines, in a fresh group and a fresh output folder."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch, "out")
        out.mkdir()
        lines = Path(scratch, "lines.txt")
        lines.write_text(compile_lines(project, files, out))
        stderr = Path(scratch, "stderr")
        os.environ["ROOMKEEPER_HOME"] = str(Path(scratch, "home"))
        # The contender is our only child meanwhile: what the kernel adds to our reaped
        # children's count is its CPU and that of every descendant it reaped (no GNU time in
        # between, which would keep a Ctrl-C from reaching the contender).
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall, kills = run_in_group(parent, version, limit, argv, lines, stderr=stderr)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        done = sum(1 for name in files if (out / f"{name}.o").is_file())
        if keep is not None:  # the contender's stderr (roomkeeper's admission and relief log)
            shutil.copyfile(stderr, keep)
        return Run(wall, done, kills, cpu_s, pressure_figures(stderr.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True, help="a pybind11 checkout")
    parser.add_argument("--limit", default="2G", help="the group's memory limit")
    parser.add_argument("--k", default="2,3,4", help="the counts parallel -j runs with")
    parser.add_argument("--files", default=",".join(FILES), help="test files, without .cpp")
    parser.add_argument(
        "--keep", type=Path, help="keep roomkeeper's stderr in this file (FILE.N for round N)"
    )
    parser.add_argument("--only-roomkeeper", action="store_true", help="leave parallel out")
    parser.add_argument(
        "--rounds", type=int, default=1, help="run every contender this many times, in turn"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, end_on_sigterm)  # a timeout's SIGTERM removes the groups too
    project = args.project.resolve()
    files = [f for f in args.files.split(",") if f]
    missing = [f for f in files if not (project / "tests" / f"{f}.cpp").is_file()]
    if missing or not (project / "include" / "pybind11").is_dir():
        sys.exit(f"{project} is not a pybind11 checkout with these tests: {missing or 'include/'}")
    for tool in ("g++", "parallel"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is needed: apt-get install -y g++ parallel python3-dev")
    own = job_cgroup_parent()
    if own is None or os.geteuid() != 0:
        sys.exit("needs root and a cgroup memory controller")
    if args.rounds < 1:
        sys.exit(f"--rounds {args.rounds}: give 1 or more")
    limit = parse_size(args.limit)
    parent, version = Path(own.directory), own.version
    for name in ("ROOMKEEPER_JOB_DISK_MB", "ROOMKEEPER_DISK_HEADROOM_PERCENT"):
        os.environ[name] = "0"  # the compiles' disk is not what is measured
    print(
        f"cgroup v{version}, limit {format_bytes(limit)}, {len(files)} compiles of pybind11's "
        f"tests (g++ -O2), {os.cpu_count()} cores",
        flush=True,
    )
    batch = [sys.executable, "-m", "roomkeeper", "batch", "--quiet", "-"]
    contenders = [("roomkeeper batch", batch)]
    if not args.only_roomkeeper:
        contenders += [(f"parallel -j{k}", ["parallel", f"-j{k}"]) for k in args.k.split(",")]

    def run(argv: list[str], keep: Path | None) -> Run:
        return one_run(parent, version, limit, argv, project, files, keep)

    rounds = [
        run_round(number, args.rounds, contenders, run, args.keep, len(files))
        for number in range(args.rounds)
    ]
    if args.rounds > 1:
        print(f"over {args.rounds} rounds:")
    judge(rounds, len(files))


def run_round(
    number: int,
    total: int,
    contenders: list[tuple[str, list[str]]],
    run: Callable[[list[str], Path | None], Run],
    keep: Path | None,
    count: int,
) -> dict[str, Run]:
    """One run of every contender; every other round the other way round, so that
    neither side always runs first (cold caches) or last (a machine that got busier)."""
    order = contenders if number % 2 == 0 else contenders[::-1]
    if total > 1:
        print(f"round {number + 1} of {total}: {', '.join(label for label, _ in order)}")
    runs: dict[str, Run] = {}
    for label, argv in order:
        ours = label == "roomkeeper batch"
        if ours and keep is not None and total > 1:
            keep = keep.with_name(f"{keep.name}.{number + 1}")  # one log a round
        done = runs[label] = run(argv, keep if ours else None)
        print(
            f"{label:18} wall {done.wall_s:7.1f} s  done {done.done:2}/{count}  "
            f"OOM kills {done.kills:2}  CPU {done.cpu_s:7.1f} s",
            flush=True,
        )
        if ours:
            print(f"{'':18} {done.pressure}", flush=True)
    if total > 1:
        judge([runs], count)
    return runs


def judge(rounds: list[dict[str, Run]], count: int) -> None:
    """The fastest count that was safe in every round, and roomkeeper against it, round by round.

    Safe: every compile done and no OOM kill.  Fastest: the least median wall.  The
    ratio and the CPU beyond are each round's own (the same machine, minutes apart),
    then their medians.
    """
    labels = [label for label in rounds[0] if label != "roomkeeper batch"]
    safe = [
        label
        for label in labels
        if all(runs[label].done == count and not runs[label].kills for runs in rounds)
    ]
    ours = [runs["roomkeeper batch"] for runs in rounds]
    if not labels:
        return  # roomkeeper alone: its lines above are all there is
    if not safe:
        walls = ", ".join(f"{run.wall_s:.1f} s ({run.done} done)" for run in ours)
        print(f"every fixed count lost compiles; roomkeeper {walls}")
        return
    label = min(safe, key=lambda k: statistics.median(runs[k].wall_s for runs in rounds))
    ratios = [runs["roomkeeper batch"].wall_s / runs[label].wall_s for runs in rounds]
    beyond = [runs["roomkeeper batch"].cpu_s - min(runs[k].cpu_s for k in safe) for runs in rounds]
    if len(rounds) == 1:
        best = rounds[0][label].wall_s
        print(
            f"fastest safe count: {label}, {best:.1f} s; roomkeeper {ours[0].wall_s:.1f} s = "
            f"{ratios[0]:.2f}x, done {ours[0].done}/{count}, OOM kills {ours[0].kills}; "
            f"CPU beyond the least of the safe counts' "
            f"({min(rounds[0][k].cpu_s for k in safe):.1f} s): {beyond[0]:+.1f} s"
        )
        return
    print(
        f"fastest count safe in every round: {label}, median "
        f"{statistics.median(runs[label].wall_s for runs in rounds):.1f} s; roomkeeper median "
        f"{statistics.median(run.wall_s for run in ours):.1f} s; ratio by round "
        f"{', '.join(f'{r:.2f}x' for r in ratios)}, median {statistics.median(ratios):.2f}x; "
        f"done {min(run.done for run in ours)}/{count} or more, OOM kills "
        f"{sum(run.kills for run in ours)}; CPU beyond the least safe count's, by round "
        f"{', '.join(f'{b:+.1f}' for b in beyond)} s, median {statistics.median(beyond):+.1f} s"
    )


if __name__ == "__main__":
    start = time.monotonic()
    main()
    print(f"({time.monotonic() - start:.0f} s in all)")

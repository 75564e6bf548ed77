"""A real build: pybind11's unit-test compiles through roomkeeper batch and parallel -jK, in 2 GiB.

Each line compiles one of pybind11's C++ test files with ``g++ -O2`` (CPU bound,
0.5 to 0.9 GB each, 10 to 32 s of one core here). Every contender runs in a
fresh child memory cgroup with ``--limit`` (2 GiB unless given), with a fresh
output folder:

- ``roomkeeper batch``, nothing stated or learned (a fresh ROOMKEEPER_HOME);
- ``parallel -jK`` for K in ``--k``.

For each: wall time, compiles done, OOM kills (the group's counter and the
kernel's), and the CPU seconds every process of the run used (user and system,
from ``/usr/bin/time`` around the contender: its reaped descendants, killed
ones included); for roomkeeper also its relief ladder's counts. The last lines
name the fastest K that finished every compile without an OOM kill, roomkeeper's
wall against it, and the CPU seconds roomkeeper's run spent beyond the least a
safe count's run did: roomkeeper's own work (a second or two), what its stops
threw away, and the noise between two runs of the same compiles.

The project is a pybind11 checkout (``--project``; ``git clone
https://github.com/pybind/pybind11``; measured at 22bf5b6): its ``include/`` and
``tests/``. Needs root, a cgroup memory controller, g++, Python's headers
(python3-dev), GNU parallel and GNU time. Usage:
    python benchmarks/bench_build.py --project DIR [--limit 2G] [--k 2,3,4] [--files a,b,...]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_swarm import pressure_figures, run_in_group

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
        cpu = Path(scratch, "cpu")
        stderr = Path(scratch, "stderr")
        timed = ["/usr/bin/time", "-f", "%U %S", "-o", str(cpu), *argv]
        os.environ["ROOMKEEPER_HOME"] = str(Path(scratch, "home"))
        wall, kills = run_in_group(parent, version, limit, timed, lines, stderr=stderr)
        done = sum(1 for name in files if (out / f"{name}.o").is_file())
        if keep is not None:  # the contender's stderr (roomkeeper's admission and relief log)
            shutil.copyfile(stderr, keep)
        user, system = cpu.read_text().split()[-2:]
        return Run(
            wall, done, kills, float(user) + float(system), pressure_figures(stderr.read_text())
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True, help="a pybind11 checkout")
    parser.add_argument("--limit", default="2G", help="the group's memory limit")
    parser.add_argument("--k", default="2,3,4", help="the counts parallel -j runs with")
    parser.add_argument("--files", default=",".join(FILES), help="test files, without .cpp")
    parser.add_argument("--keep", type=Path, help="keep roomkeeper's stderr in this file")
    parser.add_argument("--only-roomkeeper", action="store_true", help="leave parallel out")
    args = parser.parse_args()
    project = args.project.resolve()
    files = [f for f in args.files.split(",") if f]
    missing = [f for f in files if not (project / "tests" / f"{f}.cpp").is_file()]
    if missing or not (project / "include" / "pybind11").is_dir():
        sys.exit(f"{project} is not a pybind11 checkout with these tests: {missing or 'include/'}")
    for tool in ("g++", "parallel", "/usr/bin/time"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is needed: apt-get install -y g++ parallel time python3-dev")
    own = job_cgroup_parent()
    if own is None or os.geteuid() != 0:
        sys.exit("needs root and a cgroup memory controller")
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
    runs: dict[str, Run] = {}
    contenders = [("roomkeeper batch", batch)]
    if not args.only_roomkeeper:
        contenders += [(f"parallel -j{k}", ["parallel", f"-j{k}"]) for k in args.k.split(",")]
    for label, argv in contenders:
        keep = args.keep if label == "roomkeeper batch" else None
        run = runs[label] = one_run(parent, version, limit, argv, project, files, keep)
        print(
            f"{label:18} wall {run.wall_s:7.1f} s  done {run.done:2}/{len(files)}  "
            f"OOM kills {run.kills:2}  CPU {run.cpu_s:7.1f} s",
            flush=True,
        )
        if label == "roomkeeper batch":
            print(f"{'':18} {run.pressure}", flush=True)
    clean = [(r.wall_s, label) for label, r in runs.items() if label != "roomkeeper batch"]
    clean = [(w, label) for w, label in clean if runs[label].done == len(files)]
    clean = [(w, label) for w, label in clean if not runs[label].kills]
    ours = runs["roomkeeper batch"]
    if not clean:
        print(f"every fixed count lost compiles; roomkeeper {ours.wall_s:.1f} s, done {ours.done}")
        return
    best, label = min(clean)
    least_cpu = min(runs[label_].cpu_s for _, label_ in clean)
    print(
        f"fastest safe count: {label}, {best:.1f} s; roomkeeper {ours.wall_s:.1f} s = "
        f"{ours.wall_s / best:.2f}x, done {ours.done}/{len(files)}, OOM kills {ours.kills}; "
        f"CPU beyond the least of the safe counts' ({least_cpu:.1f} s): "
        f"{ours.cpu_s - least_cpu:+.1f} s"
    )


if __name__ == "__main__":
    start = time.monotonic()
    main()
    print(f"({time.monotonic() - start:.0f} s in all)")

"""make -jK and ninja -jK against the same build under roomkeeper's jobserver, in 2 GiB.

A build of ``--steps`` independent steps (24 unless given), each growing to
between 150 and 700 MB over ``--grow`` seconds and holding ``--hold``
seconds (``grow.py``), runs in a fresh 2 GiB child memory cgroup:

- ``make -k -jK`` and ``ninja -k 0 -jK`` for K from ``--kmin`` to ``--kmax``;
- ``roomkeeper batch --jobserver`` running ``make -k`` and ``ninja -k 0`` with no ``-j``.

Each run prints its wall time, the group's OOM kills and the steps lost (no
done file).  The last lines name the fastest K that lost nothing for each
tool and the jobserver's wall against it.

Needs root and a cgroup memory controller.  Usage:
    python benchmarks/bench_jobserver.py [--steps 24] [--kmin 2] [--kmax 8] [--grow 2] [--hold 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from groups import remove_group

from roomkeeper.kernel.job_cgroups import job_cgroup_parent
from roomkeeper.kernel.oom_kills import group_oom_kills, machine_oom_kills

HERE = Path(__file__).resolve().parent
LIMIT = 2 * 1024**3
MB = 1_000_000


def sizes(steps: int) -> list[int]:
    """Step sizes from 150 to 700 MB, large and small interleaved (a fixed order)."""
    spread = [150 * MB + (700 - 150) * MB * k // max(1, steps - 1) for k in range(steps)]
    order = sorted(range(steps), key=lambda k: (k * 7) % steps)
    return [spread[k] for k in order]


def write_build(folder: Path, args: argparse.Namespace) -> None:
    """The same steps as a Makefile and as a build.ninja; each leaves a done file."""
    folder.mkdir(parents=True)
    (folder / "done").mkdir()
    grow = f"{sys.executable} {HERE / 'grow.py'}"
    commands = [
        f"{grow} {size} {args.grow} {args.hold} {folder}/done/{i}"
        for i, size in enumerate(sizes(args.steps))
    ]
    names = [f"s{i}" for i in range(len(commands))]
    rules = "".join(f"{n}:\n\t@{c}\n" for n, c in zip(names, commands, strict=True))
    (folder / "Makefile").write_text(
        f".PHONY: all {' '.join(names)}\nall: {' '.join(names)}\n{rules}"
    )
    ninja = ["rule step\n  command = $cmd\n"]
    ninja += [f"build {n}: step\n  cmd = {c}\n" for n, c in zip(names, commands, strict=True)]
    (folder / "build.ninja").write_text("\n".join(ninja))


def one_run(
    parent: Path, version: int, argv: list[str], args: argparse.Namespace
) -> tuple[float, int, int]:
    """One build in a fresh group: (wall seconds, OOM kills, steps lost)."""
    group = parent / f"rkjobs-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(LIMIT))
        if version == 1:
            with contextlib.suppress(OSError):
                (group / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch) / "build"
            write_build(folder, args)
            joiner = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
            env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
            env.update(
                ROOMKEEPER_HOME=str(Path(scratch) / "home"),
                ROOMKEEPER_CPU_PRESSURE_PERCENT="100",
                ROOMKEEPER_JOB_DISK_MB="0",
                ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
            )
            command = [a.replace("{dir}", str(folder)) for a in argv]
            before = machine_oom_kills()
            started = time.monotonic()
            subprocess.run(
                joiner + command,
                cwd=folder,
                env=env,
                capture_output=True,
                check=False,
                timeout=1800,
            )
            wall = time.monotonic() - started
            kills = max(group_oom_kills(group, version), machine_oom_kills() - before)
            lost = args.steps - len(list((folder / "done").iterdir()))
        return wall, kills, lost
    finally:
        remove_group(group)


def main() -> None:
    """Every run, one line each, then the fastest lossless K against the jobserver."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--kmin", type=int, default=2)
    parser.add_argument("--kmax", type=int, default=8)
    parser.add_argument("--grow", type=float, default=2.0, help="seconds each step grows")
    parser.add_argument("--hold", type=float, default=1.0, help="seconds each step holds")
    args = parser.parse_args()
    own = job_cgroup_parent()
    if own is None or os.geteuid() != 0:
        sys.exit("needs root and a cgroup memory controller")
    ninja = shutil.which("ninja", path=str(Path(sys.executable).parent)) or "ninja"
    parent, version = Path(own.directory), own.version
    print(
        f"cgroup v{version}, limit {LIMIT} bytes, {args.steps} steps of 150-700 MB, "
        f"grow {args.grow} s, hold {args.hold} s; make {_version(['make', '--version'])}, "
        f"ninja {_version([ninja, '--version'])}",
        flush=True,
    )
    batch = [sys.executable, "-m", "roomkeeper", "batch", "--jobserver", "--quiet", "-"]
    runs: list[tuple[str, int | None, list[str]]] = []
    for k in range(args.kmin, args.kmax + 1):
        runs.append(("make", k, ["make", "-k", f"-j{k}", "-C", "{dir}"]))
        runs.append(("ninja", k, [ninja, "-k", "0", f"-j{k}", "-C", "{dir}"]))
    runs.append(("make", None, ["/bin/sh", "-c", f"echo 'make -k -C {{dir}}' | {' '.join(batch)}"]))
    runs.append(
        ("ninja", None, ["/bin/sh", "-c", f"echo '{ninja} -k 0 -C {{dir}}' | {' '.join(batch)}"])
    )
    results: dict[tuple[str, int | None], tuple[float, int, int]] = {}
    for tool, k, argv in runs:
        wall, kills, lost = results[(tool, k)] = one_run(parent, version, argv, args)
        label = f"{tool} -j{k}" if k is not None else f"{tool} under roomkeeper --jobserver"
        print(
            f"{label:34} wall {wall:6.1f} s  OOM kills {kills:2}  steps lost {lost:2}", flush=True
        )
    for tool in ("make", "ninja"):
        clean = [(w, k) for (t, k), (w, _, lost) in results.items() if t == tool and k and not lost]
        ours = results[(tool, None)]
        if clean:
            best, k = min(clean)
            print(
                f"{tool}: fastest K that lost nothing: -j{k}, {best:.1f} s; "
                f"jobserver {ours[0]:.1f} s = {ours[0] / best:.2f}x, "
                f"OOM kills {ours[1]}, steps lost {ours[2]}"
            )
        else:
            print(f"{tool}: every K lost steps; jobserver {ours[0]:.1f} s, lost {ours[2]}")


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    except OSError:
        return "missing"
    return out.splitlines()[0].split()[-1] if out else "unknown"


if __name__ == "__main__":
    main()

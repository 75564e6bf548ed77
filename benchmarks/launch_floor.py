"""The floor under a batch's cost per job: what the kernel side of a launch costs alone.

A bare single-threaded loop starts ``--jobs`` lines of ``true``, ``--parallel`` at a time,
as roomkeeper starts a line (``nice -n 10``, then ``/bin/sh -c`` writing its pid into each
of the job's groups before the text runs), reaps each, reads its group's peak and removes
its groups. Nothing else: no guard, journal, lifeline, sampler, threads or start-up
imports. Whatever roomkeeper does per job comes on top of this.

Modes (``--groups``):

- ``own``: a memory group and a freezer group of its own for each job, made before and
  removed after, as roomkeeper does on a cgroup v1 host;
- ``pooled``: one memory and one freezer group per slot, made once and reused (the peak
  read and reset, the members read), the cheapest way to keep a group per job;
- ``none``: no groups, only the exec chain.

Needs root and cgroup v1 memory and freezer hierarchies for ``own`` and ``pooled``.
Usage: python benchmarks/launch_floor.py [--groups own|pooled|none] [--jobs 1000]
       [--parallel 4]
Prints the wall time from the script's start, and jobs per second.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

STARTED = time.monotonic()  # the interpreter is up; nothing heavy was imported
NICE = "/usr/bin/nice"


def own_v1_group(controller: str) -> str:
    """This process's group of a v1 ``controller``, as a directory; exits where there is none."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                directory = f"/sys/fs/cgroup/{controller}{path}"
                if os.path.isdir(directory):
                    return directory
    sys.exit(f"no cgroup v1 {controller} hierarchy here: run with --groups none")


def joined(groups: tuple[str, ...]) -> list[str]:
    """The argv roomkeeper runs for shell text ``true`` in ``groups`` (nice, then the join)."""
    joins = " && ".join(f"echo $$ > {g}/cgroup.procs" for g in groups)
    text = f"{joins} || exit $?; true" if groups else "true"
    return [NICE, "-n", "10", "/bin/sh", "-c", text]


@contextlib.contextmanager
def made(directories: list[str]) -> Iterator[None]:
    """Make ``directories`` (groups); remove what is left of them however the run ends."""
    try:
        for directory in directories:
            os.mkdir(directory)
        yield
    finally:
        for directory in reversed(directories):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(directory)


class Loop:
    """The bare loop's state: its groups' roots, its free slots (pooled) and what runs."""

    def __init__(self, mode: str, parallel: int) -> None:
        self.mode = mode
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC  # as a job's log is opened
        self.log = os.open(os.path.join(tempfile.gettempdir(), "launch-floor.log"), flags, 0o600)
        self.tag = f"floor-{os.getpid()}"
        self.roots = () if mode == "none" else (own_v1_group("memory"), own_v1_group("freezer"))
        self.slots = [tuple(f"{r}/{self.tag}-slot{i}" for r in self.roots) for i in range(parallel)]
        self.pool = [d for slot in self.slots for d in slot] if mode == "pooled" else []
        self.running: dict[int, tuple[subprocess.Popen[bytes], tuple[str, ...]]] = {}

    def start(self, n: int) -> None:
        """Start line ``n`` in its groups (made now, or a free slot's)."""
        if self.mode == "pooled":
            groups = self.slots.pop()
        else:
            groups = tuple(f"{root}/{self.tag}-{n}" for root in self.roots)
            for directory in groups:
                os.mkdir(directory)
        proc = subprocess.Popen(
            joined(groups),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.running[proc.pid] = (proc, groups)

    def reap(self) -> None:
        """Reap one ended line; read its peak; remove its groups, or free its slot."""
        pid, status = os.waitpid(-1, 0)
        proc, groups = self.running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if not groups:
            return
        memory = groups[0]
        with open(f"{memory}/memory.max_usage_in_bytes") as f:
            f.read()  # the job's peak, as roomkeeper keeps it
        if self.mode == "own":
            for directory in groups:
                os.rmdir(directory)
            return
        with open(f"{memory}/cgroup.procs") as f:
            f.read()  # nothing of it may be left before the next one joins
        with open(f"{memory}/memory.max_usage_in_bytes", "w") as f:
            f.write("0")
        self.slots.append(groups)

    def stop(self) -> None:
        """Kill and reap what still runs, and remove its own groups."""
        for proc, groups in self.running.values():
            proc.kill()
            proc.wait()
            for directory in groups if self.mode == "own" else ():
                with contextlib.suppress(OSError):
                    os.rmdir(directory)


def run(mode: str, jobs: int, parallel: int) -> None:
    """Start, reap and clean up ``jobs`` lines, ``parallel`` at a time."""
    loop = Loop(mode, parallel)
    started = done = 0
    with made(loop.pool):
        try:
            while done < jobs:
                while started < jobs and len(loop.running) < parallel:
                    loop.start(started)
                    started += 1
                loop.reap()
                done += 1
        finally:
            loop.stop()
    wall = time.monotonic() - STARTED
    what = "no groups" if mode == "none" else f"{mode} groups"
    print(f"bare loop, {what}: {jobs} jobs in {wall:.2f} s, {jobs / wall:.1f} jobs/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", choices=("own", "pooled", "none"), default="own")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    if args.jobs < 1 or args.parallel < 1:
        sys.exit("--jobs and --parallel must be at least 1")
    run(args.groups, args.jobs, args.parallel)


if __name__ == "__main__":
    main()

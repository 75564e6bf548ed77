"""The floor under a batch's cost per job: what the kernel side of a launch costs alone.

A bare single-threaded loop starts ``--jobs`` lines of ``true``, ``--parallel`` at a time,
as roomkeeper batch starts a line (``/bin/sh -c`` writing its pid into each of the job's
groups before the text runs; ``nice -n N`` first only with ``--nice N`` above ours, as a
batch does only when ROOMKEEPER_WORKER_NICE asks), reaps each, reads its group's peak and
removes its groups. Nothing else: no guard, journal, lifeline, sampler, threads or start-up
imports. Whatever roomkeeper does per job comes on top of this.

Modes (``--groups``):

- ``own``: a memory group and a freezer group of its own for each job, made before and
  removed after, as roomkeeper does on a cgroup v1 host;
- ``pooled``: one memory and one freezer group per slot, made once and reused (the peak
  read and reset, the members read), the cheapest way to keep a group per job;
- ``none``: no groups, only the exec chain.

Needs root and cgroup v1 memory and freezer hierarchies for ``own`` and ``pooled``.
Usage: python benchmarks/launch_floor.py [--groups own|pooled|none] [--jobs 1000]
       [--parallel 4] [--nice 0]
Prints the loop's wall time (from after its imports) and jobs per second; bench_overhead.py
times the whole process, as it times a batch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from groups import end_on_sigterm

from roomkeeper.kernel.cgroup_hierarchy import remove_group, v1_controller_group
from roomkeeper.kernel.host import CGROUP_ROOT, PROC_ROOT

STARTED = time.monotonic()  # after the imports: the figure printed is the loop's alone
NICE = shutil.which("nice") or "/usr/bin/nice"
BATCH_NICE = 0  # a batch line's niceness unless ROOMKEEPER_WORKER_NICE says otherwise


def own_v1_groups() -> tuple[str, str]:
    """Where this process makes v1 job groups: its own memory and freezer groups, found as
    roomkeeper finds them (wherever the hierarchies are mounted); exits where there are none."""
    found = [v1_controller_group(c, PROC_ROOT, CGROUP_ROOT) for c in ("memory", "freezer")]
    if any(group is None or not os.path.isdir(group.own_dir) for group in found):
        sys.exit("no cgroup v1 memory and freezer hierarchies here: run with --groups none")
    return tuple(group.own_dir for group in found if group is not None)  # type: ignore[return-value]


def joined(groups: tuple[str, ...], job_nice: int) -> list[str]:
    """The argv roomkeeper runs for shell text ``true`` in ``groups`` at ``job_nice``
    (``nice`` where that is below our priority, then ``sh`` writing its pid into each group
    before the text runs)."""
    joins = " && ".join(f"echo $$ > {shlex.quote(g + '/cgroup.procs')}" for g in groups)
    text = f"{joins} || exit $?; true" if groups else "true"
    increment = max(0, job_nice - os.getpriority(os.PRIO_PROCESS, 0))
    nice = [NICE, "-n", str(increment)] if increment else []
    return [*nice, "/bin/sh", "-c", text]


def remove(directory: str) -> None:
    """rmdir a group, retrying while its last task drains (as roomkeeper does); a group that
    stays is said, not left silently."""
    if not remove_group(directory):
        print(f"launch_floor: could not remove {directory}", file=sys.stderr)


@contextlib.contextmanager
def made(directories: list[str]) -> Iterator[None]:
    """Make ``directories`` (groups); remove what is left of them however the run ends."""
    try:
        for directory in directories:
            os.mkdir(directory)
        yield
    finally:
        for directory in reversed(directories):
            remove(directory)


class Loop:
    """The bare loop's state: its groups' roots, its free slots (pooled) and what runs."""

    def __init__(self, mode: str, parallel: int, job_nice: int) -> None:
        self.mode = mode
        self.job_nice = job_nice
        self.tag = f"floor-{os.getpid()}"
        self.roots = () if mode == "none" else own_v1_groups()
        # Every line's output goes to one file of this run's own, as a line's to its log.
        self.log, self.log_path = tempfile.mkstemp(prefix="launch-floor-", suffix=".log")
        self.slots = [tuple(f"{r}/{self.tag}-slot{i}" for r in self.roots) for i in range(parallel)]
        self.pool = [d for slot in self.slots for d in slot] if mode == "pooled" else []
        self.running: dict[int, tuple[subprocess.Popen[bytes], tuple[str, ...]]] = {}
        self.making: tuple[str, ...] = ()
        self.ended: tuple[str, ...] = ()  # the groups of the line being reaped

    def start(self, n: int) -> None:
        """Start line ``n`` in its groups (made now, or a free slot's)."""
        if self.mode == "pooled":
            groups = self.slots.pop()
        else:
            groups = tuple(f"{root}/{self.tag}-{n}" for root in self.roots)
            self.making = groups  # removed by stop() if the start fails half way
            for directory in groups:
                os.mkdir(directory)
        proc = subprocess.Popen(
            joined(groups, self.job_nice),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.running[proc.pid] = (proc, groups)
        self.making = ()

    def reap(self) -> None:
        """Reap one ended line; read its peak; remove its groups, or free its slot."""
        pid, status = os.waitpid(-1, 0)
        proc, groups = self.running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if not groups:
            return
        self.ended = groups if self.mode == "own" else ()  # removed by stop() on a failure
        memory = groups[0]
        with open(f"{memory}/memory.max_usage_in_bytes") as f:
            f.read()  # the job's peak, as roomkeeper keeps it
        if self.mode == "own":
            for directory in groups:
                remove(directory)
            self.ended = ()
            return
        with open(f"{memory}/cgroup.procs") as f:
            f.read()  # nothing of it may be left before the next one joins
        with open(f"{memory}/memory.max_usage_in_bytes", "w") as f:
            f.write("0")
        self.slots.append(groups)

    def stop(self) -> None:
        """Kill and reap what still runs, and remove the groups of its own (and of a line
        being started or reaped when the loop stopped)."""
        left = [self.making, self.ended]
        for proc, groups in self.running.values():
            proc.kill()
            proc.wait()
            left.append(groups)
        if self.mode == "own":
            for directory in (d for groups in left for d in groups):
                if os.path.isdir(directory):
                    remove(directory)


def run(mode: str, jobs: int, parallel: int, job_nice: int) -> None:
    """Start, reap and clean up ``jobs`` lines, ``parallel`` at a time, at ``job_nice``."""
    loop = Loop(mode, parallel, job_nice)
    started = done = 0
    try:
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
    finally:
        os.close(loop.log)
        os.unlink(loop.log_path)
    wall = time.monotonic() - STARTED
    what = "no groups" if mode == "none" else f"{mode} groups"
    print(f"bare loop, {what}: {jobs} jobs in {wall:.2f} s, {jobs / wall:.1f} jobs/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", choices=("own", "pooled", "none"), default="own")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument(
        "--nice", type=int, default=BATCH_NICE, help="the lines' niceness (a batch's: 0)"
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.parallel < 1:
        sys.exit("--jobs and --parallel must be at least 1")
    if not -20 <= args.nice <= 19:
        sys.exit(f"--nice must be in -20..19 (got {args.nice})")
    # A SIGTERM ends the loop through its clean-up, as Ctrl-C does; the clean-up is not cut.
    signal.signal(signal.SIGTERM, end_on_sigterm)
    try:
        run(args.groups, args.jobs, args.parallel, args.nice)
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)  # cleaned up on the way out; nothing more to say
    except OSError as err:  # not root, a read-only cgroup mount, no /proc
        sys.exit(f"cannot make or join a group ({err}): run as root, or with --groups none")


if __name__ == "__main__":
    main()

"""Cost of one full Guard.admit + release, against its bare reads and a df-per-decision way.

Each decision reads memory (cgroup files) and disk, and judges.  Timed side by
side in the same run:

- the bare reads: the kernel files one decision reads (recorded from the
  guard's first decision by an audit hook, less ``/proc/self/mountinfo``, which
  is parsed again only when the kernel signals a change), each opened, read and
  closed, and one ``statvfs`` of the workspace: the floor a decision cannot go
  under without reading less;
- a simpler guard that reads disk with a ``df -Pk`` subprocess per decision.

Usage: python benchmarks/bench_guard.py [--calls 10000] [--df-calls 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from roomkeeper.guard import admission
from roomkeeper.guard.admission import Guard
from roomkeeper.kernel.resources import DiskReading


def df_disk(workspace: str | os.PathLike[str] | None = None) -> DiskReading:
    """The simple way: one ``df -Pk`` subprocess per reading."""
    path = str(workspace)
    out = subprocess.run(["df", "-Pk", path], capture_output=True, text=True, check=True).stdout
    fields = out.splitlines()[1].split()
    return DiskReading(path, int(fields[3]) * 1024, int(fields[1]) * 1024)


def time_calls(guard: Guard, calls: int) -> list[float]:
    """Microseconds per admit + release, one sample per call."""
    samples = []
    for i in range(calls):
        job = f"job-{i}"
        start = time.perf_counter()
        guard.admit(job)
        guard.release(job)
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


_recording: list[list[str]] = []  # while a decision is recorded: the one list opens go to


def _record_opens(event: str, args: tuple[object, ...]) -> None:
    if _recording and event == "open" and isinstance(args[0], str):
        _recording[0].append(args[0])


def files_of_one_decision(workspace: str) -> list[str]:
    """The kernel files a fresh guard's first decision opens (the later ones read the same)."""
    opened: list[str] = []
    _recording.append(opened)
    try:
        guard = Guard(workspace=workspace)
        guard.admit("first")
        guard.release("first")
    finally:
        _recording.clear()
    kernel = [p for p in opened if p.startswith(("/proc/", "/sys/"))]
    return [p for p in dict.fromkeys(kernel) if not p.endswith("/mountinfo")]


def time_bare_reads(paths: list[str], workspace: str, calls: int) -> list[float]:
    """Microseconds per round of the bare reads: open, read, close each file; one statvfs."""
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        for path in paths:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            os.read(fd, 65536)
            os.close(fd)
        os.statvfs(workspace)
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--df-calls", type=int, default=1_000)
    args = parser.parse_args()
    sys.addaudithook(_record_opens)
    with tempfile.TemporaryDirectory() as workspace:
        paths = files_of_one_decision(workspace)
        print("a decision reads: " + ", ".join(paths) + ", statvfs of the workspace")
        guard = Guard(workspace=workspace)
        first = guard.admit("warm-up")
        guard.release("warm-up")
        print(f"reading: {first.summary}")
        bare = time_bare_reads(paths, workspace, args.calls)
        ours = time_calls(guard, args.calls)
        bare_again = time_bare_reads(paths, workspace, args.calls)  # before and after: drift
        real_read_disk = admission.read_disk
        admission.read_disk = df_disk  # the df reader, same judgement
        try:
            theirs = time_calls(guard, args.df_calls)
        finally:
            admission.read_disk = real_read_disk
    ours_p50, theirs_p50 = percentile(ours, 0.5), percentile(theirs, 0.5)
    bare_p50 = percentile(bare + bare_again, 0.5)
    print(
        f"bare reads:    {2 * args.calls} rounds  p50 {bare_p50:.1f} us  "
        f"p99 {percentile(bare + bare_again, 0.99):.1f} us"
    )
    print(
        f"statvfs guard: {args.calls} calls  p50 {ours_p50:.1f} us  "
        f"p99 {percentile(ours, 0.99):.1f} us  mean {statistics.fmean(ours):.1f} us"
    )
    print(
        f"df -Pk guard:  {args.df_calls} calls  p50 {theirs_p50:.1f} us  "
        f"p99 {percentile(theirs, 0.99):.1f} us"
    )
    print(f"ratio (df p50 / statvfs p50): {theirs_p50 / ours_p50:.1f}x")
    print(f"cost of a decision over its bare reads (p50 / p50): {ours_p50 / bare_p50:.2f}x")


if __name__ == "__main__":
    main()

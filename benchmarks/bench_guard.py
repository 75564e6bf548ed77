"""Cost of one full Guard.admit + release, against a df-per-decision way.

Each decision reads memory (cgroup files) and disk, and judges.  A simpler guard would
read disk with a ``df -Pk`` subprocess per decision; the same decision with
that reader swapped in is timed side by side in the same run.

Usage: python benchmarks/bench_guard.py [--calls 10000] [--df-calls 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--df-calls", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workspace:
        guard = Guard(workspace=workspace)
        first = guard.admit("warm-up")
        guard.release("warm-up")
        print(f"reading: {first.summary}")
        ours = time_calls(guard, args.calls)
        real_read_disk = admission.read_disk
        admission.read_disk = df_disk  # the df reader, same judgement
        try:
            theirs = time_calls(guard, args.df_calls)
        finally:
            admission.read_disk = real_read_disk
    ours_p50, theirs_p50 = percentile(ours, 0.5), percentile(theirs, 0.5)
    print(
        f"statvfs guard: {args.calls} calls  p50 {ours_p50:.1f} us  "
        f"p99 {percentile(ours, 0.99):.1f} us  mean {statistics.fmean(ours):.1f} us"
    )
    print(
        f"df -Pk guard:  {args.df_calls} calls  p50 {theirs_p50:.1f} us  "
        f"p99 {percentile(theirs, 0.99):.1f} us"
    )
    print(f"ratio (df p50 / statvfs p50): {theirs_p50 / ours_p50:.1f}x")


if __name__ == "__main__":
    main()

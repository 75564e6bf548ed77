"""The peak measured for a job holding 100 MB, with and without a job group, and its label.

Run as root from the checkout: ``.venv/bin/python benchmarks/bench_peaks.py``
(on the host, cgroup v1) and inside the cgroup v2 VM
(in a cgroup v2 machine: ``.venv/bin/python benchmarks/bench_peaks.py``).
Each job touches 100 MB (10**8 bytes) of anonymous memory, holds it for a
second, lets go of it and lingers: the peak must remember what the end no
longer shows.  Prints one line per mode, and where job groups went.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from roomkeeper.kernel.delegation import prepare_job_groups
from roomkeeper.kernel.job_cgroups import JobCgroup
from roomkeeper.processes.launch import LaunchSpec, launch

HOLD_100_MB = (
    "import time; b = bytearray(100 * 10**6); b[::4096] = b'x' * len(range(0, len(b), 4096));"
    "time.sleep(1.0); del b; time.sleep(0.3)"
)


def main() -> None:
    """Run the job in each mode and print its peak and how it was taken."""
    place = prepare_job_groups()
    print(f"job groups: {place.describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        for use_cgroup in (True, False):
            argv = [sys.executable, "-c", HOLD_100_MB]
            spec = LaunchSpec(argv, str(Path(tmp, "job.log")), use_cgroup=use_cgroup)
            job = launch("peak", spec)
            try:
                job.wait()
                peak = job.peak()
                group = "job group" if job.cgroup_dir else f"no job group ({job.cgroup_note})"
                mark = None
                if job.cgroup_dir is not None and place.version is not None:
                    mark = JobCgroup(job.cgroup_dir, place.version).peak_bytes()
            finally:
                job.close()
            line = f"{group}: peak {peak.bytes / 10**6:.1f} MB ({peak.method.value})"
            if mark is not None:
                line += f"; the kernel's own mark, cache included: {mark / 10**6:.1f} MB"
            print(line)


if __name__ == "__main__":
    main()

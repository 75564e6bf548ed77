"""A job's peak memory is true and says how it was taken: with and without a job group."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from roomkeeper.processes.launch import LaunchSpec
from roomkeeper.processes.peaks import PeakMethod, PeakSampler
from tests.cgroups import cgroup_fs_read_only, memory_cgroup_version
from tests.processes import Reaper, read_log

MB = 10**6

# Holds 100 MB of touched anonymous memory for a second, then lets go of it
# and lingers: the peak must remember what the end no longer shows.
HOLD_100_MB = (
    "import time; b = bytearray(100 * 10**6); b[::4096] = b'x' * len(range(0, len(b), 4096));"
    "print('ready', flush=True); time.sleep(1.0); del b; time.sleep(0.3)"
)


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.parametrize("use_cgroup", [True, False], ids=["job-group", "no-job-group"])
def test_a_100_mb_job_peaks_at_about_100_mb_and_says_how(
    tmp_path: Path, reaper: Reaper, use_cgroup: bool
) -> None:
    """memory.peak on v2, sampled from the v1 group, else sampled from the tree: ~100 MB each."""
    log = tmp_path / "hold.log"
    spec = LaunchSpec([sys.executable, "-c", HOLD_100_MB], str(log), use_cgroup=use_cgroup)
    job = reaper.launch("hold", spec)
    fallback = use_cgroup and cgroup_fs_read_only()  # no group there: sampled, and says so
    if fallback:
        assert job.cgroup_dir is None and "read-only" in (job.cgroup_note or ""), job.cgroup_note
    elif use_cgroup and job.cgroup_dir is None:
        pytest.skip(f"no job group here: {job.cgroup_note}")
    assert job.wait(120) == 0
    assert "ready" in read_log(log, "ready")
    peak = job.peak()
    if not use_cgroup or fallback:
        expected = PeakMethod.SAMPLED
    elif memory_cgroup_version() == 2:
        expected = PeakMethod.KERNEL
    else:
        expected = PeakMethod.SAMPLED_CGROUP
    assert peak.method is expected
    assert 95 * MB <= peak.bytes <= 150 * MB, peak
    job.close()
    assert job.peak() == peak  # kept once the job's group is gone
    print(f"peak of a 100 MB job: {peak.bytes / MB:.1f} MB ({peak.method.value})")


class _Counting:
    """A tree that counts its samples and is done after ``rounds``."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.samples = 0

    @property
    def needs_process_table(self) -> bool:
        return False

    def sample(self, table: object) -> bool:
        self.samples += 1
        return self.samples < self.rounds


def test_sampler_visits_each_tree_at_its_rate_and_stops_when_none_is_left() -> None:
    """Each tree is sampled every interval until it says it is done; then the thread ends."""
    sampler = PeakSampler(interval=0.01)
    trees = [_Counting(3), _Counting(6)]
    for tree in trees:
        sampler.add(tree)
    deadline = time.monotonic() + 10
    while sampler.sampling() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [t.samples for t in trees] == [3, 6]
    assert sampler.sampling() == 0

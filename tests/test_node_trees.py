"""A Ray node's trees as its ladder sees them: real processes, SIGSTOP and SIGCONT, on a fake
clock, so that the node stops a frozen tree to let an older frozen one go on, as the gateway
does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from roomkeeper.cluster.watch import NodeTrees, _Tree
from roomkeeper.config import PressureSettings
from roomkeeper.guard.lines import Reading
from roomkeeper.relief.ladder import LadderState, Step, decide
from roomkeeper.testing import FakeClock

pytestmark = pytest.mark.kernel

MB, GB = 10**6, 10**9
SETTINGS = PressureSettings(full_percent=20.0, full_seconds=5.0, cooldown_s=60.0, retries=3)
# Writes every page of 200 MB, says so, and sleeps: a tree whose memory a stop gives back.
HOLDER = (
    "import time\n"
    "b = bytearray(200 * 10**6)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def trees() -> Iterator[tuple[NodeTrees, FakeClock, list[subprocess.Popen[bytes]]]]:
    """Node trees on a fake clock, and the processes the test starts (killed afterwards)."""
    clock = FakeClock()
    started: list[subprocess.Popen[bytes]] = []
    yield NodeTrees(clock=clock, grace_s=0.5), clock, started
    for proc in started:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _follow(
    rig: tuple[NodeTrees, FakeClock, list[subprocess.Popen[bytes]]],
    name: str,
    argv: list[str],
    estimate: int,
    *,
    runs_again: bool = True,
) -> subprocess.Popen[bytes]:
    node, clock, started = rig
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
    started.append(proc)
    node.track(_Tree(name, proc.pid, clock(), estimate, True, False, runs_again=runs_again))
    return proc


def _stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def test_a_node_tree_counts_its_run_and_its_suspension_apart(
    trees: tuple[NodeTrees, FakeClock, list[subprocess.Popen[bytes]]],
) -> None:
    """Run time leaves every suspension out; the time suspended counts the one now; a tree
    that would not run again says so."""
    node, clock, _ = trees
    first = _follow(trees, "first", ["sleep", "60"], 100 * MB)
    _follow(trees, "once", ["sleep", "60"], 100 * MB, runs_again=False)
    clock.advance(30)
    assert node.suspend_all_for_pressure(["first", "once"]) == ["first", "once"]
    assert _stopped(first.pid)  # really frozen
    clock.advance(20)
    live = {j.job_id: j for j in node.live_jobs()}
    assert (live["first"].ran_s, live["first"].suspended_s) == (30.0, 20.0)
    assert (live["first"].runs_again, live["once"].runs_again) == (True, False)
    assert node.resume_after_pressure("first")
    assert not _stopped(first.pid)
    clock.advance(10)
    live = {j.job_id: j for j in node.live_jobs()}
    assert (live["first"].ran_s, live["first"].suspended_s) == (40.0, 0.0)
    assert (live["once"].ran_s, live["once"].suspended_s) == (30.0, 30.0)
    assert node.suspend_all_for_pressure(["first"]) == ["first"]
    clock.advance(5)
    live = {j.job_id: j for j in node.live_jobs()}
    assert (live["first"].ran_s, live["first"].suspended_s) == (40.0, 5.0)


def test_a_node_stops_its_newest_frozen_tree_once_the_frozen_waited_as_long_as_it_ran(
    trees: tuple[NodeTrees, FakeClock, list[subprocess.Popen[bytes]]],
) -> None:
    """Trees frozen together on a node, the newest that would run again holding 200 MB: once
    the frozen trees have waited together as long as it ran, the node's ladder stops it
    (SIGTERM, then SIGKILL), since its memory back lets the older one go on; not a moment
    before, and never the newer tree a stop would not queue again."""
    node, clock, _ = trees
    _follow(trees, "running", ["sleep", "60"], 10 * MB)
    older = _follow(trees, "older", ["sleep", "60"], 100 * MB)
    newest = _follow(trees, "newest", [sys.executable, "-c", HOLDER], 250 * MB)
    # Newer still, but a stop would not queue it again: passed over.
    _follow(trees, "once", ["sleep", "60"], 10 * MB, runs_again=False)
    assert newest.stdout is not None and newest.stdout.readline() == b"held\n"
    clock.advance(30)
    frozen = ["older", "newest", "once"]
    assert node.suspend_all_for_pressure(frozen) == frozen
    live = node.live_jobs()
    footprint = next(j.footprint for j in live if j.job_id == "newest")
    assert footprint > 150 * MB, footprint
    # Used sits between the line (1.8 GB) and the suspend line (1.9): the older tree's rest
    # does not fit now, and fits once the newest's memory is back.
    # The three frozen trees idle together: 27 s after 9 s, 30 s (what it ran) after 10 s.
    used = 1850 * MB
    clock.advance(9)
    plan, _ = decide(LadderState(), _reading(used), node.live_jobs(), SETTINGS, cooling=False)
    assert not any(a.step is Step.STOP for a in plan.actions)
    clock.advance(1)
    plan, _ = decide(LadderState(), _reading(used), node.live_jobs(), SETTINGS, cooling=False)
    stops = [a for a in plan.actions if a.step is Step.STOP]
    assert [a.job_id for a in stops] == ["newest"], plan
    why = "3 suspended tree(s) idle 30 s together since it was suspended 10 s ago, after running"
    assert f"{why} 30 s" in stops[0].why, stops[0].why
    assert node.stop_for_pressure("newest", stops[0].why, never_fits=False)
    assert newest.wait(10) is not None  # thawed to die of it
    stopped = node.forget("newest")
    assert stopped is not None and stopped.why == stops[0].why
    assert _stopped(older.pid)  # the older one waits for the ladder's resume


def _reading(used: int) -> Reading:
    return Reading(
        used=used, limit=2 * GB, headroom_percent=10.0, reserve=0, full_avg10=None, at=0.0
    )

"""Managed processes and the lifeline, on real processes, real signals and real cgroups."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from roomkeeper.errors import LaunchError, UsageError
from roomkeeper.kernel.cgroup_hierarchy import own_memory_level
from roomkeeper.kernel.freezer import FreezerGroup
from roomkeeper.kernel.job_cgroups import JobCgroup, create_job_cgroup, job_cgroup_parent
from roomkeeper.kernel.proc import (
    read_stat,
)
from roomkeeper.processes import process as process_module
from roomkeeper.processes.launch import LaunchSpec, _joined_shell
from roomkeeper.processes.lifeline import Lifeline, LifelineStatistics
from roomkeeper.processes.orphans import become_subreaper
from roomkeeper.processes.peaks import PeakMethod
from roomkeeper.processes.process import ManagedProcess
from roomkeeper.testing import FakeClock
from tests.cgroups import cgroup_fs_read_only
from tests.kernel_files import FIXTURES
from tests.processes import Reaper, gone, python, read_log

MIB = 1 << 20

# A job that builds a tree and prints "<name> <pid>" for each member:
#   kept:    a child that stays, with a grandchild that called setsid()
#   orphan:  a grandchild whose parent (a child) already exited
#   escapee: (argv "escapee") a grandchild that called setsid() and lost its parent
# then the leader ignores SIGTERM, so only SIGKILL ends it.
TREE = textwrap.dedent(
    """
    import os, signal, sys, time

    def branch(name, setsid, orphan):
        r, w = os.pipe()
        if os.fork() == 0:
            if os.fork() == 0:
                if setsid:
                    os.setsid()
                os.write(w, f"{os.getpid()}".encode())
                time.sleep(60)
                os._exit(0)
            if orphan:
                os._exit(0)
            time.sleep(60)
            os._exit(0)
        os.close(w)
        print(name, int(os.read(r, 32)), flush=True)

    branch("kept", setsid=True, orphan=False)
    branch("orphan", setsid=False, orphan=True)
    if "escapee" in sys.argv:
        branch("escapee", setsid=True, orphan=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def pids_in(text: str) -> dict[str, int]:
    """The "<name> <pid>" lines of a log."""
    return {
        fields[0]: int(fields[1])
        for line in text.splitlines()
        if len(fields := line.split()) == 2 and fields[1].isdigit()
    }


def fake_sleep(clock: FakeClock) -> Callable[[float], None]:
    """A sleep that moves the fake clock, yielding the CPU a moment for signals to land."""

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        time.sleep(0.001)

    return sleep


@pytest.fixture
def subreaper() -> Iterator[None]:
    """This process adopts orphans for the test's duration."""
    if not become_subreaper():
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available on this platform")
    try:
        yield
    finally:
        become_subreaper(False)


@pytest.fixture
def cgroup_ok() -> bool:
    """Whether a job cgroup is made here: False in a read-only cgroup layout (a container's),
    where the test checks the fallback instead; skips where none can be made for another
    reason (not root, no memory controller)."""
    if cgroup_fs_read_only():
        return False
    made = create_job_cgroup("probe")
    if isinstance(made, str):
        pytest.skip(f"no job cgroup on this machine: {made}")
    made.remove()
    return True


def test_argv_runs_without_a_shell(tmp_path: Path, reaper: Reaper) -> None:
    """Arguments with ; and $HOME reach the program literally: no shell is involved."""
    log = tmp_path / "job.log"
    argv = python("import sys; print(sys.argv[1:])", "a;b", "$HOME", "`id`")
    job = reaper.launch("literal", LaunchSpec(argv, str(log)))
    assert job.wait(10) == 0
    assert log.read_text() == "['a;b', '$HOME', '`id`']\n"


def test_shell_true_runs_shell_text(tmp_path: Path, reaper: Reaper) -> None:
    """shell=True runs one string with /bin/sh -c."""
    log = tmp_path / "job.log"
    job = reaper.launch("shell", LaunchSpec("echo $((2 + 3)); exit 4", str(log), shell=True))
    assert job.wait(10) == 4
    assert log.read_text() == "5\n"


@pytest.mark.kernel
@pytest.mark.cgroups
def test_shell_text_joins_its_groups_before_its_first_command(
    tmp_path: Path, reaper: Reaper, cgroup_ok: bool
) -> None:
    """The shell that runs the text is in the job's groups when the text's first command runs,
    and so is what it forks; no other process runs before it (it is the job's pid)."""
    if not cgroup_ok:
        pytest.skip("the cgroup layout here is read-only: a job gets no group to join")
    log = tmp_path / "job.log"
    text = "echo shell $$; cat /proc/$$/cgroup; sh -c 'cat /proc/$$/cgroup'"
    job = reaper.launch("joined", LaunchSpec(text, str(log), shell=True))
    assert job.wait(10) == 0
    out = log.read_text().splitlines()
    assert out[0] == f"shell {job.pid}"
    own = job_cgroup_parent()
    assert own is not None
    mark = ":memory:" if own.version == 1 else "0::"
    groups = [line for line in out[1:] if mark in line]
    assert job.cgroup_dir is not None and len(groups) == 2, out
    assert all(line.endswith("/" + os.path.basename(job.cgroup_dir)) for line in groups), out
    if job.freezer_dir is not None:
        frozen = [line for line in out[1:] if ":freezer:" in line]
        assert len(frozen) == 2, out
        assert all(line.endswith("/" + os.path.basename(job.freezer_dir)) for line in frozen)


def test_joined_shell_text_says_and_ends_as_the_text_alone(tmp_path: Path) -> None:
    """Whatever joins the groups before the text, the shell's messages and status are those of
    the text run alone: an error on its second line is said to be on line 2.  Both groups'
    files get the shell's pid before the text runs."""
    procs = [tmp_path / "memory.procs", tmp_path / "freezer.procs"]
    for path in procs:
        path.touch()
    text = "cat " + " ".join(str(p) for p in procs) + "\ntrue\nfi\n"
    alone = subprocess.run(["/bin/sh", "-c", text], capture_output=True, text=True, check=False)
    joined = subprocess.run(
        _joined_shell([str(p) for p in procs], text), capture_output=True, text=True, check=False
    )
    assert joined.returncode == alone.returncode != 0
    assert joined.stderr == alone.stderr and " 3: " in alone.stderr  # the line it names
    pid, again = joined.stdout.split()
    assert pid == again and int(pid) > 0  # one shell, in both files before the text ran


def test_a_join_that_fails_runs_none_of_the_text(tmp_path: Path) -> None:
    """Where a group cannot be joined (the second here), the text does not run unwatched."""
    marker = tmp_path / "ran"
    procs = [str(tmp_path / "ok.procs"), str(tmp_path / "gone" / "cgroup.procs")]
    joined = subprocess.run(
        _joined_shell(procs, f"touch {marker}"), capture_output=True, text=True, check=False
    )
    assert joined.returncode != 0 and "gone" in joined.stderr
    assert not marker.exists()


def test_spec_refuses_shell_text_without_shell(tmp_path: Path) -> None:
    """A string argv without shell=True, or several with it, is refused with the way out."""
    with pytest.raises(UsageError, match=r"shell=True runs shell text"):
        LaunchSpec("ls -l", str(tmp_path / "x.log"))
    with pytest.raises(UsageError, match="argv must be one string"):
        LaunchSpec(["ls", "-l"], str(tmp_path / "x.log"), shell=True)


def test_output_lands_in_the_log_and_is_kept_after_stop(tmp_path: Path, reaper: Reaper) -> None:
    """stdout and stderr both go to the log file, which stays after the job is stopped."""
    log = tmp_path / "job.log"
    code = (
        "import sys, time; print('out', flush=True); print('err', file=sys.stderr, flush=True);"
        "print('ready', flush=True); time.sleep(60)"
    )
    job = reaper.launch("output", LaunchSpec(python(code), str(log)))
    read_log(log, "ready")
    clock = FakeClock()
    assert job.stop(grace=5.0, clock=clock, sleep=fake_sleep(clock)) == -signal.SIGTERM
    job.close()
    assert log.read_text().splitlines() == ["out", "err", "ready"]


def test_own_session_and_nice_reach_a_grandchild(tmp_path: Path, reaper: Reaper) -> None:
    """The job leads its own session and group, and its nice value is a grandchild's too."""
    log = tmp_path / "job.log"
    code = (
        "import os, subprocess, sys; print('leader', os.getsid(0), os.getpgid(0), os.nice(0));"
        "sys.stdout.flush(); subprocess.run([sys.executable, '-c', "
        "'import os; print(\"grandchild\", os.getsid(0), os.getpgid(0), os.nice(0))'])"
    )
    job = reaper.launch("nice", LaunchSpec(python(code), str(log), nice=13))
    assert job.wait(10) == 0
    expected_nice = max(13, os.nice(0))  # never raised above the scheduler's own
    lines = [line.split() for line in log.read_text().splitlines()]
    assert lines == [
        ["leader", str(job.pid), str(job.pid), str(expected_nice)],
        ["grandchild", str(job.pid), str(job.pid), str(expected_nice)],
    ]
    assert os.getsid(0) != job.pid


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.parametrize("use_cgroup", [True, False], ids=["cgroup", "no-cgroup"])
def test_stop_kills_the_whole_tree(
    tmp_path: Path,
    reaper: Reaper,
    subreaper: None,
    use_cgroup: bool,
    request: pytest.FixtureRequest,
) -> None:
    """SIGTERM, the grace period, then SIGKILL reach a setsid() grandchild and an orphan."""
    grouped = use_cgroup and request.getfixturevalue("cgroup_ok")
    log = tmp_path / "tree.log"
    args = ("escapee",) if grouped else ()  # only a cgroup finds a parentless setsid()
    job = reaper.launch("tree", LaunchSpec(python(TREE, *args), str(log), use_cgroup=use_cgroup))
    assert (job.cgroup_dir is not None) == grouped, job.cgroup_note  # read-only: no group
    members = pids_in(read_log(log, "ready"))
    assert set(members) == {"kept", "orphan", *args}
    reaper.watch(*members.values())
    clock = FakeClock()
    start = clock()
    assert job.stop(grace=5.0, clock=clock, sleep=fake_sleep(clock)) == -signal.SIGKILL
    assert clock() - start >= 5.0  # the leader ignored SIGTERM: the whole grace was given
    assert [name for name, pid in members.items() if not gone(pid)] == []
    job.close()
    stats = {name: read_stat(pid) for name, pid in members.items()}
    adopted = [name for name, stat in stats.items() if stat and stat.ppid == os.getpid()]
    assert adopted == []  # the orphans that came to us (subreaper) were reaped by close()


def test_stop_does_not_wait_for_a_tree_that_obeys_sigterm(tmp_path: Path, reaper: Reaper) -> None:
    """A tree that exits on SIGTERM is not held for the grace period nor SIGKILLed."""
    log = tmp_path / "job.log"
    code = "import time; print('ready', flush=True); time.sleep(60)"
    job = reaper.launch("obedient", LaunchSpec(python(code), str(log)))
    read_log(log, "ready")
    clock = FakeClock()
    start = clock()
    assert job.stop(grace=5.0, clock=clock, sleep=fake_sleep(clock)) == -signal.SIGTERM
    assert clock() - start < 5.0


SCHEDULER = textwrap.dedent(
    """
    import sys, time
    from roomkeeper.processes.lifeline import Lifeline
    from roomkeeper.processes.launch import LaunchSpec, launch
    from roomkeeper.processes.orphans import become_subreaper

    tmp, tree, with_cgroup = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    become_subreaper()
    lifeline = Lifeline()
    jobs = [
        launch("a", LaunchSpec([sys.executable, "-c", tree, "escapee"] if with_cgroup
               else [sys.executable, "-c", tree], f"{tmp}/a.log", use_cgroup=with_cgroup),
               lifeline=lifeline),
        launch("b", LaunchSpec([sys.executable, "-c", tree], f"{tmp}/b.log", use_cgroup=False),
               lifeline=lifeline),
    ]
    print(lifeline.pid, *(job.pid for job in jobs), jobs[0].cgroup_dir or "-", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.kernel
@pytest.mark.cgroups
def test_lifeline_kills_every_tree_when_the_scheduler_is_sigkilled(
    tmp_path: Path, reaper: Reaper, subreaper: None
) -> None:
    """SIGKILL of the scheduler leaves no member of any managed tree alive 2 s later.

    We are a subreaper here only so that the dead trees come to us to be reaped.
    """
    with_cgroup = not isinstance(probe := create_job_cgroup("probe"), str)
    if isinstance(probe, JobCgroup):
        probe.remove()
    scheduler = subprocess.Popen(
        python(SCHEDULER, str(tmp_path), TREE, "1" if with_cgroup else "0"),
        stdout=subprocess.PIPE,
        text=True,
    )
    reaper.watch(scheduler.pid)
    try:
        assert scheduler.stdout is not None
        lifeline_pid, pid_a, pid_b, cgroup_dir = scheduler.stdout.readline().split()
        reaper.watch(int(lifeline_pid), int(pid_a), int(pid_b))
        if cgroup_dir != "-":
            reaper.cgroups.append(cgroup_dir)
        members = {}
        for name in ("a", "b"):
            found = pids_in(read_log(tmp_path / f"{name}.log", "ready"))
            members |= {f"{name}.{member}": pid for member, pid in found.items()}
        assert len(members) == (5 if with_cgroup else 4)
        reaper.watch(*members.values())
        # The lifeline exits once all is killed and the cgroup removed: wait for it too.
        members |= {"a": int(pid_a), "b": int(pid_b), "lifeline": int(lifeline_pid)}
        scheduler.kill()
        scheduler.wait()
        deadline = time.monotonic() + 2.0
        while (alive := [n for n, p in members.items() if not gone(p)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert alive == [], "survivors 2 s after the scheduler was SIGKILLed"
        if cgroup_dir != "-":
            assert not os.path.exists(cgroup_dir)  # the lifeline removed it too
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.wait()
        assert scheduler.stdout is not None
        scheduler.stdout.close()


@pytest.mark.kernel
def test_lifeline_ignores_sigterm_and_sigint_and_exits_on_close() -> None:
    """Ctrl-C or SIGTERM does not end the lifeline; closing its pipe does, cleanly."""
    lifeline = Lifeline()
    lifeline.start()  # returns once the helper has set its signals up
    try:
        pid = lifeline.pid
        assert pid is not None
        assert os.getsid(pid) == pid  # its own session: no terminal signal reaches it
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
    finally:
        # Both signals are pending before end-of-file is: a helper they could
        # kill would report -SIGTERM or -SIGINT here instead of its clean exit.
        assert lifeline.close() == 0
    assert lifeline.pid is None
    assert lifeline.statistics().registered == 0


@pytest.mark.kernel
def test_lifeline_is_replaced_when_it_dies(tmp_path: Path, reaper: Reaper) -> None:
    """A killed helper is replaced on the next registration, which re-sends every job."""
    lifeline = Lifeline()
    try:
        code = "import time; time.sleep(60)"
        a = reaper.launch("a", LaunchSpec(python(code), str(tmp_path / "a.log")), lifeline=lifeline)
        first = lifeline.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        while not gone(first):  # dead before the next registration, not merely dying
            time.sleep(0.001)
        b = reaper.launch("b", LaunchSpec(python(code), str(tmp_path / "b.log")), lifeline=lifeline)
        assert lifeline.pid not in (None, first)
        assert lifeline.statistics() == LifelineStatistics(lifeline.pid, registered=2, starts=2)
        # Closed with both jobs still registered, the new helper kills both: it knows "a" too.
        assert lifeline.close() == 0
        assert (a.wait(5), b.wait(5)) == (-signal.SIGKILL, -signal.SIGKILL)
    finally:
        lifeline.close()


@pytest.mark.kernel
def test_lifeline_outlives_the_thread_that_started_it(tmp_path: Path, reaper: Reaper) -> None:
    """PDEATHSIG fires when the starting *thread* exits; the lifeline must not kill then."""
    lifeline = Lifeline()
    started: list[ManagedProcess] = []
    tids: list[int] = []

    def worker() -> None:
        tids.append(threading.get_native_id())
        spec = LaunchSpec(["sleep", "60"], str(tmp_path / "job.log"))
        started.append(reaper.launch("threaded", spec, lifeline=lifeline))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    job, helper = started[0], lifeline.pid
    try:
        assert helper is not None
        while os.path.exists(f"/proc/self/task/{tids[0]}"):  # once gone, its signal is sent
            time.sleep(0.001)
        while pending_signals(helper):  # and once delivered, the handler has run
            time.sleep(0.001)
        # Had the helper taken the signal for the scheduler's death, it would
        # have killed the job before reading this line.
        lifeline.unregister(job.pid)
        assert lifeline.close() == 0
        assert job.poll() is None
    finally:
        job.close()
        lifeline.close()


def pending_signals(pid: int) -> int:
    """The signals sent to a process and not yet delivered (thread and process masks)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return sum(int(line.split()[1], 16) for line in status if line[:6] in ("SigPnd", "ShdPnd"))


HOLD_100_MIB = "import time; block = b'x' * (100 << 20); print('ready', flush=True); time.sleep(60)"


def _whole_footprint(job: ManagedProcess) -> int:
    """The job's footprint once it reads at least 90 MiB, or the last reading after 3 s.

    A reading made while the sampler holds the tree is the sampler's latest, which may be
    from before the block was whole (a slow kernel makes that likely): read again.
    """
    deadline = time.monotonic() + 3
    while (footprint := job.footprint_bytes()) < 90 * MIB and time.monotonic() < deadline:
        time.sleep(0.05)
    return footprint


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.parametrize("use_cgroup", [True, False], ids=["cgroup", "psutil"])
def test_footprint_of_a_job_holding_100_mib(
    tmp_path: Path, reaper: Reaper, use_cgroup: bool, request: pytest.FixtureRequest
) -> None:
    """A job holding 100 MiB of anonymous memory measures 90-200 MiB, by cgroup or psutil
    (psutil too where a read-only cgroup file system gives it no group)."""
    grouped = use_cgroup and request.getfixturevalue("cgroup_ok")
    log = tmp_path / "job.log"
    spec = LaunchSpec(python(HOLD_100_MIB), str(log), use_cgroup=use_cgroup)
    job = reaper.launch("hold", spec)
    assert (job.cgroup_dir is not None) == grouped, job.cgroup_note
    read_log(log, "ready")
    footprint = _whole_footprint(job)
    assert 90 * MIB <= footprint <= 200 * MIB
    assert job.peak_bytes() >= footprint


def test_missing_executable_is_a_failed_launch(tmp_path: Path, reaper: Reaper) -> None:
    """A program that is not on PATH raises LaunchError naming the job and the program."""
    with pytest.raises(LaunchError, match=r"'no-such-program-rk' not found on PATH") as info:
        reaper.launch("ghost", LaunchSpec(["no-such-program-rk", "x"], str(tmp_path / "g.log")))
    assert info.value.job_id == "ghost"
    with pytest.raises(LaunchError, match=r"'\./nope' does not exist or cannot be run"):
        reaper.launch("ghost", LaunchSpec(["./nope"], str(tmp_path / "g.log"), cwd=str(tmp_path)))
    assert not [name for name in _our_cgroups() if "ghost" in name]


def test_bad_cwd_is_a_failed_launch(tmp_path: Path, reaper: Reaper) -> None:
    """A working directory that does not exist raises LaunchError saying so."""
    missing = str(tmp_path / "missing")
    with pytest.raises(LaunchError, match=r"working directory '.*missing' does not exist") as info:
        reaper.launch("lost", LaunchSpec(["true"], str(tmp_path / "l.log"), cwd=missing))
    assert info.value.job_id == "lost"
    assert not [name for name in _our_cgroups() if "lost" in name]


@pytest.mark.kernel
@pytest.mark.cgroups
def test_cgroup_is_removed_after_close(tmp_path: Path, reaper: Reaper, cgroup_ok: bool) -> None:
    """The job's own cgroup sits under ours while it runs and is gone after close(); in a
    read-only cgroup layout the job runs without one and says why."""
    job = reaper.launch("cg", LaunchSpec(["sleep", "60"], str(tmp_path / "cg.log")))
    if not cgroup_ok:
        assert job.cgroup_dir is None and "read-only" in (job.cgroup_note or ""), job.cgroup_note
        assert job.poll() is None  # it runs all the same
        job.close()
        assert job.poll() is not None
        return
    own = job_cgroup_parent()
    assert own is not None and job.cgroup_dir is not None
    assert os.path.dirname(job.cgroup_dir) == own.directory
    procs = Path(job.cgroup_dir, "cgroup.procs")
    deadline = time.monotonic() + 10  # the trampoline joins the group as its first step
    while str(job.pid) not in procs.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert str(job.pid) in procs.read_text().split()
    job.close()
    assert not os.path.exists(job.cgroup_dir)
    job.close()  # idempotent


@pytest.mark.kernel
@pytest.mark.cgroups
def test_closing_an_ended_job_whose_child_runs_on_kills_the_child(
    tmp_path: Path, reaper: Reaper, cgroup_ok: bool
) -> None:
    """The leader exited but its child still runs in the job's groups: the kernel refuses to
    remove them, so close() stops the child and then removes them."""
    log = tmp_path / "left.log"
    job = reaper.launch("left", LaunchSpec("sleep 60 & echo child $!", str(log), shell=True))
    child = pids_in(read_log(log, "child"))["child"]
    reaper.watch(child)
    assert job.wait(10) == 0
    assert not gone(child)
    job.close()
    assert gone(child)
    if cgroup_ok:
        assert job.cgroup_dir is not None and not os.path.exists(job.cgroup_dir)
    assert job.freezer_dir is None or not os.path.exists(job.freezer_dir)


@pytest.mark.kernel
@pytest.mark.cgroups
def test_closing_an_ended_job_removes_its_groups_without_listing_members(
    tmp_path: Path, reaper: Reaper, cgroup_ok: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ended job with nothing left in its groups is closed by removing them, each once: the
    kernel removes only an empty group, so its members are not listed (a batch closes
    hundreds of jobs a second)."""
    if not cgroup_ok:
        pytest.skip("a read-only cgroup layout gives jobs no group, so members are listed")
    job = reaper.launch("ended", LaunchSpec(["true"], str(tmp_path / "ended.log")))
    assert job.wait(10) == 0 and job.cgroup_dir is not None
    listed: list[str] = []

    def members(directory: str) -> set[int]:
        listed.append(directory)
        return set()

    monkeypatch.setattr(process_module, "cgroup_members", members)
    removals: list[str] = []
    rmdir = os.rmdir

    def counted_rmdir(path: str) -> None:
        removals.append(path)
        rmdir(path)

    monkeypatch.setattr(os, "rmdir", counted_rmdir)
    job.close()
    assert listed == []
    assert not os.path.exists(job.cgroup_dir)
    assert job.freezer_dir is None or not os.path.exists(job.freezer_dir)
    groups = [job.cgroup_dir, *([job.freezer_dir] if job.freezer_dir else [])]
    assert sorted(removals) == sorted(groups)  # each removed once, not asked again


class _RefusedOnceGroup:
    """A job's real group whose first rmdir is refused (a member left), with rising peaks."""

    def __init__(self, real: JobCgroup, peaks: list[int]) -> None:
        self.real, self.peaks = real, peaks
        self.directory, self.version = real.directory, 2
        self.refused = False

    def peak_bytes(self) -> int | None:
        return self.peaks.pop(0) if self.peaks else None

    def remove(self, attempts: int = 100) -> bool:
        if not self.refused:
            self.refused = True
            return False
        return self.real.remove(attempts)


@pytest.mark.kernel
@pytest.mark.cgroups
def test_a_kernel_peak_read_before_a_refused_rmdir_is_read_again_before_the_removal(
    tmp_path: Path, reaper: Reaper, cgroup_ok: bool
) -> None:
    """When the first rmdir is refused, what is left runs on until it is stopped: the peak is
    read again before the group goes, and the higher reading is kept."""
    if not cgroup_ok:
        pytest.skip("a read-only cgroup layout gives jobs no group, hence no kernel peak")
    job = reaper.launch("peaks", LaunchSpec(["true"], str(tmp_path / "peaks.log")))
    assert job.wait(10) == 0 and isinstance(job._cgroup, JobCgroup)
    group = _RefusedOnceGroup(job._cgroup, [100 * MIB, 300 * MIB])
    job._cgroup, job._kernel_keeps_peak = group, True  # type: ignore[assignment]
    job.close()
    assert group.refused and not os.path.exists(group.directory)
    assert (job.peak().bytes, job.peak().method) == (300 * MIB, PeakMethod.KERNEL)


@pytest.mark.kernel
@pytest.mark.cgroups
def test_a_frozen_groups_killed_task_is_thawed_so_the_group_can_go(
    tmp_path: Path, reaper: Reaper
) -> None:
    """A task killed while frozen cannot exit: removing its v1 freezer group thaws it first."""
    job = reaper.launch("frozen", LaunchSpec(["sleep", "60"], str(tmp_path / "frozen.log")))
    if job.freezer_dir is None:
        pytest.skip(f"no v1 freezer group here ({job.cgroup_note or 'a v2 group freezes'})")
    procs = Path(job.freezer_dir, "cgroup.procs")
    deadline = time.monotonic() + 10  # the trampoline joins the group as its first step
    while str(job.pid) not in procs.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert str(job.pid) in procs.read_text().split()
    group = FreezerGroup(job.freezer_dir)
    group.set_frozen(True)
    os.kill(job.pid, signal.SIGKILL)
    assert group.remove(attempts=500)  # 5 s for the killed task to exit once thawed
    assert job.wait(10) == -signal.SIGKILL


def _our_cgroups() -> list[str]:
    own = job_cgroup_parent()
    if own is None:
        return []
    prefix = f"roomkeeper-{os.getpid()}-"
    return [name for name in os.listdir(own.directory) if name.startswith(prefix)]


@pytest.mark.parametrize(
    ("host", "version", "directory", "used", "peak"),
    [
        ("cgroup-v2-host", 2, "sys/fs/cgroup/rkfix_413", 219389968, "memory.peak"),
        ("cgroup-v1-host", 1, "sys/fs/cgroup/memory/rkfix_v1", 226320384, None),
    ],
)
def test_cgroup_readings_on_captured_hosts(
    host: str, version: int, directory: str, used: int, peak: str | None
) -> None:
    """The own group is found from /proc/self, and the footprint leaves the file cache out.

    Job groups go under our own group on v1 only: on v2 they go beside the
    leaf roomkeeper moves into, so none is found before that.
    """
    root = FIXTURES / host
    roots = (str(root / "proc"), str(root / "sys/fs/cgroup"))
    assert own_memory_level(*roots) == (version, str(root / directory))
    group = JobCgroup(str(root / directory), version)
    expected_parent = group if version == 1 else None
    assert job_cgroup_parent(*roots) == expected_parent
    assert group.footprint_bytes() == used
    expected_peak = (root / directory / (peak or "memory.max_usage_in_bytes")).read_text()
    assert group.peak_bytes() == int(expected_peak)


def test_v1_job_cgroup_is_made_under_our_own(tmp_path: Path) -> None:
    """On v1 the job's group is a child of ours, named by pid and a path-safe job id.

    (On v2 it goes under ``<own>/roomkeeper-jobs``: tests/test_job_cgroups.py.)
    """
    root, own = tmp_path / "cgroup-v1-host", "sys/fs/cgroup/memory/rkfix_v1"
    shutil.copytree(FIXTURES / "cgroup-v1-host", root)
    made = create_job_cgroup("a/b c", str(root / "proc"), str(root / "sys/fs/cgroup"))
    assert made == JobCgroup(str(root / own / f"roomkeeper-{os.getpid()}-a_b_c"), 1)
    again = create_job_cgroup("a/b c", str(root / "proc"), str(root / "sys/fs/cgroup"))
    assert isinstance(again, JobCgroup) and again.directory.endswith("a_b_c-1")


def test_lifeline_refuses_registrations_that_would_reach_init() -> None:
    """pid or session 0 or 1 would aim the end-of-file kill at init or our own group."""
    lifeline = Lifeline()
    with pytest.raises(ValueError, match=r"pid and sid must be > 1 \(got 1, 1\)"):
        lifeline.register(1, 1, None)
    assert lifeline.pid is None  # refused before any helper was started


def test_a_footprint_between_samples_measures_known_members_without_walking_proc(
    tmp_path: Path, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pressure monitor's footprint of a tree without a group reads the processes the
    sampler found, never a walk of /proc (seconds beside busy threads on a slow machine)."""
    log = tmp_path / "job.log"
    job = reaper.launch("hold", LaunchSpec(python(HOLD_100_MIB), str(log), use_cgroup=False))
    read_log(log, "ready")

    def no_walk(*_: object, **__: object) -> object:
        raise AssertionError("a footprint walked /proc")

    monkeypatch.setattr(process_module, "scan_proc", no_walk)
    assert 90 * MIB <= _whole_footprint(job) <= 200 * MIB


def _first_reading(job: ManagedProcess) -> float | None:
    """The tree's CPU seconds at the first reading not skipped: a reading made while the
    sampler measures the tree is skipped (None), which a slow kernel makes likely."""
    deadline = time.monotonic() + 3  # one sampler's round, even on an emulated kernel
    while (cpu := job.cpu_seconds()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return cpu


@pytest.mark.kernel
@pytest.mark.cgroups
def test_a_trees_cpu_seconds_keep_its_ended_childrens_and_a_sleeping_tree_has_few(
    tmp_path: Path, reaper: Reaper
) -> None:
    """A child that used 0.5 s of CPU and was reaped is still counted in its tree's CPU
    seconds (the job group's count on v2, the reaper's children's times elsewhere); a tree
    that only sleeps has not used it."""
    spin = python(
        "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    )
    busy_log = tmp_path / "busy.log"
    text = f"{shlex.join(spin)}; echo done; sleep 60"
    busy = reaper.launch("busy", LaunchSpec(text, str(busy_log), shell=True))
    idle = reaper.launch("idle", LaunchSpec(["sleep", "60"], str(tmp_path / "idle.log")))
    read_log(busy_log, "done")
    busy_cpu, idle_cpu = _first_reading(busy), _first_reading(idle)
    # 0.4: the kernel counts in clock ticks, truncated for user and system time apart.
    assert busy_cpu is not None and busy_cpu >= 0.4, busy_cpu
    # Starting `sleep` costs a tick or more of CPU (ten on an emulated kernel), the spin none.
    assert idle_cpu is not None and idle_cpu <= busy_cpu - 0.3, (idle_cpu, busy_cpu)
    busy.close()
    assert busy.cpu_seconds() is None  # closed: nothing left to count

"""`roomkeeper batch` as a person runs it: real commands, real output, real signals."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from roomkeeper.batch.run import SHOW_EVERY_S, BatchSettings, run_batch
from roomkeeper.guard.admission import Guard
from tests.batch_cli import batch
from tests.fakes import NO_DISK
from tests.gateways import zombie_or_gone

pytestmark = pytest.mark.kernel
# The test whose outcome is the kernel's (the peak) is marked `cgroups` too
# and runs again on cgroup v2 in CI; the rest is the command's own behaviour
# over the scheduler's, whose whole-tree stops test_scheduler_real.py runs
# there (each start of the command costs half a minute on the emulated kernel).


def test_each_jobs_output_is_printed_whole_and_unaltered(tmp_path: Path) -> None:
    """Output of one job comes out together, even when jobs interleave their writes."""
    commands = "\n".join(
        f"for i in 1 2 3; do echo job{n}-line$i; sleep 0.05; done" for n in range(4)
    )
    result = batch(tmp_path, "--logs", str(tmp_path / "logs"), stdin=commands + "\n")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 12
    for start in range(0, 12, 3):
        job = lines[start].split("-")[0]
        assert lines[start : start + 3] == [f"{job}-line1", f"{job}-line2", f"{job}-line3"]
    assert sorted((tmp_path / "logs").iterdir()) == [
        tmp_path / "logs" / f"{n}.log" for n in (1, 2, 3, 4)
    ]


def test_cpu_settings_are_the_gateways_only_when_the_environment_sets_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No gateway to keep answering: nice 0 and no CPU gate unless the environment asks."""
    from roomkeeper.config import read_batch_cpu_settings as batch_cpu_settings

    assert batch_cpu_settings({}) == (0, None)
    assert batch_cpu_settings({"ROOMKEEPER_WORKER_NICE": "10"}) == (10, None)
    assert batch_cpu_settings({"ROOMKEEPER_CPU_PRESSURE_PERCENT": "80"}) == (0, 80.0)
    assert batch_cpu_settings({"ROOMKEEPER_WORKER_NICE": " "}) == (0, None)  # empty: unset
    bad = {"ROOMKEEPER_WORKER_NICE": "twenty", "ROOMKEEPER_CPU_PRESSURE_PERCENT": "150"}
    with caplog.at_level(logging.WARNING, logger="roomkeeper"):
        assert batch_cpu_settings(bad) == (0, None)  # the batch's own defaults, not the gateway's
    assert "ROOMKEEPER_WORKER_NICE='twenty' is not usable" in caplog.text
    assert "using the default 0" in caplog.text
    assert "this batch holds no launch for CPU pressure" in caplog.text


def test_jobs_run_at_the_batchs_own_priority_unless_a_nice_is_set(tmp_path: Path) -> None:
    """A real line's nice: the batch's own by default, ROOMKEEPER_WORKER_NICE when set."""
    line = f"{sys.executable} -c 'import os; print(\"nice\", os.nice(0))'\n"
    own = os.nice(0)
    if own >= 10:  # a job's nice is never raised above ours: 0 and 10 would look alike
        pytest.skip(f"the test runner itself runs at nice {own}; run it below 10")
    plain = batch(tmp_path, stdin=line)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["nice", str(own)]
    lowered = batch(tmp_path, stdin=line, ROOMKEEPER_WORKER_NICE="13")
    assert lowered.returncode == 0, lowered.stderr
    assert lowered.stdout.split() == ["nice", str(max(13, own))]


def test_a_logs_directory_used_again_prints_only_this_runs_output(tmp_path: Path) -> None:
    """A second batch with the same --logs replaces each line's log, as parallel --results does."""
    logs = tmp_path / "logs"
    for word in ("first", "second"):
        result = batch(tmp_path, "--logs", str(logs), stdin=f"echo {word}\n")
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"{word}\n"
    assert (logs / "1.log").read_text() == "second\n"


def test_an_old_log_that_is_a_link_is_replaced_and_what_it_names_kept(tmp_path: Path) -> None:
    """A line's old log that is a symlink or a second name of another file is replaced by a
    fresh log; the file it named keeps its text (an emptied log is only ever our own file)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    named = tmp_path / "notes.txt"
    linked = tmp_path / "other.txt"
    named.write_text("keep me\n")
    linked.write_text("keep me too\n")
    (logs / "1.log").symlink_to(named)
    os.link(linked, logs / "2.log")
    (logs / "3.log").write_text("old output\n")
    plain = (logs / "3.log").stat().st_ino
    os.mkfifo(logs / "4.log")  # opened, it would wait for a reader for ever
    lines = "echo one\necho two\necho three\necho four\n"
    result = batch(tmp_path, "--logs", str(logs), stdin=lines)
    assert result.returncode == 0, result.stderr
    assert named.read_text() == "keep me\n"
    assert linked.read_text() == "keep me too\n"
    assert not (logs / "1.log").is_symlink()
    assert (logs / "3.log").stat().st_ino == plain  # our own old log: emptied in place
    logged = [(logs / f"{n}.log").read_text() for n in (1, 2, 3, 4)]
    assert logged == ["one\n", "two\n", "three\n", "four\n"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_an_old_log_of_another_user_is_replaced_not_written_into(tmp_path: Path) -> None:
    """Someone else's file by a line's log name is removed and a log of ours made: our
    output never goes into an inode they can read."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "1.log").write_text("someone else's\n")
    os.chown(logs / "1.log", 65534, 65534)
    result = batch(tmp_path, "--logs", str(logs), stdin="echo one\n")
    assert result.returncode == 0, result.stderr
    assert (logs / "1.log").stat().st_uid == os.geteuid()  # a new file, not theirs emptied
    assert (logs / "1.log").read_text() == "one\n"


def test_an_old_log_that_cannot_be_replaced_is_a_clear_error(tmp_path: Path) -> None:
    """A folder named like a line's log: the batch says which and what to do, starts nothing,
    and prints no traceback."""
    logs = tmp_path / "logs"
    (logs / "1.log").mkdir(parents=True)
    result = batch(tmp_path, "--logs", str(logs), stdin="touch started\n")
    assert result.returncode != 0
    assert "cannot replace the old log" in result.stderr and "--logs" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "started").exists()


def test_exit_code_is_zero_only_when_every_command_succeeded(tmp_path: Path) -> None:
    """One failing line makes the batch exit 1; the summary names each exit code."""
    result = batch(tmp_path, stdin="true\nexit 7\n\necho fine\n")
    assert result.returncode == 1
    assert "3 commands, 1 failed" in result.stderr
    summary = result.stderr[result.stderr.index("roomkeeper batch: 3 commands") :]
    assert "exit 7" in summary and "peak memory" in summary
    ok = batch(tmp_path, stdin="true\necho fine\n")
    assert ok.returncode == 0


@pytest.mark.cgroups
def test_summary_shows_the_true_peak_of_a_100_mb_line_and_how_it_was_taken(
    tmp_path: Path,
) -> None:
    """A line holding 100 MB for a second peaks at about 100 MB, and the summary says how."""
    hold = (
        f"{sys.executable} -c \"b = bytearray(100 * 10**6); b[::4096] = b'x' * 24415; "
        'import time; time.sleep(1)"'
    )
    result = batch(tmp_path, "--quiet", "--job-memory", "200M", stdin=f"{hold}\nsleep 0.5\n")
    assert result.returncode == 0, result.stderr
    rows = {
        cells[0]: cells
        for line in result.stderr.splitlines()
        if (cells := line.split()) and cells[0] in ("1", "2")
    }
    peak = re.search(
        r"([0-9.]+) (kB|MB) \((memory\.peak|sampled cgroup|sampled)\) ", " ".join(rows["1"])
    )
    assert peak is not None, result.stderr
    assert peak[2] == "MB" and 95 <= float(peak[1]) <= 150, result.stderr
    assert re.search(r"\((memory\.peak|sampled cgroup|sampled)\) ", " ".join(rows["2"]))


def test_lines_are_shell_text(tmp_path: Path) -> None:
    """A batch line runs with /bin/sh -c: pipes and variables work."""
    result = batch(tmp_path, stdin="echo a b c | wc -w\n")
    assert result.stdout.strip() == "3"


def test_a_batch_is_one_owner_and_never_meets_the_waiting_bound(tmp_path: Path) -> None:
    """Per-owner caps do not apply inside a batch, and 20 lines pass a waiting bound of 2."""
    gate = tmp_path / "gate"
    gate.mkdir()
    concurrent = (
        f"touch {gate}/$$; for i in $(seq 100); do "
        f'[ "$(ls {gate} | wc -l)" -ge 3 ] && exit 0; sleep 0.05; done; exit 1'
    )
    result = batch(
        tmp_path,
        "--max-running",
        "3",
        "--job-memory",
        "1M",
        stdin="\n".join([concurrent] * 3) + "\n",
        ROOMKEEPER_MAX_RUNNING_PER_OWNER="1",
    )
    assert result.returncode == 0, result.stderr
    many = batch(tmp_path, "--quiet", stdin="true\n" * 20, ROOMKEEPER_MAX_WAITING="2")
    assert many.returncode == 0, many.stderr
    assert "20 commands, 0 failed" in many.stderr


def test_progress_goes_to_stderr_as_plain_lines_off_a_terminal(tmp_path: Path) -> None:
    """Without a terminal, progress is plain lines on stderr; stdout holds only job output."""
    result = batch(tmp_path, stdin="echo x\necho y\n")
    assert result.stdout.splitlines() == ["x", "y"] or result.stdout.splitlines() == ["y", "x"]
    assert "roomkeeper batch: 2/2 done" in result.stderr


def test_usage_errors_say_what_was_wrong(tmp_path: Path) -> None:
    """A bad size, duration or missing file exits 2 with a message and no traceback."""
    for args in (["--job-memory", "lots", "-"], ["--timeout", "soon", "-"], ["/no/such/file"]):
        result = batch(tmp_path, *args, stdin="true\n")
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr
    assert "must be a size such as 600M" in batch(tmp_path, "--job-memory", "x", stdin="").stderr


def test_timeout_stops_a_command_and_fails_the_batch(tmp_path: Path) -> None:
    """--timeout counts from queueing; a command past it is stopped and reported timed_out."""
    result = batch(tmp_path, "--timeout", "1s", stdin="sleep 30\n")
    assert result.returncode == 1
    assert "timed_out" in result.stderr


def test_ctrl_c_stops_every_running_tree(tmp_path: Path) -> None:
    """SIGINT to the batch stops every job's tree, grandchildren that left the group included."""
    pids = tmp_path / "pids"
    pids.mkdir()
    line = (
        f"sleep 60 & echo $! > {pids}/$$.child; setsid sleep 60 & echo $! > {pids}/$$.setsid; wait"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(ROOMKEEPER_HOME=str(tmp_path / "home"), **NO_DISK)
    with (tmp_path / "stderr").open("w") as err_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "roomkeeper",
                "batch",
                "--max-running",
                "2",
                "--job-memory",
                "1M",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
            text=True,
        )
        started: list[int] = []
        try:
            assert proc.stdin is not None
            proc.stdin.write(f"{line}\n{line}\n")
            proc.stdin.close()
            # An emulated kernel (CI's cgroup v2 VM) takes half a minute to start the command.
            deadline = time.monotonic() + 120

            def written() -> list[Path]:  # a pid file exists a moment before its pid is in it
                return [p for p in pids.iterdir() if p.read_text().endswith("\n")]

            while len(written()) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            started = [int(p.read_text()) for p in written()]
            assert len(started) == 4
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            err = (tmp_path / "stderr").read_text()
            assert proc.returncode == 130, err
            assert "interrupted" in err
            time.sleep(0.2)
            survivors = [p for p in started if not zombie_or_gone(p)]
            assert survivors == []
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pid in started:  # these sleeps are ours: never leave them behind
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()


def _start_batch(tmp_path: Path, lines: list[str], max_running: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    env.update(ROOMKEEPER_HOME=str(tmp_path / "home"), **NO_DISK)
    argv = [sys.executable, "-m", "roomkeeper", "batch", "--max-running", str(max_running)]
    with (tmp_path / "stderr").open("w") as err_file:
        proc = subprocess.Popen(
            [*argv, "--job-memory", "1M"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
            text=True,
        )
    assert proc.stdin is not None
    proc.stdin.write("".join(f"{line}\n" for line in lines))
    proc.stdin.close()
    return proc


def _sleepers_left(marks: Path) -> list[int]:
    """The jobs' leaders (pids in ``marks``) still running; each is ours, killed if found."""
    left = []
    for mark in marks.glob("*.started"):
        with contextlib.suppress(ValueError, psutil.Error):
            proc = psutil.Process(int(mark.stem))
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
                proc.kill()
    return left


def test_ctrl_c_while_jobs_start_run_and_end_always_ends_the_batch(tmp_path: Path) -> None:
    """SIGINT lands while short jobs end and others start: the batch exits 130 within its
    close deadline (stop grace plus margin), and no job's tree is left."""
    marks = tmp_path / "marks"
    marks.mkdir()
    lines = [
        f"echo > {marks}/$$.started; sleep 0.{i % 4}; echo > {marks}/$$.ended" for i in range(40)
    ] + [f"echo > {marks}/$$.started; exec sleep 60"] * 2
    proc = _start_batch(tmp_path, lines, max_running=4)
    try:
        # An emulated kernel (CI's cgroup v2 VM) takes its time to start each command.
        deadline = time.monotonic() + 120
        while len(list(marks.glob("*.ended"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(list(marks.glob("*.ended"))) >= 3, (tmp_path / "stderr").read_text()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)  # the close deadline is 2 s of grace and 10 s of margin
        err = (tmp_path / "stderr").read_text()
        assert proc.returncode == 130, err
        assert "interrupted" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        time.sleep(0.2)
        left = _sleepers_left(marks)
    assert left == []


def test_a_second_ctrl_c_exits_at_once(tmp_path: Path) -> None:
    """The second SIGINT does not wait for the trees' stop: exit 130 now; each tree's
    lifeline still takes it down."""
    marks = tmp_path / "marks"
    marks.mkdir()
    # Each job outlives SIGTERM, so the first SIGINT's stop waits its whole grace; it marks
    # that it was sent, so the second SIGINT goes only once the first was acted on (two sent
    # before the batch runs its handler would be taken as one).
    line = (
        f"trap 'echo > {marks}/$$.termed' TERM; echo > {marks}/$$.started; "
        "while :; do sleep 0.1; done"
    )
    proc = _start_batch(tmp_path, [line, line], max_running=2)
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.glob("*.started"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while not list(marks.glob("*.termed")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(marks.glob("*.termed")), "the first SIGINT sent no SIGTERM"
        assert proc.poll() is None  # still stopping the trees, which wait out the grace
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=5)
        assert proc.returncode == 130
        assert "interrupted again" in (tmp_path / "stderr").read_text()
        wait_until_gone = time.monotonic() + 30
        while _alive(marks) and time.monotonic() < wait_until_gone:
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = _sleepers_left(marks)
    assert left == []


def _alive(marks: Path) -> bool:
    for mark in marks.glob("*.started"):
        with contextlib.suppress(ValueError, psutil.Error):
            if psutil.Process(int(mark.stem)).status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def test_lines_that_can_never_fit_fail_at_once_and_say_why(tmp_path: Path) -> None:
    """A job estimate above the container's line: each line fails now, once, with the reason;
    nothing waits for ever and nothing runs."""
    ran = tmp_path / "ran"
    started = time.monotonic()
    result = batch(
        tmp_path,
        "--job-memory",
        "1000T",
        "--logs",
        str(tmp_path / "logs"),
        stdin=f"touch {ran}-1\ntouch {ran}-2\n",
    )
    assert result.returncode == 1
    assert time.monotonic() - started < 30
    assert result.stderr.count("refused 1: no room for memory even with nothing else running") == 1
    assert result.stderr.count("refused 2: no room for memory even with nothing else running") == 1
    assert "2 commands, 2 failed" in result.stderr
    assert not list(tmp_path.glob("ran-*"))


class _CountingProgress:
    """A batch reporter that keeps every update it is given."""

    pressure = None

    def __init__(self) -> None:
        self.updates: list[tuple[int, int, int]] = []

    def output(self, data: bytes) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def update(self, *, done: int, running: int, waiting: int, reason: str) -> None:
        self.updates.append((done, running, waiting))


@pytest.mark.kernel
def test_counts_are_shown_a_few_times_a_second_and_always_at_the_end(tmp_path: Path) -> None:
    """Hundreds of short lines ending a second are not each counted and shown (the counting
    holds the scheduler's lock), yet the last counts shown are the batch's end."""
    lines = 300
    progress = _CountingProgress()
    started = time.monotonic()
    results = run_batch(
        ["true"] * lines,
        BatchSettings(logs_dir=tmp_path / "logs", max_running=4, job_memory=1, quiet=True),
        progress=progress,
        guard=Guard(env=NO_DISK, workspace=tmp_path),
    )
    elapsed = time.monotonic() - started
    assert len(results) == lines and all(r.succeeded for r in results)
    assert progress.updates[-1] == (lines, 0, 0)
    assert len(progress.updates) <= elapsed / SHOW_EVERY_S + 2, (len(progress.updates), elapsed)

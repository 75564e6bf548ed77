"""The memory-metered jobserver: its pieces on their own, then real make, ninja and cargo builds
whose steps grow to a known size in a real memory group."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import psutil
import pytest

from roomkeeper.api.responses import FeedOut, JobOut
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.lines import Reading
from roomkeeper.guard.rule import Decision, Reason
from roomkeeper.jobs.spec import JobState
from roomkeeper.jobserver.census import parse_stat, parse_statm, take_census
from roomkeeper.jobserver.flags import Auth, makeflags, prepare_command
from roomkeeper.jobserver.meter import Jobservers, JobserverSettings
from roomkeeper.jobserver.pool import NEW_LEFT_AFTER_S, JobserverError, TokenPool
from tests.builds import (
    cargo_workspace,
    makefile,
    ninja_file,
    read_trace,
    sampling_steps,
    step_command,
    wheel_ninja,
)
from tests.cgroups import batch_env, memory_box
from tests.gateways import gateway_in_box, roomkeeper_cli, wait_until

AUTH = Auth("/run/x/1.fifo", 7, 8)
LIMIT = 2_000_000_000
STEP = 400_000_000
# What fits: the guard's line, 90 % of the box (four steps; a fifth would pass it).
LINE = int(LIMIT * 0.9)
# Between two looks of the meter running steps may pass the line by what they grow meanwhile
# (more on a slow machine); never as far as the ladder's suspend line, half the headroom above.
SUSPEND_LINE = LINE + (LIMIT - LINE) // 2
# Rounds a test runs by hand: the rounds' thread, started as a job attaches, waits this long
# before its first, so it never runs one beside the test's own.
MANUAL = 3600.0


# ------------------------------------------------------------------ flags


def test_makeflags_put_the_pipe_auth_last_for_make() -> None:
    """make up to 4.3 reads the last auth and stops on a fifo one: the pipe form comes last."""
    flags = makeflags(AUTH, fifo_only=False, inherited="-j8 --jobserver-auth=3,4 -k")
    assert flags == " -j -k --jobserver-auth=fifo:/run/x/1.fifo --jobserver-auth=7,8"


def test_ninja_gets_the_fifo_auth_alone_and_no_descriptors() -> None:
    """Upstream ninja 1.13 takes only the FIFO form, and hands descriptors it did not open on
    to its steps (which would then look like clients): it gets the FIFO and nothing else."""
    for argv, shell in ((["ninja", "-C", "out"], False), (["ninja -C out"], True)):
        command = prepare_command(argv, {}, AUTH, shell=shell)
        assert command.env["MAKEFLAGS"] == " -j --jobserver-auth=fifo:/run/x/1.fifo"
        assert command.env["CARGO_MAKEFLAGS"] == "-j --jobserver-auth=fifo:/run/x/1.fifo"
        assert not command.descriptors
    assert prepare_command(["make"], {}, AUTH, shell=False).descriptors


def test_ninja_is_found_behind_a_shell_and_behind_cmake_build(tmp_path: Path) -> None:
    """ninja run by shell text (``cd build && ninja``) or by ``cmake --build`` over a tree
    configured for Ninja gets the FIFO alone; ``cmake --build`` over a Makefiles tree, or a
    tree not configured, keeps both forms and its descriptors (make up to 4.3 needs them)."""
    for name, generator in (
        ("ninja", "Ninja"),
        ("multi", "Ninja Multi-Config"),
        ("make", "Unix Makefiles"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "CMakeCache.txt").write_text(
            f"# cache\nCMAKE_GENERATOR:INTERNAL={generator}\nCMAKE_MAKE_PROGRAM:FILEPATH=x\n"
        )
    cwd = str(tmp_path)

    def fifo_only(argv: list[str], shell: bool) -> bool:
        command = prepare_command(argv, {}, AUTH, shell=shell, cwd=cwd)
        assert command.descriptors == ("7,8" in command.env["MAKEFLAGS"])
        return not command.descriptors

    assert fifo_only(["cd build && /usr/bin/ninja -k 0"], True)
    assert fifo_only(["cmake", "--build", "ninja"], False)
    assert fifo_only(["cmake --build multi --target all"], True)
    assert fifo_only(["cmake", "--build", str(tmp_path / "ninja")], False)  # an absolute tree
    assert not fifo_only(["cmake", "--build", "make"], False)
    assert not fifo_only(["cmake", "--build", "nowhere"], False)
    assert not fifo_only(["cd build && make"], True)
    assert fifo_only(["cd build&&ninja"], True)
    assert fifo_only(["(cd build; env X=1 ninja -k 0)"], True)
    # ninja named, but not as a program: make up to 4.3 needs the pipe form.
    assert not fifo_only(["pip install ninja && make -C src"], True)
    assert not fifo_only(["make -C third_party/ninja"], True)
    assert not fifo_only(["make", "ninja"], False)


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["make", "-j8", "all"], ["make", "all"]),
        (["make", "-j", "4", "all"], ["make", "all"]),
        (["ninja", "-j", "3"], ["ninja"]),
        (["cargo", "build", "--jobs=2"], ["cargo", "build"]),
        (["cmake", "--build", "b", "--parallel", "6"], ["cmake", "--build", "b"]),
        (["python", "-j8"], ["python", "-j8"]),  # not a build tool: its -j is its own
    ],
)
def test_a_j_that_would_turn_the_jobserver_off_is_removed_and_said(
    argv: list[str], kept: list[str]
) -> None:
    """An explicit -j makes make, ninja and cargo run their own count: removed, with a note."""
    command = prepare_command(argv, {"CARGO_BUILD_JOBS": "9"}, AUTH, shell=False)
    assert command.argv == kept
    assert "CARGO_BUILD_JOBS" not in command.env
    assert any("CARGO_BUILD_JOBS=9" in n for n in command.notes)
    assert (argv != kept) == any("turns the jobserver off" in n for n in command.notes)


def test_shell_text_loses_its_j_only_when_it_is_one_plain_command() -> None:
    """A shell line that is one command is rewritten; a pipeline is left, and said."""
    plain = prepare_command(["make -j16 -C src"], {}, AUTH, shell=True)
    assert plain.argv == ["make -C src"]
    piped = prepare_command(["make -j16 && make install"], {}, AUTH, shell=True)
    assert piped.argv == ["make -j16 && make install"]
    assert any("left as written" in n for n in piped.notes)


# ------------------------------------------------------------------ the pool


def test_the_fifo_is_private_and_counts_idle_tokens(tmp_path: Path) -> None:
    """The FIFO is 0600 in a 0700 folder; FIONREAD counts the idle tokens; close removes it."""
    pool = TokenPool("7", directory=tmp_path / "pools")
    auth = pool.open()
    try:
        assert stat.S_IMODE(os.stat(auth.fifo_path).st_mode) == 0o600
        assert stat.S_ISFIFO(os.stat(auth.fifo_path).st_mode)
        assert stat.S_IMODE((tmp_path / "pools").stat().st_mode) == 0o700
        assert pool.mint(3) == 3
        assert pool.idle() == 3
        assert os.read(auth.read_fd, 1) == b"+"  # a client takes one through its descriptor
        assert pool.idle() == 2
        assert pool.take_back(5) == 2
        assert pool.idle() == 0
    finally:
        pool.close()
    assert not Path(auth.fifo_path).exists()


def test_an_existing_fifo_path_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """A file already at the FIFO's path is never reused: the job does not start, and says
    why (names are random: something else made it)."""

    def taken(path: str, mode: int) -> None:
        raise FileExistsError(errno.EEXIST, "File exists", path)

    with pytest.raises(JobserverError, match=r"exists already .*remove it"):
        TokenPool("job-1", directory=tmp_path / "pools", mkfifo=taken).open()


def test_pools_of_one_job_id_at_once_each_get_their_own_fifo(tmp_path: Path) -> None:
    """Two runs of batch number their lines alike, and a job resumed after a crash keeps its
    id: pools of one id at once each get a FIFO of their own."""
    first, second = (TokenPool("1", directory=tmp_path / "pools") for _ in range(2))
    try:
        assert first.open().fifo_path != second.open().fifo_path
    finally:
        first.close()
        second.close()
    assert list((tmp_path / "pools").iterdir()) == []


@pytest.mark.kernel
def test_two_batch_runs_at_once_both_run_their_line_1_with_a_jobserver(tmp_path: Path) -> None:
    """Two ``roomkeeper batch --jobserver`` runs of one user at once: both lines numbered 1
    start, each with a pool of its own, and no FIFO is left.  Each line waits until the
    other's has started (it fails after a minute), so the two surely run side by side."""
    pools = tmp_path / "tmp"
    pools.mkdir()
    runs = []
    for n in range(2):
        lines = tmp_path / f"lines{n}.txt"
        mine, theirs = tmp_path / f"started{n}", tmp_path / f"started{1 - n}"
        wait = f"until [ -e {theirs} ]; do sleep 0.05; done"
        lines.write_text(f"touch {mine} && timeout 60 sh -c '{wait}'\n")
        argv = [sys.executable, "-m", "roomkeeper", "batch", "--jobserver", "--quiet", str(lines)]
        env = batch_env(tmp_path / f"run{n}", TMPDIR=str(pools))
        runs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    done = [(run.wait(timeout=120), run.communicate()[1]) for run in runs]
    assert [code for code, _ in done] == [0, 0], done
    assert list((pools / f"roomkeeper-jobserver-{os.getuid()}").iterdir()) == []


def test_fifos_a_crashed_roomkeeper_left_are_removed_and_the_rest_kept(tmp_path: Path) -> None:
    """A FIFO whose maker's lock nobody holds is removed as the next pool is made; one a live
    process holds stays, even named for a pid that runs nowhere here (its maker runs in
    another pid namespace that shares the folder), and so do files of other shapes and a
    FIFO still being made (``.new``) until it is old: an old unlocked one goes."""
    folder = tmp_path / "pools"
    folder.mkdir(mode=0o700)
    gone = subprocess.Popen(["true"])
    gone.wait()
    crashed = f"7.{gone.pid}.0a1b2c3d.fifo"
    elsewhere = f"7.{gone.pid}.99999999.fifo"  # its maker's pid is no pid of ours
    old_new, young_new = f"9.{gone.pid}.0a1b2c3d.new", f"9.{gone.pid}.1.new"
    for name in (crashed, elsewhere, old_new, young_new):
        os.mkfifo(folder / name, 0o600)
    long_ago = time.time() - 2 * NEW_LEFT_AFTER_S
    os.utime(folder / old_new, (long_ago, long_ago))
    (folder / f"notes.{gone.pid}.x.fifo").write_text("not a FIFO")
    (folder / "other").write_text("")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time;fd=os.open(sys.argv[1],os.O_RDWR|os.O_NONBLOCK);"
            "fcntl.flock(fd,fcntl.LOCK_EX);print('held',flush=True);time.sleep(60)",
            str(folder / elsewhere),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        pool = TokenPool("8", directory=folder)
        made = Path(pool.open().fifo_path)
        left = sorted(p.name for p in folder.iterdir())
        pool.close()
    finally:
        holder.kill()
        holder.communicate()
    expected = [made.name, elsewhere, young_new, f"notes.{gone.pid}.x.fifo"]
    assert left == sorted([*expected, "other"])


def test_a_live_pool_keeps_its_fifo_through_another_pools_sweep(tmp_path: Path) -> None:
    """Two pools in one folder: the second one's sweep leaves the first one's FIFO, which its
    maker's lock holds; once the first is closed no lock is left to hold a FIFO (none is
    left at all)."""
    first = TokenPool("1", directory=tmp_path)
    path = Path(first.open().fifo_path)
    second = TokenPool("2", directory=tmp_path)
    second.open()
    assert path.exists()
    first.close()
    second.close()
    assert list(tmp_path.iterdir()) == []


def test_a_file_system_without_hard_links_still_gets_a_locked_fifo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where link(2) is refused (some FUSE file systems), the FIFO is renamed to its name
    instead, still locked by its maker: another pool's sweep leaves it, and no .new is
    left."""

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr("roomkeeper.jobserver.pool.os.link", no_links)
    first = TokenPool("1", directory=tmp_path)
    path = Path(first.open().fifo_path)
    second = TokenPool("2", directory=tmp_path)
    second.open()
    left = sorted(p.name for p in tmp_path.iterdir())
    first.close()
    second.close()
    assert path.exists() is False
    assert path.name in left
    assert not any(name.endswith(".new") for name in left), left


def test_a_fifo_that_cannot_be_removed_still_has_its_descriptor_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """close() that cannot remove the FIFO says so and still closes our descriptor, so the
    lock goes with it and the next pool's sweep removes the FIFO."""
    pool = TokenPool("1", directory=tmp_path)
    path = Path(pool.open().fifo_path)
    ours = pool._ours
    assert ours is not None

    def refused(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    with monkeypatch.context() as patch:
        patch.setattr(Path, "unlink", refused)
        with caplog.at_level(logging.WARNING, logger="roomkeeper"):
            pool.close()
    assert "cannot remove the jobserver FIFO" in caplog.text
    with pytest.raises(OSError):
        os.fstat(ours)
    after = TokenPool("2", directory=tmp_path)
    after.open()
    after.close()
    assert not path.exists(), "the next pool's sweep took the unlocked FIFO"


def test_a_full_tmp_is_said_with_the_way_out(tmp_path: Path) -> None:
    """No space for the FIFO: a clear message naming TMPDIR, and nothing left behind."""

    def full(path: str, mode: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    pool = TokenPool("2", directory=tmp_path / "pools", mkfifo=full)
    with pytest.raises(JobserverError, match=r"no space .* set TMPDIR"):
        pool.open()
    assert list((tmp_path / "pools").iterdir()) == []


def test_no_usable_temporary_directory_is_said_with_the_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every temporary directory full or read-only (tempfile finds none it can write in): a
    clear message naming TMPDIR, not a traceback from the scheduler's thread."""

    def none_usable() -> str:
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr("roomkeeper.jobserver.pool.tempfile.gettempdir", none_usable)
    with pytest.raises(JobserverError, match=r"no usable temporary directory .* set TMPDIR"):
        TokenPool("4").open()


def test_a_shared_pools_folder_is_refused(tmp_path: Path) -> None:
    """A pools folder others may open is not ours to put a FIFO in."""
    folder = tmp_path / "pools"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(JobserverError, match="only we may open"):
        TokenPool("3", directory=folder).open()


# ------------------------------------------------------------------ census and meter


def test_stat_and_statm_are_read_from_real_text() -> None:
    """Parent, state and threads after a comm with spaces; anonymous memory from statm."""
    text = "42 (a b) c) S 7 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 3 0 9 0 0"
    assert parse_stat(text) == (7, "S", 3)
    assert parse_statm("100 30 10 1 0 20 0") == 20 * os.sysconf("SC_PAGE_SIZE")


def test_the_census_counts_a_clients_children_as_its_steps(tmp_path: Path) -> None:
    """A process with the FIFO open and three children accounts for two tokens."""
    pool = TokenPool("c", directory=tmp_path / "pools")
    auth = pool.open()
    code = (
        "import subprocess,time;[subprocess.Popen(['sleep','30']) for _ in range(3)];time.sleep(30)"
    )
    client = subprocess.Popen([sys.executable, "-c", code], pass_fds=(auth.read_fd,))
    try:
        deadline = time.monotonic() + 30
        census = take_census([], auth.fifo_path)
        while time.monotonic() < deadline:
            kids = [
                int(p)
                for p in Path(f"/proc/{client.pid}/task/{client.pid}/children").read_text().split()
            ]
            census = take_census([client.pid, *kids], auth.fifo_path)
            if len(census.steps) == 3:
                break
            time.sleep(0.05)
        assert census.clients == {client.pid}
        assert len(census.steps) == 3
        assert census.may_hold == 2
    finally:
        for kid in Path(f"/proc/{client.pid}/task/{client.pid}/children").read_text().split():
            os.kill(int(kid), signal.SIGKILL)
        client.kill()
        client.wait()
        pool.close()


def _tree(root: int) -> list[int]:
    """``root`` and every process under it."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            stack += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return found


def test_a_child_with_a_client_below_it_is_not_a_step_its_clients_children_are(
    tmp_path: Path,
) -> None:
    """A recipe's shell running a recursive make: the shell (no FIFO of its own) holds a client
    that opened the FIFO by path, with two children.  The steps are those two, never the shell,
    which would count their memory twice and, paused, stop the inner client too."""
    pool = TokenPool("r", directory=tmp_path / "pools")
    auth = pool.open()
    inner = (
        f"import subprocess,time;f=open({auth.fifo_path!r},'rb',buffering=0);"
        "[subprocess.Popen(['sleep','30']) for _ in range(2)];time.sleep(30)"
    )
    spawn = "import subprocess,sys,time;subprocess.Popen([sys.executable,'-c',{!r}]);time.sleep(30)"
    outer = spawn.format(spawn.format(inner))  # the client, a wrapper, the inner client
    writer = os.open(auth.fifo_path, os.O_RDWR | os.O_NONBLOCK)  # so the inner open never blocks
    client = subprocess.Popen([sys.executable, "-c", outer], pass_fds=(auth.read_fd,))
    try:
        census = take_census([], auth.fifo_path)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            census = take_census(_tree(client.pid), auth.fifo_path)
            if len(census.clients) == 2 and len(census.steps) == 2:
                break
            time.sleep(0.05)
        (wrapper,) = [p for p in _tree(client.pid) if _parent(p) == client.pid]
        (inner_client,) = census.clients - {client.pid}
        assert _parent(inner_client) == wrapper
        assert wrapper not in census.steps
        assert {_parent(p) for p in census.steps} == {inner_client}, census
    finally:
        for pid in reversed(_tree(client.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        client.wait()
        os.close(writer)
        pool.close()


def _parent(pid: int) -> int:
    return parse_stat(Path(f"/proc/{pid}/stat").read_text())[0]


def test_bytes_written_back_that_were_never_read_are_taken_out(tmp_path: Path) -> None:
    """A client that returns more than it took: the extra bytes leave the FIFO, and it is said."""
    guard = Guard(env={"ROOMKEEPER_GUARD": "off"})
    servers = Jobservers(
        guard, JobserverSettings(round_s=MANUAL, pools_dir=tmp_path / "pools", step_default=1)
    )
    command, fds = servers.open("u", "o", ["true"], {}, shell=False)
    write_fd = os.dup(fds[1])  # a client's copy: the pool closes its own once the job starts
    servers.attach("u", lambda: ())
    try:
        os.write(write_fd, b"+++")  # never read: not one of ours
        servers.round()
        stats = servers.statistics()["u"]
        assert stats.unread == 3
        assert stats.idle == 0
        assert any("never read" in n for n in servers.notes("u"))
    finally:
        os.close(write_fd)
        servers.shutdown()
    assert command.env["MAKEFLAGS"].startswith(" -j ")


def _client(read_fd: int, take: int) -> subprocess.Popen[str]:
    """A jobserver client that takes ``take`` tokens, says so, and holds them."""
    code = (
        f"import os,sys,time\nfor _ in range({take}): os.read({read_fd}, 1)\n"
        "print('holding', flush=True)\ntime.sleep(120)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], pass_fds=(read_fd,), stdout=subprocess.PIPE, text=True
    )


def _end(client: subprocess.Popen[str]) -> None:
    """Kill and reap a client, and close its pipe."""
    client.kill()
    client.wait()
    if client.stdout is not None:
        client.stdout.close()


def _rounds_until_held(servers: Jobservers, client: subprocess.Popen[str]) -> None:
    """Run rounds (each mints a token while none is idle) until the client holds its tokens."""
    assert client.stdout is not None
    os.set_blocking(client.stdout.fileno(), False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        servers.round()
        if client.stdout.readline():
            # The client may have read its tokens and said so before this round's snapshot
            # was even taken (a fast client, a slow test): one more round sees them held.
            servers.round()
            return
        time.sleep(0.05)
    raise AssertionError("the client never got its tokens")


def test_tokens_never_returned_are_said_at_the_end_and_die_with_the_fifo(tmp_path: Path) -> None:
    """Tokens a live client keeps to the end are named when the job ends; its FIFO goes."""
    guard = Guard(env={"ROOMKEEPER_GUARD": "off"})
    settings = JobserverSettings(pools_dir=tmp_path / "pools", step_default=1, lost_after_s=600)
    servers = Jobservers(guard, settings)
    _, fds = servers.open("n", "o", ["true"], {}, shell=False)
    client = _client(fds[0], 2)
    try:
        servers.attach("n", lambda: [client.pid])
        _rounds_until_held(servers, client)
        notes = servers.close("n")
    finally:
        _end(client)
        servers.shutdown()
    assert any("2 token(s) were never returned" in n for n in notes), notes
    assert list((tmp_path / "pools").iterdir()) == []


def test_a_token_lost_with_a_dead_client_is_minted_again(tmp_path: Path) -> None:
    """A client killed with a token in hand: the token is written off, and a new one minted."""
    guard = Guard(env={"ROOMKEEPER_GUARD": "off"})
    settings = JobserverSettings(
        round_s=MANUAL, pools_dir=tmp_path / "pools", step_default=1, lost_after_s=0.3
    )
    # The holder has no step that accounts for its token, so a token it holds alive looks
    # short too: the clock moves only once it is dead, or a slow test would write it off.
    now = [0.0]
    servers = Jobservers(guard, settings, clock=lambda: now[0])
    _, fds = servers.open("l", "o", ["true"], {}, shell=False)
    holder, bystander = _client(fds[0], 1), _client(fds[0], 0)
    try:
        servers.attach("l", lambda: [holder.pid, bystander.pid])
        _rounds_until_held(servers, holder)
        held = servers.statistics()["l"]
        assert (held.tokens_out, held.lost) == (1, 0), held
        holder.kill()
        holder.wait()
        for _ in range(20):  # 2 s of the clock: past lost_after_s
            if servers.statistics()["l"].lost:
                break
            now[0] += 0.1
            servers.round()
        servers.round()
        stats = servers.statistics()["l"]
    finally:
        _end(holder)
        _end(bystander)
        servers.shutdown()
    assert (stats.lost, stats.minted, stats.idle, stats.tokens_out) == (1, 2, 1, 0)


def test_idle_tokens_are_taken_back_under_pressure_and_none_minted(tmp_path: Path) -> None:
    """Pressure: every idle token leaves the FIFO, none is minted; minting resumes after it."""
    guard = Guard(env={"ROOMKEEPER_GUARD": "off"})
    pressure = [False]
    settings = JobserverSettings(
        round_s=MANUAL, pools_dir=tmp_path / "pools", step_default=1, lost_after_s=600
    )
    servers = Jobservers(guard, settings, pressure=lambda: pressure[0])
    _, fds = servers.open("p", "o", ["true"], {}, shell=False)
    client = _client(fds[0], 0)  # holds the FIFO open and takes nothing: minted tokens wait
    try:
        servers.attach("p", lambda: [client.pid])
        deadline = time.monotonic() + 30
        while servers.statistics().get("p") is None or servers.statistics()["p"].idle == 0:
            assert time.monotonic() < deadline, "no token was ever minted"
            servers.round()
            time.sleep(0.05)
        pressure[0] = True
        servers.round()
        servers.round()
        under = servers.statistics()["p"]
        pressure[0] = False
        servers.round()
        after = servers.statistics()["p"]
    finally:
        _end(client)
        servers.shutdown()
    assert (under.reason.value, under.idle, under.taken_back) == ("pressure", 0, 1), under
    assert under.minted == 1, under
    assert (after.reason.value, after.minted, after.idle) == ("minted", 2, 1), after


def _client_with_steps(fd: int, code: str) -> subprocess.Popen[str]:
    """A jobserver client holding ``fd`` that runs ``code`` (which starts its steps), says
    it is up, and sleeps: returned once its steps are started."""
    client = subprocess.Popen(
        [sys.executable, "-c", f"{code};print('up',flush=True);time.sleep(60)"],
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    client.stdout.readline()
    return client


class _ReadingGuard(Guard):
    """A guard that admits everything and reads the memory a test sets (line 1.8 GB of 2 GB)."""

    def __init__(self) -> None:
        super().__init__(env={"ROOMKEEPER_GUARD": "off"})
        self.used = 1_000_000_000

    def memory_reading(self) -> Reading:
        return Reading(self.used, LIMIT, headroom_percent=10.0, reserve=0, full_avg10=None, at=0)


class _RoomGuard(_ReadingGuard):
    """A guard with room for 1 GB more, whatever it is asked by."""

    def admit(self, job_id: str, **terms: object) -> Decision:
        asked = int(terms.get("memory_bytes") or 0)  # type: ignore[call-overload]
        return Decision(job_id, asked <= 1_000_000_000, Reason.OK, "test")


def test_tokens_for_the_steps_that_fit_are_in_the_fifo_before_the_job_starts(
    tmp_path: Path,
) -> None:
    """ninja looks for a token at its start and then only when a step ends: the pool holds a
    token for one more step of the default size that fits before the job runs (one only: the
    jobs judged after it in the same round need room too); none with nothing to judge room
    by, or with no room (0.4 GB steps in 1 GB of room, or 1.2 GB steps)."""
    settings = JobserverSettings(pools_dir=tmp_path / "pools", step_default=400_000_000)
    large = JobserverSettings(pools_dir=tmp_path / "large", step_default=1_200_000_000)
    servers = Jobservers(_RoomGuard(), settings)
    crowded = Jobservers(_RoomGuard(), large)
    blind = Jobservers(Guard(env={"ROOMKEEPER_GUARD": "off"}), settings)

    def idle(fd: int) -> int:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0])

    try:
        primed = idle(servers.open("p", "o", ["make"], {}, shell=False)[1][0])
        none_fit = idle(crowded.open("c", "o", ["make"], {}, shell=False)[1][0])
        unprimed = idle(blind.open("q", "o", ["make"], {}, shell=False)[1][0])
    finally:
        servers.shutdown()
        crowded.shutdown()
        blind.shutdown()
    assert (primed, none_fit, unprimed) == (1, 0, 0)


def test_steps_that_could_not_all_finish_below_the_line_are_paused_and_go_on_when_they_can(
    tmp_path: Path,
) -> None:
    """Three steps bounded by a 0.5 GB largest step: with 0.3 GB of room one goes on (the
    others paused, newest first, no token minted); with 0.55 GB a second goes on; back at
    0.4 GB it waits again; a paused step that leaves the census is let go, and the job's end
    lets the paused one left go."""
    guard = _ReadingGuard()
    signals: list[tuple[int, int]] = []
    now = [0.0]
    settings = JobserverSettings(
        round_s=MANUAL, pools_dir=tmp_path / "pools", step_default=500_000_000, lost_after_s=600
    )
    servers = Jobservers(
        guard, settings, clock=lambda: now[0], kill=lambda pid, sig: signals.append((pid, sig))
    )
    _, fds = servers.open("s", "o", ["true"], {}, shell=False)
    code = "import subprocess,sys,time;[subprocess.Popen(['sleep','60']) for _ in range(3)]"
    client = _client_with_steps(fds[0], code)
    kids = [
        int(p) for p in Path(f"/proc/{client.pid}/task/{client.pid}/children").read_text().split()
    ]
    seen = [client.pid]

    def changes(since: int) -> list[tuple[int, int]]:
        """The signals sent since ``since`` that changed a step's state (a paused step is sent
        SIGSTOP again every round, in case something else let it go)."""
        state: dict[int, int] = {}
        for pid, sig in signals[:since]:
            state[pid] = sig
        out = []
        for pid, sig in signals[since:]:
            if state.get(pid, signal.SIGCONT) != sig:
                out.append((pid, sig))
            state[pid] = sig
        return out

    try:
        servers.attach("s", lambda: list(seen))
        for kid in kids:  # each step is first seen a round after the one before
            seen.append(kid)
            now[0] += 0.1
            servers.round()
        now[0] += 0.1
        servers.round()
        assert changes(0) == [], "room for all three to finish: nothing paused"
        guard.used = 1_500_000_000
        mark = len(signals)
        now[0] += 0.1
        servers.round()
        paused = changes(mark)
        servers.round()  # the round after: its token stays held back
        held = servers.statistics()["s"]
        guard.used = 1_250_000_000
        mark = len(signals)
        now[0] += 0.1
        servers.round()
        resumed = changes(mark)
        guard.used = 1_400_000_000
        mark = len(signals)
        now[0] += 0.1
        servers.round()
        again = changes(mark)
        seen.remove(kids[2])  # a paused step that is no step any more (its client ended)
        mark = len(signals)
        now[0] += 0.1
        servers.round()
        left = changes(mark)
        mark = len(signals)
        servers.close("s")
        ended = changes(mark)
    finally:
        for kid in kids:
            os.kill(kid, signal.SIGKILL)
        _end(client)
        servers.shutdown()
    assert paused == [(kids[2], signal.SIGSTOP), (kids[1], signal.SIGSTOP)]
    assert (held.reason.value, held.steps, held.paused) == ("pressure", 3, 2), held
    assert "2 step(s) paused" in held.summary
    assert resumed == [(kids[1], signal.SIGCONT)]
    assert again == [(kids[1], signal.SIGSTOP)]
    assert (kids[2], signal.SIGCONT) in left  # never left stopped (and kids[1] may fit now)
    assert sorted(left + ended) == sorted([(kids[1], signal.SIGCONT), (kids[2], signal.SIGCONT)])


def test_a_step_that_refuses_sigstop_is_not_counted_as_paused(tmp_path: Path) -> None:
    """A step we may not signal (a setuid program the job started, whose children run as
    us): the rule would pause it, the signal is refused, and it is not taken for paused
    (which would hold the job's tokens back for good), nor are its children stopped (none
    would ever be sent SIGCONT)."""
    guard = _ReadingGuard()
    now = [0.0]
    settings = JobserverSettings(
        round_s=MANUAL, pools_dir=tmp_path / "pools", step_default=500_000_000, lost_after_s=600
    )
    refused: list[tuple[int, int]] = []
    sent: list[tuple[int, int]] = []
    steps: set[int] = set()

    def kill(pid: int, sig: int) -> None:
        if pid in steps:
            refused.append((pid, sig))
            raise PermissionError(1, "Operation not permitted")
        sent.append((pid, sig))  # recorded, not sent: the test kills everything at its end

    servers = Jobservers(guard, settings, clock=lambda: now[0], kill=kill)
    _, fds = servers.open("r", "o", ["true"], {}, shell=False)
    step = "['sh','-c','sleep 60 & wait']"
    code = f"import subprocess,sys,time;[subprocess.Popen({step}) for _ in range(2)]"
    client = _client_with_steps(fds[0], code)
    deadline = time.monotonic() + 30
    while len(kids := _tree(client.pid)[1:]) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)  # each step's shell forks its child in its own time
    steps.update(
        int(p) for p in Path(f"/proc/{client.pid}/task/{client.pid}/children").read_text().split()
    )
    try:
        assert len(kids) == 4, "two steps, each with a child"
        servers.attach("r", lambda: _tree(client.pid))
        guard.used = 1_500_000_000
        for _ in range(3):
            now[0] += 0.1
            servers.round()
        stats = servers.statistics()["r"]
    finally:
        for kid in kids:
            os.kill(kid, signal.SIGKILL)
        _end(client)
        servers.shutdown()
    assert any(sig == signal.SIGSTOP for _, sig in refused), "the rule tried to pause a step"
    assert stats.paused == 0, stats
    assert not any(sig == signal.SIGCONT for _, sig in refused), "nothing to let go"
    assert sent == [], "no child of a step that refused was signalled"


def test_a_job_being_stopped_has_its_paused_steps_let_go_so_sigterm_ends_them(
    tmp_path: Path,
) -> None:
    """Real signals: two steps of 0.5 GB bound with 0.3 GB of room, so one is paused with
    SIGSTOP.  A stopped process leaves SIGTERM pending until SIGCONT; once the job is being
    stopped its paused step is let go and never paused again, and SIGTERM ends it at once."""
    guard = _ReadingGuard()
    now = [0.0]
    settings = JobserverSettings(
        round_s=MANUAL, pools_dir=tmp_path / "pools", step_default=500_000_000
    )
    servers = Jobservers(guard, settings, clock=lambda: now[0])
    _, fds = servers.open("t", "o", ["true"], {}, shell=False)
    code = "import subprocess,sys,time;[subprocess.Popen(['sleep','60']) for _ in range(2)]"
    client = _client_with_steps(fds[0], code)
    kids = _tree(client.pid)[1:]
    try:
        servers.attach("t", lambda: _tree(client.pid))
        guard.used = 1_500_000_000
        for _ in range(3):
            now[0] += 0.1
            servers.round()
        paused = _stopped(kids)
        assert len(paused) == 1, "one of the two steps is paused"
        servers.release("t")
        now[0] += 0.1
        servers.round()  # a round after the release pauses nothing again
        os.kill(paused[0], signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            state = parse_stat(Path(f"/proc/{paused[0]}/stat").read_text())[1]
            if state == "Z":
                break
            time.sleep(0.01)
        assert state == "Z", f"the paused step did not end of SIGTERM (state {state})"
    finally:
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)
        _end(client)
        servers.shutdown()


def _stopped(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids in ``pids`` stopped (state T), once some is: SIGSTOP takes effect in the
    process's own time, not at once."""
    deadline = time.monotonic() + timeout
    while True:
        found = [k for k in pids if parse_stat(Path(f"/proc/{k}/stat").read_text())[1] == "T"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def test_no_token_is_minted_while_another_job_waits_for_memory(tmp_path: Path) -> None:
    """A running build takes no more tokens while a job waits for memory to start (it would
    take the room the job waits for, a step at a time); once none waits, it does again."""
    waits = [True]
    settings = JobserverSettings(
        round_s=MANUAL, pools_dir=tmp_path / "pools", step_default=1, lost_after_s=600
    )
    guard = _HoldingGuard()
    servers = Jobservers(guard, settings, others_wait=lambda: waits[0])
    _, fds = servers.open("w", "o", ["true"], {}, shell=False)
    client = _client(fds[0], 0)  # holds the FIFO open and takes nothing: minted tokens wait
    try:
        servers.attach("w", lambda: [client.pid])
        deadline = time.monotonic() + 30
        while servers.statistics().get("w") is None or servers.statistics()["w"].reason.value == (
            "starting"
        ):
            assert time.monotonic() < deadline, "the client was never seen"
            servers.round()
            time.sleep(0.05)
        for _ in range(3):
            servers.round()
        waiting = servers.statistics()["w"]
        waits[0] = False
        servers.round()
        after = servers.statistics()["w"]
    finally:
        _end(client)
        servers.shutdown()
    assert (waiting.reason.value, waiting.minted) == ("no_room", 0), waiting
    assert "another job waits for memory" in waiting.summary
    assert (after.reason.value, after.minted) == ("minted", 1), after
    # The new token is held for at once: a job judged after this one in the same round finds
    # its room taken.
    assert guard.holds["w/jobserver"] == after.claim_bytes + after.step_bytes


class _HoldingGuard(Guard):
    """A guard that admits everything and remembers what it was last told to hold, by key."""

    def __init__(self) -> None:
        super().__init__(env={"ROOMKEEPER_GUARD": "off"})
        self.holds: dict[str, int] = {}

    def hold(self, job_id: str, memory_bytes: int, *, age_s: float = 0.0) -> None:
        self.holds[job_id] = memory_bytes
        super().hold(job_id, memory_bytes, age_s=age_s)


# ------------------------------------------------------------------ real builds


def _run_in_box(tmp_path: Path, lines: list[str]) -> tuple[str, int]:
    """Run the lines in a 2 GB memory group: (stderr, OOM kills); fails unless all exit 0."""
    with memory_box(LIMIT) as box:
        done = _batch_in(box, tmp_path, lines)
        # The group's own counter: the machine's also counts other people's tests' kills.
        kills = box.oom_kills()
    assert done.returncode == 0, (done.stderr[-3000:], _logs(tmp_path))
    return done.stderr, kills


def _batch_in(box: object, tmp_path: Path, lines: list[str]) -> subprocess.CompletedProcess[str]:
    commands = tmp_path / "lines.txt"
    commands.write_text("".join(f"{line}\n" for line in lines))
    argv = [sys.executable, "-m", "roomkeeper", "batch", "--jobserver", str(commands)]
    argv += ["--logs", str(tmp_path / "logs"), "--quiet", "--max-running", "2"]
    return subprocess.run(
        box.argv(argv),  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
        env={**batch_env(tmp_path), **box.env()},  # type: ignore[attr-defined]
        timeout=600,
        check=False,
    )


def _logs(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*.log")))


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_make_runs_as_many_steps_as_fit_and_none_is_killed(tmp_path: Path) -> None:
    """GNU make (pipe style) with no -j: 8 steps of 400 MB in 2 GB, never more at once than fit."""
    trace = tmp_path / "trace"
    folder = makefile(tmp_path / "build", trace, 8, STEP)
    with sampling_steps(str(trace)) as seen:
        err, kills = _run_in_box(tmp_path, [f"make -j8 -C {folder}"])
    steps = read_trace(trace)
    assert kills == 0, err
    assert len(steps.ends) == 8, (err, _logs(tmp_path))
    assert seen.most_bytes <= SUSPEND_LINE, (seen, err)
    assert seen.most_running >= 2, (seen, err)
    assert "removed '-j8'" in _logs(tmp_path)
    assert re.search(r"most \d steps at once, step [\d.]+ [MG]B \((learned|running)\)", err), err


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_ninja_from_the_wheel_is_metered_through_the_fifo(tmp_path: Path) -> None:
    """ninja 1.13 (FIFO style) with no -j: 8 steps of 400 MB in 2 GB, never more than fit."""
    trace = tmp_path / "trace"
    folder = ninja_file(tmp_path / "build", trace, 8, STEP)
    with sampling_steps(str(trace)) as seen:
        err, kills = _run_in_box(tmp_path, [f"{wheel_ninja()} -C {folder}"])
    steps = read_trace(trace)
    assert kills == 0, err
    assert len(steps.ends) == 8, (err, _logs(tmp_path))
    assert seen.most_bytes <= SUSPEND_LINE, (seen, err)
    assert seen.most_running >= 2, (seen, err)
    # The meter saw ninja's steps as steps (ninja hands on descriptors it did not open: given
    # the pipe's, every step would look like a client, and none like a step).
    assert re.search(r"most [2-9] steps at once, step [\d.]+ [MG]B \(learned\)", err), err


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_cargo_builds_a_workspace_with_steps_as_memory_allows(tmp_path: Path) -> None:
    """cargo, offline, a workspace of 5 crates whose build scripts grow to 400 MB each."""
    cargo = shutil.which("cargo")
    assert cargo is not None, "no cargo on PATH: the README's test command installs it"
    trace = tmp_path / "trace"
    folder = cargo_workspace(tmp_path / "ws", trace, 5, STEP)
    target = tmp_path / "target"
    line = f"{cargo} build --offline -j 4 --manifest-path {folder}/Cargo.toml --target-dir {target}"
    with sampling_steps(str(target)) as seen:
        err, kills = _run_in_box(tmp_path, [line])
    steps = read_trace(trace)
    assert kills == 0, err
    assert len(steps.ends) == 5, (err, _logs(tmp_path))
    assert seen.most_bytes <= SUSPEND_LINE, (seen, err)
    assert seen.most_running >= 2, (seen, err)
    assert "failed to connect to jobserver" not in _logs(tmp_path)


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_a_step_killed_with_its_token_in_hand_gets_it_minted_again(tmp_path: Path) -> None:
    """A recursive step takes a token and is SIGKILLed: the token is minted again, all finish."""
    trace = tmp_path / "trace"
    # The other steps hold 3 s: the build outlasts the second a shortfall must last before
    # the token counts as lost (with tokens minted before the start, short steps could all
    # be done by then).
    folder = makefile(tmp_path / "build", trace, 5, 300_000_000, hold_s=3.0)
    holder = f"-+{step_command(trace, 'h', 300_000_000, 1.0, 30)}".replace(
        "build_step.py", "build_step.py --hold-token", 1
    )
    text = (folder / "Makefile").read_text().replace("all: s1", "all: h s1", 1)
    (folder / "Makefile").write_text(f"{text}h:\n\t{holder}\n")
    with memory_box(LIMIT) as box:
        done = _batch_killing_holder(box, tmp_path, [f"make -C {folder}"], trace)
        kills = box.oom_kills()  # the group's own: the machine's counts others' kills too
    logs = _logs(tmp_path)
    assert done.returncode == 0, (done.stderr[-3000:], logs)
    assert kills == 0
    steps = read_trace(trace)
    assert all(f"s{i}" in steps.ends for i in range(1, 6)), logs
    assert "1 token(s) lost with a client that ended holding them" in logs, logs


def _batch_killing_holder(
    box: object, tmp_path: Path, lines: list[str], trace: Path
) -> subprocess.CompletedProcess[str]:
    """Run the batch; once the holder notes its pids, SIGKILL it and its two steps."""
    commands = tmp_path / "lines.txt"
    commands.write_text("".join(f"{line}\n" for line in lines))
    argv = [sys.executable, "-m", "roomkeeper", "batch", "--jobserver", str(commands)]
    argv += ["--logs", str(tmp_path / "logs"), "--quiet"]
    proc = subprocess.Popen(
        box.argv(argv),  # type: ignore[attr-defined]
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**batch_env(tmp_path), **box.env()},  # type: ignore[attr-defined]
    )
    try:
        deadline = time.monotonic() + 120
        while not read_trace(trace).holders and time.monotonic() < deadline:
            time.sleep(0.1)
        holders = read_trace(trace).holders
        assert holders, "the holding step never took its token"
        for pid in reversed(holders[0]):  # its steps, then the holder: none returns the token
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _small_then_large(folder: Path, trace: Path, *, large_hold_s: float) -> Path:
    """A Makefile of six 100 MB steps, then four of 600 MB (after the sixth) that hold
    ``large_hold_s``: the large ones start together, more than fit in 2 GB once grown."""
    folder.mkdir()
    sizes = {f"s{i}": 100_000_000 for i in range(1, 7)}
    sizes |= {f"b{i}": 600_000_000 for i in range(1, 5)}
    hold = {name: large_hold_s if name.startswith("b") else 1.0 for name in sizes}
    rules = "".join(
        f"{name}:{' s6' if name.startswith('b') else ''}\n"
        f"\t@{step_command(trace, name, size, 1.0, hold[name])}\n"
        for name, size in sizes.items()
    )
    (folder / "Makefile").write_text(
        f".PHONY: all {' '.join(sizes)}\nall: {' '.join(sizes)}\n{rules}"
    )
    return folder


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_steps_larger_than_those_learned_are_paused_with_sigstop_not_killed(
    tmp_path: Path,
) -> None:
    """Six small steps (100 MB) teach make's job a small step, then four of 600 MB start
    together in 2 GB: more than fit once grown, so the jobserver pauses some with SIGSTOP
    (really stopped) and lets them go on as others end; none is killed."""
    trace = tmp_path / "trace"
    folder = _small_then_large(tmp_path / "build", trace, large_hold_s=1.0)
    with sampling_steps(str(trace)) as seen:
        err, kills = _run_in_box(tmp_path, [f"make -C {folder}"])
    steps = read_trace(trace)
    assert kills == 0, err
    assert len(steps.ends) == 10, (err, _logs(tmp_path))
    assert steps.most_at_once("b") >= 3, (steps, err)  # started together
    assert seen.most_bytes <= SUSPEND_LINE, (seen, err)
    assert re.search(r"step \d+ paused", err), err
    assert re.search(r"step \d+ goes on", err), err


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_a_build_stopped_while_steps_are_paused_ends_them_with_sigterm(tmp_path: Path) -> None:
    """The build of the test above, interrupted (Ctrl-C) once a step is paused: the stop's
    SIGTERM reaches every step it finds running or paused, each ends of it (its handler runs
    only once let go on), none waits for the SIGKILL after the grace."""
    trace = tmp_path / "trace"
    folder = _small_then_large(tmp_path / "build", trace, large_hold_s=30.0)
    commands = tmp_path / "lines.txt"
    commands.write_text(f"make -C {folder}\n")
    argv = [sys.executable, "-m", "roomkeeper", "batch", "--jobserver", str(commands)]
    argv += ["--logs", str(tmp_path / "logs"), "--quiet"]
    with memory_box(LIMIT) as box:
        batch = subprocess.Popen(
            box.argv(argv),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**batch_env(tmp_path), **box.env()},
        )
        try:
            paused = _wait_for_a_paused_step(str(trace), batch, timeout_s=120)
            batch.send_signal(signal.SIGINT)
            _, err = batch.communicate(timeout=120)
        finally:
            if batch.poll() is None:
                batch.kill()
                batch.communicate()
        kills = box.oom_kills()
    steps = read_trace(trace)
    assert paused, (err, _logs(tmp_path))
    assert kills == 0, err
    unfinished = set(steps.starts) - set(steps.ends)
    assert unfinished, "the interrupt came while steps ran"
    assert set(steps.terms) == unfinished, (steps, err)


def _wait_for_a_paused_step(marker: str, batch: subprocess.Popen[str], timeout_s: float) -> bool:
    """Wait until a step (a process whose command line holds ``marker``) is stopped, and has
    stayed stopped a moment (the meter's own pause, not a passing look); whether one was."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and batch.poll() is None:
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if marker in " ".join(process.cmdline()) and (
                    process.status() == psutil.STATUS_STOPPED
                ):
                    time.sleep(0.3)
                    if process.status() == psutil.STATUS_STOPPED:
                        return True
        time.sleep(0.05)
    return False


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_two_builds_side_by_side_both_progress(tmp_path: Path) -> None:
    """Two make builds in one 2 GB group share the tokens: each runs steps while the other does."""
    trace = tmp_path / "trace"
    a = makefile(tmp_path / "a", trace, 4, 300_000_000, prefix="a")
    b = makefile(tmp_path / "b", trace, 4, 300_000_000, prefix="b")
    with sampling_steps(str(trace)) as seen:
        err, kills = _run_in_box(tmp_path, [f"make -C {a}", f"make -C {b}"])
    steps = read_trace(trace)
    assert kills == 0, err
    assert len(steps.ends) == 8, (err, _logs(tmp_path))
    assert seen.most_bytes <= SUSPEND_LINE, (seen, err)
    a_end = max(t for n, t in steps.ends.items() if n.startswith("a"))
    b_end = max(t for n, t in steps.ends.items() if n.startswith("b"))
    # Each build started a step before the other had finished all of its own.
    assert min(t for n, t in steps.starts.items() if n.startswith("b")) < a_end, steps
    assert min(t for n, t in steps.starts.items() if n.startswith("a")) < b_end, steps
    both = [t for n, t in steps.starts.items() if n.startswith("b") and t < a_end]
    assert len(both) >= 2, steps


def _metric(text: str, name: str) -> float:
    """One unlabelled gauge's value from /metrics' text."""
    (line,) = [x for x in text.splitlines() if x.startswith(f"{name} ")]
    return float(line.split()[1])


def _watch(client: httpx.Client, job_id: str) -> tuple[list[dict[str, object]], list[str]]:
    """The job view's tokens and /metrics, read every 0.1 s until the job ends; the job last."""
    views: list[dict[str, object]] = []
    metrics: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        view = client.get(f"/v1/jobs/{job_id}").json()
        views.append(view)
        if JobState(view["state"]).final:  # a job waits for room first on a busy machine
            return views, metrics
        metrics.append(client.get("/metrics").text)
        # The shapes sent are built by hand: each must conform to the OpenAPI document's.
        JobOut.model_validate(view)
        FeedOut.model_validate(client.get("/v1/feed").json())
        time.sleep(0.1)
    raise AssertionError(f"the job never ended: {views[-1]}")


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_run_with_a_jobserver_shows_its_tokens_in_the_job_view_and_on_metrics(
    tmp_path: Path,
) -> None:
    """roomkeeper run --jobserver runs real make metered by a gateway; view and /metrics show it."""
    trace = tmp_path / "trace"
    folder = makefile(tmp_path / "build", trace, 4, 300_000_000)
    with memory_box(LIMIT) as box, sampling_steps(str(trace)) as seen:
        with gateway_in_box(box, tmp_path) as (client, log_path):
            # roomkeeper run --jobserver sends the job field "jobserver": true on POST /v1/jobs.
            env = {**os.environ, "ROOMKEEPER_HOME": str(tmp_path / "home")}
            argv = ["run", "--jobserver", "--detach", "--", "make", "-j6", "-C", str(folder)]
            submitted = roomkeeper_cli(env, *argv)
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            views, metrics = _watch(client, job_id)
            wait_until(
                lambda: _metric(client.get("/metrics").text, "roomkeeper_jobserver_jobs") == 0,
                "the jobserver's removal from /metrics",
            )
            output = client.get(f"/v1/jobs/{job_id}/output").text
        kills = box.oom_kills()
        log = log_path.read_text()
    last = views[-1]
    assert (last["state"], last["exit_code"], last["jobserver"]) == ("exited", 0, True), log[-3000:]
    assert last["tokens"] is None  # an ended job holds no tokens
    assert kills == 0, log[-3000:]
    assert len(read_trace(trace).ends) == 4, output
    assert "removed '-j6'" in output, output
    tokens = [v["tokens"] for v in views if isinstance(v["tokens"], dict)]
    assert tokens, views
    most = max(int(t["tokens_out"]) for t in tokens)  # type: ignore[call-overload]
    assert most >= 1, tokens
    assert max(int(t["minted"]) for t in tokens) >= 1  # type: ignore[call-overload]
    assert seen.most_bytes <= SUSPEND_LINE, seen
    running = [m for m in metrics if _metric(m, "roomkeeper_jobserver_jobs") == 1]
    assert running, metrics[-1:]
    assert max(_metric(m, "roomkeeper_jobserver_tokens_out") for m in running) >= 1
    assert max(_metric(m, "roomkeeper_jobserver_step_bytes_max") for m in running) > 0

"""A remote job's output on its way: the node's reader, the collection after a stop, the sweep."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from roomkeeper.cluster.output import (
    CHUNK_BYTES,
    UNCOLLECTED_AFTER_S,
    LogAppender,
    LogTail,
    collect_output,
    hold,
    let_go,
    log_path,
    make_directory,
    sweep_uncollected,
)


def test_a_growing_log_is_read_in_bounded_pieces_from_where_reading_stopped(
    tmp_path: Path,
) -> None:
    """No piece is larger than CHUNK_BYTES; what is written later is read later, once."""
    path = tmp_path / "out.log"
    tail = LogTail(str(path))
    assert tail.read() == b""  # not written yet
    path.write_bytes(b"a" * (CHUNK_BYTES + 10))
    pieces = [piece.data for piece in tail.rest()]
    assert [len(p) for p in pieces] == [CHUNK_BYTES, 10]
    with path.open("ab") as more:
        more.write(b"later\n")
    assert tail.read() == b"later\n"
    assert tail.read() == b""
    assert tail.offset == CHUNK_BYTES + 16
    tail.close()
    again = LogTail(str(path), CHUNK_BYTES + 10)
    assert [p.data for p in again.rest()] == [b"later\n"]
    again.close()


def test_a_collection_waits_for_the_runner_then_sends_the_rest_and_removes_it(
    tmp_path: Path,
) -> None:
    """What the tree writes while it is being stopped comes too: the collection waits for
    the runner to let go of the directory; it is removed afterwards."""
    directory = make_directory(str(tmp_path))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    lock = hold(directory)
    Path(log_path(directory)).write_bytes(b"sent\nkept\n")
    got: list[bytes] = []
    collecting = threading.Thread(
        target=lambda: got.extend(p.data for p in collect_output(directory, 5, 60))
    )
    collecting.start()
    time.sleep(0.3)
    assert got == []  # the runner still holds it
    with open(log_path(directory), "ab") as stopping:
        stopping.write(b"bye\n")
    let_go(lock, left=directory)
    collecting.join(30)
    assert b"".join(got) == b"kept\nbye\n"
    assert not os.path.exists(directory)


def test_a_collection_takes_only_a_jobs_output_directory(tmp_path: Path) -> None:
    """Anything but a job's output directory is refused, and left alone."""
    with pytest.raises(ValueError, match="is not a job's output directory"):
        next(collect_output(str(tmp_path), 0, 1))
    assert tmp_path.exists()


def test_the_sweep_removes_only_directories_left_long_and_unheld(tmp_path: Path) -> None:
    """A held directory (a running job, a collection) stays whatever its age; a fresh one
    stays for its collection; one left past UNCOLLECTED_AFTER_S goes."""
    held, left, fresh = (make_directory(str(tmp_path)) for _ in range(3))
    lock = hold(held)
    for directory in (left, fresh):
        let_go(hold(directory), left=directory)
    os.utime(os.path.join(left, "runner.lock"), (0, 0))
    later = time.time() + 60
    try:
        assert sweep_uncollected(str(tmp_path), now=lambda: later) == [left]
        assert os.path.exists(held) and os.path.exists(fresh) and not os.path.exists(left)
        far = later + 2 * UNCOLLECTED_AFTER_S
        assert sweep_uncollected(str(tmp_path), now=lambda: far) == [fresh]
        assert os.path.exists(held)
    finally:
        let_go(lock)


def test_the_gateways_log_is_created_0600_and_appended_to(tmp_path: Path) -> None:
    """Created 0600 whatever the umask allows, appended to (a re-run adds to it)."""
    path = tmp_path / "job.log"
    old = os.umask(0o022)
    try:
        appender = LogAppender(str(path), "j1")
        appender.open()
        appender.append(b"one\n")
        appender.append(b"two\n")
        appender.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == b"one\ntwo\n"
    again = LogAppender(str(path), "j1")
    again.append(b"three\n")
    again.close()
    assert path.read_bytes() == b"one\ntwo\nthree\n"
    assert again.received == len(b"three\n")

"""A Ray job's handle on a fake Ray: its own thread sends and follows; a poll only reads."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import roomkeeper.cluster.handle as handle_module
from roomkeeper.cluster.handle import ENDED_CODE, RayHandle
from roomkeeper.cluster.node import Begun, Finished, NodeJob
from roomkeeper.cluster.output import Output
from roomkeeper.jobs.handle import RemoteEnd

JOB = NodeJob("j1", ("true",), False, None, None, 10, 1000, None, None)


def wait_for(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "did not happen in time"
        time.sleep(0.01)


def read(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def no_collection(node_id: str, directory: str, offset: int, wait_s: float) -> Any:
    raise AssertionError("nothing was to be collected")


def handle(
    tmp_path: Path, send: Any, fake_ray: Any, begun: list[Any], collect: Any = no_collection
) -> RayHandle:
    return RayHandle(
        fake_ray,
        send,
        JOB,
        log_path=str(tmp_path / "log"),
        on_begun=lambda job_id, b: begun.append(b),
        on_closed=lambda job_id: None,
        collect=collect,
    )


def test_a_task_that_cannot_be_sent_failed_to_start_and_is_not_uncertain(tmp_path: Path) -> None:
    def send() -> Any:
        raise ConnectionError("not connected")

    h = handle(tmp_path, send, SimpleNamespace(get=lambda ref: ref), [])
    wait_for(lambda: h.poll() is not None)
    assert h.poll() == ENDED_CODE
    settled = h.settlement()
    assert settled is not None and settled.end is RemoteEnd.FAILED
    assert "could not be sent" in settled.summary


def test_a_poll_answers_while_ray_holds_the_answers(tmp_path: Path) -> None:
    """Ray blocks (a frozen node): the poll still answers at once, under no wait of Ray's."""
    release = threading.Event()
    begun: list[Any] = []
    answers = [
        Begun("node", "host", True, "ok", "room", 4242, 10),
        Output(b"out\n"),
        Finished(0, 123, "sampled", False),
    ]

    def get(ref: Any) -> Any:
        if isinstance(ref, Finished):
            release.wait()
        return ref

    h = handle(tmp_path, lambda: iter(answers), SimpleNamespace(get=get), begun)
    wait_for(lambda: begun != [])
    started = time.monotonic()
    assert h.poll() is None
    assert time.monotonic() - started < 1
    release.set()
    wait_for(lambda: h.poll() is not None)
    assert h.poll() == 0
    assert (tmp_path / "log").read_bytes() == b"out\n"
    assert h.peak().bytes == 123


def test_a_stop_before_the_send_means_it_is_never_sent(tmp_path: Path) -> None:
    sent = threading.Event()
    gate = threading.Event()

    def send() -> Any:
        sent.set()
        return iter([])

    class SlowStart(RayHandle):
        def _follow(self) -> None:
            gate.wait()
            super()._follow()

    h = SlowStart(
        SimpleNamespace(get=lambda ref: ref, cancel=lambda ref: None),
        send,
        JOB,
        log_path=str(tmp_path / "log"),
        on_begun=lambda job_id, b: None,
        on_closed=lambda job_id: None,
        collect=no_collection,
    )
    h.stop(1.0)
    gate.set()
    wait_for(lambda: h.poll() is not None)
    assert not sent.is_set()
    settled = h.settlement()
    assert settled is not None and settled.end is RemoteEnd.REFUSED


def test_a_cancel_the_node_never_carries_out_is_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen under load: a soft cancel got lost and the task ran on. After the node's stop
    grace and a margin the cancel is forced (Ray ends the worker; its lifeline, the tree)."""
    monkeypatch.setattr(handle_module, "FORCE_AFTER_S", 0.2)
    forced = threading.Event()
    calls: list[bool] = []

    def cancel(ref: Any, force: bool = False) -> None:
        calls.append(force)
        if force:
            forced.set()

    def answers() -> Any:
        yield Begun("node", "host", True, "ok", "room", 4242, 10)
        forced.wait(30)
        raise RuntimeError("WorkerCrashedError: the worker was killed")

    job = NodeJob("j2", ("true",), False, None, None, 10, 1000, None, None, stop_grace_s=0.1)
    h = RayHandle(
        SimpleNamespace(get=lambda ref: ref, cancel=cancel),
        answers,
        job,
        log_path=str(tmp_path / "log"),
        on_begun=lambda job_id, b: None,
        on_closed=lambda job_id: None,
        collect=no_collection,
    )
    wait_for(lambda: h.begun is not None)
    h.stop(0.1)
    wait_for(lambda: h.poll() is not None)
    assert calls == [False, True]
    settled = h.settlement()
    assert settled is not None and settled.end is RemoteEnd.LOST
    assert settled.summary.startswith("stopped")


def test_output_is_in_the_log_as_each_piece_arrives(tmp_path: Path) -> None:
    """Each piece is appended to the job's log (created 0600 once it begun) while it runs."""
    taken = threading.Semaphore(0)
    release = threading.Event()
    answers = [
        Begun("node", "host", True, "ok", "room", 4242, 10),
        Output(b"one\n"),
        Output(b"two\n"),
        Finished(0, None, None, False),
    ]

    def get(ref: Any) -> Any:
        if isinstance(ref, Output | Finished):
            taken.release()
            if isinstance(ref, Finished):
                release.wait()
        return ref

    old = os.umask(0o022)  # the usual umask would leave a plain open() at 0644
    h = handle(tmp_path, lambda: iter(answers), SimpleNamespace(get=get), [])
    try:
        wait_for((tmp_path / "log").exists)
        assert stat.S_IMODE((tmp_path / "log").stat().st_mode) == 0o600
        wait_for(lambda: read(tmp_path / "log") == b"one\ntwo\n")
        assert h.poll() is None  # the output shows while the job still runs
    finally:
        os.umask(old)
        release.set()
    wait_for(lambda: h.poll() is not None)
    assert h.poll() == 0
    assert (tmp_path / "log").read_bytes() == b"one\ntwo\n"


def test_a_stopped_jobs_rest_is_collected_from_where_its_stream_ended(tmp_path: Path) -> None:
    """Ray drops a cancelled task's answers: the rest is fetched from its node, from the
    offset reached, and is in the log before the job is settled as stopped."""
    cancelled = threading.Event()
    asked: list[tuple[str, str, int]] = []

    def answers() -> Any:
        yield Begun("node-1", "host", True, "ok", "room", 4242, 10, output_dir="roomkeeper-node-x")
        yield Output(b"before\n")
        cancelled.wait(30)
        raise RuntimeError("TaskCancelledError")

    def collect(node_id: str, directory: str, offset: int, wait_s: float) -> Any:
        asked.append((node_id, directory, offset))
        assert wait_s > JOB.stop_grace_s
        return iter([Output(b"during the stop\n")])

    fake = SimpleNamespace(
        get=lambda ref: ref,
        cancel=lambda ref, force=False: cancelled.set(),
        wait=lambda refs, timeout: (refs, []),
    )
    h = handle(tmp_path, answers, fake, [], collect)
    wait_for(lambda: read(tmp_path / "log") == b"before\n")
    h.stop(1.0)
    wait_for(lambda: h.poll() is not None)
    assert asked == [("node-1", "roomkeeper-node-x", len(b"before\n"))]
    assert (tmp_path / "log").read_bytes() == b"before\nduring the stop\n"
    settled = h.settlement()
    assert settled is not None and settled.end is RemoteEnd.LOST
    assert settled.summary.startswith("stopped")

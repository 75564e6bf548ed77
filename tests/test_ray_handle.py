"""A Ray job's handle on a fake Ray: its own thread sends and follows; a poll only reads."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import roomkeeper.cluster.handle as handle_module
from roomkeeper.cluster.handle import ENDED_CODE, RayHandle
from roomkeeper.cluster.node import Begun, Finished, NodeJob
from roomkeeper.jobs.handle import RemoteEnd

JOB = NodeJob("j1", ("true",), False, None, None, 10, 1000, None, None)


def wait_for(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "did not happen in time"
        time.sleep(0.01)


def handle(tmp_path: Path, send: Any, fake_ray: Any, begun: list[Any]) -> RayHandle:
    return RayHandle(
        fake_ray,
        send,
        JOB,
        log_path=str(tmp_path / "log"),
        on_begun=lambda job_id, b: begun.append(b),
        on_closed=lambda job_id: None,
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
        Finished(0, b"out\n", 123, "sampled", False),
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
    )
    wait_for(lambda: h.begun is not None)
    h.stop(0.1)
    wait_for(lambda: h.poll() is not None)
    assert calls == [False, True]
    settled = h.settlement()
    assert settled is not None and settled.end is RemoteEnd.LOST
    assert settled.summary.startswith("stopped")

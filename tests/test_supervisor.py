"""The supervisor: staged recovery, the restart budget, recovery mode, stop, adoption, sd_notify.

Unit tests drive the watchdog and the budget on fake clocks; the kernel tests
run the real ``roomkeeper serve`` with short timings, first over a fake
gateway (a small ``python -c`` program that speaks the channel and does what
its plan says), then over the real ``roomkeeper gateway``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from roomkeeper.config import WatchdogSettings, read_watchdog_settings
from roomkeeper.supervisor import restarts
from roomkeeper.supervisor.child import gateway_command
from roomkeeper.supervisor.records import RECORD_NAME, find_supervisor, read_events
from roomkeeper.supervisor.restarts import Backoff, BudgetState, RestartBudget, RestartReason
from roomkeeper.supervisor.sdnotify import Notifier, socket_address
from roomkeeper.supervisor.service import Supervisor
from roomkeeper.supervisor.watchdog import Action, Stage, Watchdog
from roomkeeper.testing import FakeClock
from tests.cgroups import child_memory_cgroup
from tests.gateways import free_port, gateway_env, roomkeeper_cli, wait_until
from tests.supervisors import (
    FAST,
    Served,
    first,
    first_after,
    healthy_events,
    kill_ours,
    names,
    serve,
)

DEFAULTS = WatchdogSettings()

# ------------------------------------------------------------------ watchdog


def run_watchdog(
    dog: Watchdog, clock: FakeClock, until: float, beats: Callable[[float], bool]
) -> list[tuple[float, Action]]:
    """Step a watchdog every 0.5 s up to ``until``; heartbeat when ``beats(t)``; its actions."""
    actions = []
    while clock() < until:
        clock.advance(0.5)
        if beats(clock()):
            dog.heartbeat(clock())
        action = dog.tick(clock())
        if action is not None:
            actions.append((clock() - dog.started, action))
    return actions


def test_stages_relief_sigterm_sigkill_in_order_at_their_times() -> None:
    """Silence after the start grace: relief at HEARTBEAT, SIGTERM RELIEF later, SIGKILL SHUTDOWN
    after that (30/20/15 s), and never anything before the 120 s start grace ends."""
    clock = FakeClock(0)
    dog = Watchdog(DEFAULTS, clock())
    dog.hello(["heartbeat", "relief"], clock())
    actions = run_watchdog(dog, clock, 400, beats=lambda t: t <= 200)
    assert actions == [(230, Action.RELIEF), (250, Action.SIGTERM), (265, Action.SIGKILL)]
    assert dog.stage is Stage.KILLED and dog.escalated


def test_start_grace_covers_a_slow_first_heartbeat() -> None:
    """A gateway that is silent from the start gets relief only when the 120 s grace ends."""
    clock = FakeClock(0)
    dog = Watchdog(DEFAULTS, clock())
    dog.hello(["heartbeat"], clock())
    actions = run_watchdog(dog, clock, 200, beats=lambda t: False)
    assert actions == [(120, Action.RELIEF), (140, Action.SIGTERM), (155, Action.SIGKILL)]


def test_a_heartbeat_during_relief_ends_the_stages() -> None:
    """Responsiveness back during relief: healthy again, no SIGTERM."""
    clock = FakeClock(0)
    dog = Watchdog(DEFAULTS, clock())
    dog.hello(["heartbeat"], clock())
    actions = run_watchdog(dog, clock, 400, beats=lambda t: t <= 200 or t >= 240)
    assert actions == [(230, Action.RELIEF)]
    assert dog.stage is Stage.HEALTHY


def test_a_long_healthy_run_is_remembered_through_the_stages() -> None:
    """Ten healthy minutes, then a hang: the run still counts for the backoff's reset."""
    clock = FakeClock(0)
    dog = Watchdog(DEFAULTS, clock())
    dog.hello(["heartbeat"], clock())
    actions = run_watchdog(dog, clock, 1000, beats=lambda t: t <= 700)
    assert [a for _, a in actions] == [Action.RELIEF, Action.SIGTERM, Action.SIGKILL]
    assert dog.healthy_for(clock()) == pytest.approx(700 - 0.5)


def test_no_heartbeat_capability_is_never_killed() -> None:
    """A hello without ``heartbeat`` (an older release): crash supervision only, for a day."""
    clock = FakeClock(0)
    dog = Watchdog(DEFAULTS, clock())
    dog.hello(["relief"], clock())
    assert run_watchdog(dog, clock, 86_400, beats=lambda t: False) == []
    assert dog.stage is Stage.CRASH_ONLY and dog.due() is None


def test_no_hello_at_all_is_a_hung_start() -> None:
    """Silence through the whole start grace, not even a hello: the stages apply."""
    clock = FakeClock(0)
    dog = Watchdog(DEFAULTS, clock())
    actions = run_watchdog(dog, clock, 200, beats=lambda t: False)
    assert [a for _, a in actions] == [Action.RELIEF, Action.SIGTERM, Action.SIGKILL]


def test_a_leaving_gateway_gets_shutdown_seconds_then_sigkill() -> None:
    """After stop/restart (or our SIGTERM) the gateway has SHUTDOWN s to exit, then SIGKILL."""
    clock = FakeClock(0)
    dog = Watchdog(DEFAULTS, clock())
    dog.hello(["heartbeat"], clock())
    dog.heartbeat(clock())
    dog.leaving(clock())
    actions = run_watchdog(dog, clock, 60, beats=lambda t: True)
    assert actions == [(15, Action.SIGKILL)]
    assert not dog.escalated  # leaving on its own is not a watchdog failure


# ------------------------------------------------------------------- backoff


def test_backoff_doubles_to_60_and_starts_over_after_10_minutes_healthy() -> None:
    """1, 2, 4, ... capped at 60 s; back to 1 s once a gateway ran 10 minutes healthy."""
    backoff = Backoff()
    delays = [backoff.next_delay(1, 60, healthy_for=5) for _ in range(9)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff.next_delay(1, 60, healthy_for=599) == 60
    assert backoff.next_delay(1, 60, healthy_for=600) == 1
    assert backoff.next_delay(1, 60) == 2


# -------------------------------------------------------------------- budget


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(1_800_000_000.0)


def test_recovery_mode_after_more_than_3_failures_in_10_minutes(
    tmp_path: Path, wall: FakeClock
) -> None:
    """The fourth failure within 10 minutes latches recovery mode; time never clears it."""
    budget = RestartBudget(tmp_path / "state.json", wall=wall)
    for _ in range(3):
        assert budget.record_failure(RestartReason.CRASH, 900) == restarts.Verdict(True)
        wall.advance(60)
    assert not budget.recovery_mode
    verdict = budget.record_failure(RestartReason.UNRESPONSIVE, 900)
    assert verdict.recovery_entered and verdict.cooldown_s == 0 and budget.recovery_mode
    wall.advance(30 * 86_400)
    assert RestartBudget(tmp_path / "state.json", wall=wall).recovery_mode  # a latch, persisted
    budget.repaired()
    assert not budget.recovery_mode and budget.statistics().failures_30min == 0


def test_failures_spread_over_more_than_10_minutes_do_not_latch(
    tmp_path: Path, wall: FakeClock
) -> None:
    """Four failures, but never more than three in any 10 minutes: no recovery mode."""
    budget = RestartBudget(tmp_path / "state.json", wall=wall)
    for _ in range(4):
        budget.record_failure(RestartReason.CRASH, 900)
        wall.advance(301)
    assert not budget.recovery_mode


def test_cooldown_after_more_than_6_failures_in_30_minutes(tmp_path: Path, wall: FakeClock) -> None:
    """The seventh failure within 30 minutes starts a 900 s cooldown, even when no 10 minutes
    held more than three (no recovery mode); the cooldown outlives the supervisor."""
    budget = RestartBudget(tmp_path / "state.json", wall=wall)
    verdicts = []
    for _ in range(7):
        verdicts.append(budget.record_failure(RestartReason.CRASH, 900))
        wall.advance(240)  # 4 minutes apart: at most 3 in any 10 minutes
    assert [v.cooldown_s for v in verdicts] == [0] * 6 + [900]
    assert not budget.recovery_mode
    assert budget.cooldown_left(900) == pytest.approx(900 - 240)
    assert RestartBudget(tmp_path / "state.json", wall=wall).cooldown_left(900) > 0
    wall.advance(900)
    assert budget.cooldown_left(900) == 0
    # By now the oldest failures left the 30 minutes: the next one is just a failure.
    assert budget.record_failure(RestartReason.CRASH, 900).cooldown_s == 0


def test_a_failure_right_after_a_cooldown_starts_the_next_one(
    tmp_path: Path, wall: FakeClock
) -> None:
    """A crash loop costs one launch per cooldown: while 30 minutes still hold more than six
    failures, the failure after a cooldown starts another."""
    budget = RestartBudget(tmp_path / "state.json", wall=wall)
    for _ in range(7):
        budget.record_failure(RestartReason.CRASH, 900)
        wall.advance(10)
    wall.advance(900)
    assert budget.cooldown_left(900) == 0
    assert budget.record_failure(RestartReason.CRASH, 900).cooldown_s == 900
    assert budget.cooldown_left(900) == 900


def test_more_than_5_requested_restarts_in_2_minutes_count_as_failures(
    tmp_path: Path, wall: FakeClock
) -> None:
    """Five requests in two minutes are free; the sixth counts as a failure; later ones are free
    again once the two minutes have passed."""
    budget = RestartBudget(tmp_path / "state.json", wall=wall)
    counted = []
    for _ in range(7):
        counted.append(budget.record_request(900).counted)
        wall.advance(10)
    assert counted == [False] * 5 + [True, True]
    assert [r for _, r in budget.state.failures] == [RestartReason.RAPID_REQUESTS] * 2
    wall.advance(121)
    assert not budget.record_request(900).counted


def test_state_file_is_private_atomic_and_outlives_the_supervisor(
    tmp_path: Path, wall: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mode 0600 in a 0700 folder; temp file, fsync, rename, fsync of the folder; a new
    supervisor reads it back; a write that fails half-way leaves the old file whole."""
    path = tmp_path / "home" / "recovery" / restarts.STATE_NAME
    synced: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    budget = RestartBudget(path, wall=wall)
    budget.record_failure(RestartReason.CRASH, 900)
    assert synced == [False, True]  # the file, then its folder after the rename
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == [restarts.STATE_NAME]
    before = path.read_text()

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", broken_replace)
    budget.record_failure(RestartReason.CRASH, 900)
    assert path.read_text() == before  # old state whole, no half-written file
    assert sorted(p.name for p in path.parent.iterdir()) == [restarts.STATE_NAME]
    assert budget.statistics().failures_10min == 2  # memory still counts
    monkeypatch.undo()
    again = RestartBudget(path, wall=wall)
    assert [r for _, r in again.state.failures] == [RestartReason.CRASH]
    assert BudgetState.from_json(before) == again.state


def test_unwritable_state_keeps_the_budget_in_memory_and_says_so(
    tmp_path: Path, wall: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The recovery folder cannot be made (a file is in the way): the budget still counts,
    latches recovery mode, and reports that persistence failed."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "recovery").write_text("not a folder")
    budget = RestartBudget(home / "recovery" / restarts.STATE_NAME, wall=wall)
    with caplog.at_level(logging.ERROR, logger="roomkeeper"):
        verdicts = [budget.record_failure(RestartReason.CRASH, 900) for _ in range(4)]
    assert verdicts[-1].recovery_entered and budget.recovery_mode
    assert budget.persistence_error is not None
    assert budget.statistics().persistence_error == budget.persistence_error
    assert [r.message for r in caplog.records if "persistence failed" in r.message]
    assert len(caplog.records) == 1  # said once, not on every failure


def test_disk_full_keeps_the_budget_in_memory(
    tmp_path: Path, wall: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on write: the budget is kept in memory, the error is reported, and the next
    successful write clears the report."""
    budget = RestartBudget(tmp_path / "state.json", wall=wall)
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    budget.record_failure(RestartReason.CRASH, 900)
    assert budget.persistence_error is not None and "No space" in budget.persistence_error
    assert not (tmp_path / "state.json").exists()
    assert list(tmp_path.iterdir()) == []  # no temp file left behind
    monkeypatch.setattr(os, "write", real_write)
    budget.record_failure(RestartReason.CRASH, 900)
    assert budget.persistence_error is None
    assert len(RestartBudget(tmp_path / "state.json", wall=wall).state.failures) == 2


def test_a_damaged_state_file_starts_in_recovery_mode(tmp_path: Path, wall: FakeClock) -> None:
    """An unreadable state file may have held the latch: start latched rather than unprotected."""
    path = tmp_path / "state.json"
    path.write_text("{not json")
    assert RestartBudget(path, wall=wall).recovery_mode


def test_watchdog_variables_and_their_defaults() -> None:
    """120/30/20/15 s and a 900 s cooldown; an unusable value falls back to its default."""
    assert read_watchdog_settings({}) == WatchdogSettings(120, 30, 20, 15, 900, 1, 60)
    s = read_watchdog_settings(
        {"ROOMKEEPER_WATCHDOG_HEARTBEAT": "2.5", "ROOMKEEPER_RESTART_COOLDOWN": "soon"}
    )
    assert (s.heartbeat_s, s.cooldown_s) == (2.5, 900)


def test_the_gateway_child_is_a_named_command() -> None:
    """The child runs ``python -m roomkeeper gateway --port P`` (or ``--socket S``)."""
    assert gateway_command(8765, None) == [
        sys.executable,
        "-m",
        "roomkeeper",
        "gateway",
        "--port",
        "8765",
    ]
    assert gateway_command(1, "/run/rk.sock")[-2:] == ["--socket", "/run/rk.sock"]


def test_event_log_reader_waits_for_a_whole_last_line(tmp_path: Path) -> None:
    """A reader racing the supervisor's append sees only whole lines, never half a JSON object."""
    log_path = tmp_path / "recovery" / "supervisor.log"
    log_path.parent.mkdir()
    log_path.write_text('{"event": "started"}\n{"at": 1796004135.6808136, ')
    assert [e["event"] for e in read_events(tmp_path)] == ["started"]
    with log_path.open("a") as f:
        f.write('"event": "healthy"}\n')
    assert [e["event"] for e in read_events(tmp_path)] == ["started", "healthy"]


def test_notify_socket_addresses() -> None:
    """A path, an abstract ``@name``, and nothing else."""
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@rk") == b"\0rk"
    assert socket_address("vsock:2:1") is None
    assert socket_address(None) is None
    assert Notifier({"WATCHDOG_USEC": "2000000"}).watchdog_s == 2.0
    assert Notifier({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}).watchdog_s is None


def test_notifier_sends_datagrams_to_a_path_socket(tmp_path: Path) -> None:
    """READY=1 goes once (later calls only update STATUS); no socket costs nothing."""
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        notifier = Notifier({"NOTIFY_SOCKET": address})
        notifier.ready("gateway healthy")
        notifier.ready("gateway healthy")
        notifier.watchdog()
        got = [listener.recv(4096).decode() for _ in range(3)]
    assert got == ["READY=1\nSTATUS=gateway healthy", "STATUS=gateway healthy", "WATCHDOG=1"]
    assert not Notifier({}).notify("READY=1")


def test_a_notify_socket_nobody_reads_never_blocks_the_sender(tmp_path: Path) -> None:
    """A full queue drops the message (False) at once, in place of waiting for a reader;
    a READY=1 dropped goes again with the next WATCHDOG=1."""
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        notifier = Notifier({"NOTIFY_SOCKET": address})
        sent: list[bool] = []

        def fill() -> None:  # until the queue is full (net.unix.max_dgram_qlen: 10 to 512)
            while len(sent) < 10_000 and (not sent or sent[-1]):
                sent.append(notifier.notify("x"))

        worker = threading.Thread(target=fill, daemon=True)
        worker.start()
        worker.join(timeout=10)  # a blocking send would wait here for ever
        assert not worker.is_alive(), "the sender blocked on a full queue"
        assert sent[0] is True and sent[-1] is False, len(sent)
        notifier.ready("gateway healthy")
        assert not notifier.ready_sent
        listener.settimeout(0)
        with contextlib.suppress(BlockingIOError):
            while True:
                listener.recv(4096)
        notifier.watchdog()
        assert notifier.ready_sent
        assert listener.recv(4096) == b"READY=1\nSTATUS=gateway healthy"
        assert listener.recv(4096) == b"WATCHDOG=1"
        notifier.watchdog()
        assert listener.recv(4096) == b"WATCHDOG=1"  # READY=1 went once


# ------------------------------------------------------- real supervisor: helpers


def wait_healthy(url: str, timeout: float = 20) -> str:
    """Wait for GET /health; its boot id."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.get(f"{url}/health", timeout=1)
            if answer.status_code == 200:
                return str(answer.json()["boot_id"])
        assert time.monotonic() < deadline, "the gateway never answered /health"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """The process is dead (a zombie waiting for its reaper counts as dead)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return True


def heard(tmp: Path, n: int) -> list[dict[str, Any]]:
    """What the fake gateway of launch ``n`` (from 0) heard from the supervisor."""
    with contextlib.suppress(FileNotFoundError):
        return [json.loads(x) for x in (tmp / f"heard-{n}").read_text().splitlines()]
    return []


# ------------------------------------------------------- real supervisor, fake gateway


@pytest.mark.kernel
def test_fake_gateway_goes_through_relief_sigterm_sigkill_and_restarts(tmp_path: Path) -> None:
    """Heartbeats stop and SIGTERM is ignored: relief, SIGTERM, SIGKILL, each at its time, then a
    restart whose hello carries a new boot id and whose heartbeats are healthy."""
    # Stages of 6 and 2 s, so that a busy machine's lateness (1.5 s allowed) cannot pass
    # for a stage run twice, or for the start grace and the heartbeat added together.
    with serve(
        tmp_path,
        fake_plan="hang,healthy",
        ROOMKEEPER_WATCHDOG_START="6",
        ROOMKEEPER_WATCHDOG_HEARTBEAT="2",
        ROOMKEEPER_WATCHDOG_RELIEF="2",
        ROOMKEEPER_WATCHDOG_SHUTDOWN="2",
    ) as s:
        events = s.wait_for(
            lambda ev: "healthy" in names(ev) and names(ev).count("hello") == 2, timeout=60
        )
        order = [
            e["event"]
            for e in events
            if e["event"] in ("launched", "healthy", "relief", "sigterm", "sigkill", "exited")
        ]
        assert order[:7] == [
            "launched",
            "healthy",
            "relief",
            "sigterm",
            "sigkill",
            "exited",
            "launched",
        ]
        t = {name: first(events, name, gen=1)["mono"] for name in ("relief", "sigterm", "sigkill")}
        launched = first(events, "launched", gen=1)["mono"]
        # Never early; late by at most a loaded machine's scheduling delay.  The fake
        # gateway's last beat comes about a second into its start (a few when busy), so
        # the start grace decides: its last beat's 2 s end sooner.
        assert 5.9 <= t["relief"] - launched <= 6 + 1.5  # START grace
        assert 1.95 <= t["sigterm"] - t["relief"] <= 2 + 1.5  # RELIEF
        assert 1.95 <= t["sigkill"] - t["sigterm"] <= 2 + 1.5  # SHUTDOWN
        assert first(events, "exited", gen=1)["exit_code"] == -signal.SIGKILL
        hellos = [e["boot_id"] for e in events if e["event"] == "hello"]
        assert hellos[0] != hellos[1]
        assert first(events, "launched", gen=2)["reason"] == "unresponsive"
        assert [m["type"] for m in heard(tmp_path, 0)] == ["relief"]  # asked before the kill
        assert gone(first(events, "launched", gen=1)["pid"])
        assert gone(int((tmp_path / "tree-0").read_text()))  # the whole tree, not just the leader
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=10) == 0
    events = s.events()
    assert names(events)[-1] == "supervisor_stopped" and names(events).count("launched") == 2


@pytest.mark.kernel
def test_gateway_without_heartbeats_is_never_killed(tmp_path: Path) -> None:
    """A hello without ``heartbeat``: crash supervision only, left alone well past every stage."""
    with serve(tmp_path, fake_plan="nobeat", ROOMKEEPER_WATCHDOG_START="1") as s:
        s.wait_event("crash_only")
        time.sleep(4)  # START 1 + HEARTBEAT 1 + RELIEF 1 + SHUTDOWN 1 have all passed
        events = s.events()
        assert not {"relief", "sigterm", "sigkill", "exited"} & set(names(events))
        assert s.proc.poll() is None and len(s.seen) == 1


@pytest.mark.kernel
def test_a_newer_protocol_is_supervised_by_its_capabilities(tmp_path: Path) -> None:
    """A gateway upgraded in place says protocol 2 with heartbeats: a warning, then full
    supervision by what it declares (healthy, never killed while it beats)."""
    with serve(tmp_path, fake_plan="healthy", FAKE_PROTOCOL="2") as s:
        events = s.wait_event("healthy")
        differs = first(events, "protocol_differs")
        assert (differs["gateway"], differs["supervisor"]) == (2, 1)
        time.sleep(3)
        assert not {"relief", "sigterm", "crash_only"} & set(names(s.events()))
    assert "channel protocol 2" in s.log.read_text()


@pytest.mark.kernel
def test_requested_restarts_are_fast_until_a_rapid_sequence(tmp_path: Path) -> None:
    """Five requested restarts are immediate; the sixth within 2 minutes counts as a failure and
    waits its backoff."""
    with serve(tmp_path, fake_plan="restart,restart,restart,restart,restart,restart,healthy") as s:
        events = s.wait_event("healthy", count=7)
        scheduled = [
            (e["reason"], e["delay_s"]) for e in events if e["event"] == "restart_scheduled"
        ]
        assert scheduled == [("requested", 0)] * 5 + [("rapid_requests", 0.2)]
        state = json.loads((s.home / "recovery" / restarts.STATE_NAME).read_text())
        assert [f["reason"] for f in state["failures"]] == ["rapid_requests"]


@pytest.mark.kernel
def test_recovery_mode_is_sent_and_a_repair_clears_it(tmp_path: Path) -> None:
    """Four crashes latch recovery mode; the next gateway is told so at its hello; its
    ``repaired`` clears the history and the latch, and recovery mode off is sent back."""
    with serve(tmp_path, fake_plan="crash,crash,crash,crash,repair") as s:
        events = s.wait_event("repaired")
        assert names(events).count("recovery_mode_on") == 1
        delays = [e["delay_s"] for e in events if e["event"] == "restart_scheduled"]
        assert delays == [0.2, 0.4, 0.8, 1.6]  # doubling from serve()'s 0.2 s backoff
        launches = [e["mono"] for e in events if e["event"] == "launched"]
        exits = [e["mono"] for e in events if e["event"] == "exited"]
        for delay, ended, started in zip(delays, exits, launches[1:], strict=True):
            assert started - ended >= delay
        # "repaired" is recorded once "off" is sent; the gateway writes what it heard in its
        # own time.
        wait_until(lambda: len(heard(tmp_path, 4)) >= 2, "the gateway heard two messages", 30)
        assert [(m["type"], m.get("on")) for m in heard(tmp_path, 4)] == [
            ("recovery_mode", True),
            ("recovery_mode", False),
        ]
        state = json.loads((s.home / "recovery" / restarts.STATE_NAME).read_text())
        assert state["failures"] == [] and state["recovery_mode"] is False


@pytest.mark.kernel
def test_sigterm_to_the_supervisor_stops_a_stubborn_gateway_and_never_restarts(
    tmp_path: Path,
) -> None:
    """SIGTERM to the supervisor: SIGTERM to the gateway, SHUTDOWN s of grace, then SIGKILL of
    its whole tree; exit 0 and no restart."""
    # 2 s of grace: 1.5 s of a busy machine's lateness cannot pass for twice the grace.
    with serve(tmp_path, fake_plan="stubborn", ROOMKEEPER_WATCHDOG_SHUTDOWN="2") as s:
        s.wait_event("healthy")
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=10) == 0
        events = s.events()
        assert names(events)[-4:] == ["stopping", "sigkill", "exited", "supervisor_stopped"]
        waited = first(events, "sigkill")["mono"] - first(events, "stopping")["mono"]
        assert 1.95 <= waited <= 2 + 1.5  # ROOMKEEPER_WATCHDOG_SHUTDOWN, never early
        assert names(events).count("launched") == 1
        assert gone(first(events, "launched")["pid"])
        assert gone(int((tmp_path / "tree-0").read_text()))


@pytest.mark.kernel
def test_a_stop_from_the_gateway_ends_the_supervisor(tmp_path: Path) -> None:
    """``stop`` then exit: the supervisor exits 0 and launches nothing more."""
    with serve(tmp_path, fake_plan="stop") as s:
        assert s.proc.wait(timeout=15) == 0
        events = s.events()
        assert names(events).count("launched") == 1
        assert "stop_requested" in names(events) and "restart_scheduled" not in names(events)


@pytest.mark.kernel
def test_sd_notify_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    """On a real datagram socket (abstract name): READY=1 once the gateway is healthy,
    WATCHDOG=1 with heartbeats (and while the supervisor keeps the start grace), STOPPING=1 on
    SIGTERM; the gateway never sees NOTIFY_SOCKET."""
    name = f"rktest-{uuid.uuid4().hex[:8]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(b"\0" + name.encode())
        listener.settimeout(10)
        with serve(
            tmp_path, fake_plan="healthy", NOTIFY_SOCKET=f"@{name}", WATCHDOG_USEC="4000000"
        ) as s:
            got: list[str] = []
            deadline = time.monotonic() + 10
            while "READY=1" not in got or got[got.index("READY=1") :].count("WATCHDOG=1") < 3:
                assert time.monotonic() < deadline, got
                got += listener.recv(4096).decode().splitlines()
            assert got[got.index("READY=1") + 1] == "STATUS=gateway healthy"
            healthy = first(s.events(), "healthy")["mono"]
            assert first(s.events(), "launched")["mono"] < healthy
            gateway_pid = first(s.events(), "launched")["pid"]
            assert "NOTIFY_SOCKET" not in psutil.Process(gateway_pid).environ()
            s.proc.send_signal(signal.SIGTERM)
            assert s.proc.wait(timeout=10) == 0
            rest: list[str] = []
            with contextlib.suppress(TimeoutError):
                listener.settimeout(0.5)
                while True:
                    rest += listener.recv(4096).decode().splitlines()
            assert "STOPPING=1" in rest and got.count("READY=1") == 1


# ------------------------------------------------------- real supervisor, real gateway


def submit_sleep(s: Served) -> psutil.Process:
    """Submit ``sleep 60`` as a managed job; its process once it runs (our descendant)."""
    token = (s.home / "token").read_text().strip()
    job = httpx.post(
        f"http://127.0.0.1:{s.port}/v1/jobs",
        json={"argv": ["sleep", "60"]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert job.status_code == 201, job.text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for p in s.gateway_tree():
            with contextlib.suppress(psutil.Error):
                if p.cmdline() == ["sleep", "60"]:
                    return p
        time.sleep(0.05)
    raise AssertionError("the job never ran")


def healthy_gateway(s: Served) -> tuple[int, psutil.Process]:
    """The newest generation that reported healthy, and its gateway process.

    A CI machine running other test files beside this one once stalled the first gateway
    past its heartbeat, so the supervisor had already replaced it when the test looked;
    whichever generation is healthy now is the one to freeze."""
    deadline = time.monotonic() + 20
    while True:
        events = s.wait_healthy_gen()
        gen = max(e["gen"] for e in healthy_events(events))
        with contextlib.suppress(psutil.NoSuchProcess):
            return gen, psutil.Process(first(events, "launched", gen=gen)["pid"])
        assert time.monotonic() < deadline, "no healthy gateway stayed up"
        time.sleep(0.1)


@pytest.mark.kernel
def test_sigstopped_gateway_is_replaced_with_a_new_boot_id(tmp_path: Path) -> None:
    """A real gateway frozen by SIGSTOP: relief, SIGTERM, SIGKILL in order with their times,
    then a healthy gateway answering /health with a new boot id."""
    # A 2 s heartbeat: with 1 s, a busy CI machine (other test files beside this
    # one) could delay a self-probe enough for a relief before the SIGSTOP.
    with serve(tmp_path, ROOMKEEPER_WATCHDOG_HEARTBEAT="2") as s:
        url = f"http://127.0.0.1:{s.port}"
        before = wait_healthy(url)
        gen, gateway = healthy_gateway(s)
        gateway.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        events = s.wait_healthy_gen(gen + 1)
        # A relief before the SIGSTOP (a late first heartbeat, then "recovered") is not
        # the one this test times.
        t = {
            n: first_after(events, n, stopped_at, gen=gen)["mono"]
            for n in ("relief", "sigterm", "sigkill")
        }
        # HEARTBEAT (2 s) after the last beat, which came a third of it plus a self-probe's
        # round trip before the SIGSTOP at most (a probe on a busy machine may take a few
        # tenths: a second allowed); the supervisor checks at least every MAX_WAIT_S (1 s)
        # on a busy 2-core machine, so allow that much lateness, never earliness.
        assert 2 - 1 <= t["relief"] - stopped_at <= 2 + 1 + 1
        assert 0.95 <= t["sigterm"] - t["relief"] <= 1 + 1.5  # RELIEF
        assert 0.95 <= t["sigkill"] - t["sigterm"] <= 1 + 1.5  # SHUTDOWN
        after = wait_healthy(url)
        assert after != before and healthy_events(events, gen + 1)[0]["boot_id"] == after
        assert not gateway.is_running()


@pytest.mark.kernel
def test_roomkeeper_stop_is_a_clean_exit_with_no_restart_and_no_survivors(tmp_path: Path) -> None:
    """``roomkeeper stop``: the supervisor exits 0, nothing is relaunched, nothing is left."""
    with serve(tmp_path, ROOMKEEPER_WATCHDOG_HEARTBEAT="10") as s:  # not a watchdog test
        url = f"http://127.0.0.1:{s.port}"
        wait_healthy(url)
        job = submit_sleep(s)
        tree = [psutil.Process(s.proc.pid), *s.gateway_tree()]
        done = roomkeeper_cli(s.env, "stop")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["roomkeeper: stopping", "roomkeeper: stopped"]
        assert s.proc.poll() == 0  # `stop` returned only once the supervisor had exited
        _, alive = psutil.wait_procs([*tree, job], timeout=5)
        assert alive == []
        events = s.events()
        assert names(events).count("launched") == 1 and "restart_scheduled" not in names(events)


@pytest.mark.kernel
def test_roomkeeper_stop_reaches_a_supervisor_waiting_to_restart(tmp_path: Path) -> None:
    """The gateway crashed and the supervisor waits out a long backoff: ``roomkeeper stop`` has
    no gateway to ask, so it stops the supervisor itself, and nothing is launched again."""
    with serve(tmp_path, fake_plan="crash", backoff_s=60, backoff_max_s=60) as s:
        s.wait_event("restart_scheduled")
        record = json.loads((s.home / RECORD_NAME).read_text())
        assert record["pid"] == s.proc.pid
        done = roomkeeper_cli(s.env, "stop")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            f"roomkeeper: no gateway answered; stopping its supervisor (pid {s.proc.pid})",
            "roomkeeper: stopped",
        ]
        assert s.proc.poll() == 0
        assert names(s.events()).count("launched") == 1
        assert not (s.home / RECORD_NAME).exists()


def test_roomkeeper_stop_with_nothing_running_says_so(tmp_path: Path) -> None:
    """No gateway and no supervisor: exit 1 with a one-line reason, no traceback."""
    done = roomkeeper_cli(gateway_env(tmp_path), "stop")
    assert done.returncode == 1
    assert "no roomkeeper gateway is running" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_supervisor_record_with_another_start_time_is_not_ours(tmp_path: Path) -> None:
    """A recorded pid that now names another process (pid reuse) is never signalled."""
    me = psutil.Process()
    (tmp_path / RECORD_NAME).write_text(json.dumps({"pid": me.pid, "started": 1.0}))
    assert find_supervisor(tmp_path) is None
    started = round(me.create_time(), 2)
    (tmp_path / RECORD_NAME).write_text(json.dumps({"pid": me.pid, "started": started}))
    found = find_supervisor(tmp_path)
    assert found is not None and found.pid == me.pid
    (tmp_path / RECORD_NAME).write_text("{half")
    assert find_supervisor(tmp_path) is None


@pytest.mark.kernel
def test_sigkill_of_the_supervisor_takes_the_gateway_and_its_trees(tmp_path: Path) -> None:
    """The supervisor SIGKILLed: the gateway and every managed tree are gone within the
    gateway's shutdown deadline (2/3 of WATCHDOG_SHUTDOWN) plus 2 s."""
    # HEARTBEAT 10: not a watchdog test, so a slow probe on a loaded machine must not act.
    with serve(tmp_path, ROOMKEEPER_WATCHDOG_SHUTDOWN="3", ROOMKEEPER_WATCHDOG_HEARTBEAT="10") as s:
        url = f"http://127.0.0.1:{s.port}"
        wait_healthy(url)
        job = submit_sleep(s)
        tree = s.gateway_tree()
        assert job in tree
        s.proc.kill()
        s.proc.wait()
        killed = time.monotonic()
        _, alive = psutil.wait_procs(tree, timeout=2 + 2)
        assert alive == [], [p.pid for p in alive]
        assert time.monotonic() - killed < 2 + 2


@pytest.mark.kernel
def test_a_gateway_that_crashes_at_start_every_time_meets_the_budget(tmp_path: Path) -> None:
    """A workspace that contains the token makes every start fail: backoff between launches,
    recovery mode after the fourth failure, a cooldown after the seventh, and not one launch
    more than the budget allows."""
    home = tmp_path / "home"
    with serve(
        tmp_path,
        ROOMKEEPER_WORKSPACE=str(home),
        backoff_s=0.1,
        backoff_max_s=1,
        ROOMKEEPER_RESTART_COOLDOWN="4",
    ) as s:
        events = s.wait_event("cooldown", count=1, timeout=40)
        time.sleep(2)  # inside the cooldown: nothing may launch
        events = s.events()
        cooldown_at = first(events, "cooldown")["mono"]
        launched = [e for e in events if e["event"] == "launched"]
        assert len(launched) == 7 and all(e["mono"] < cooldown_at for e in launched)
        scheduled = [e for e in events if e["event"] == "restart_scheduled"]
        assert [e["delay_s"] for e in scheduled] == [0.1, 0.2, 0.4, 0.8, 1, 1, 4]
        exits = [e["mono"] for e in events if e["event"] == "exited"]
        for e, ended, started in zip(scheduled, exits, launched[1:], strict=False):
            assert started["mono"] - ended >= e["delay_s"]
        latched = first(events, "recovery_mode_on")["mono"]
        assert exits[3] <= latched < launched[4]["mono"]  # at the fourth failure
        assert [e["exit_code"] for e in events if e["event"] == "exited"] == [2] * 7
        state = json.loads((home / "recovery" / restarts.STATE_NAME).read_text())
        assert state["recovery_mode"] is True and len(state["failures"]) == 7
        events = s.wait_event("cooldown", count=2, timeout=15)  # one launch, then cooldown again
        assert names(events).count("launched") == 8


HOG = """
import time
block = bytearray(150 << 20)
while True:
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(0.05)
"""


def limit_hits(version: int, group: Path) -> int:
    """How often the group met its memory limit (v1 ``failcnt``, v2 ``max`` events)."""
    if version == 1:
        return int((group / "memory.failcnt").read_text())
    lines = dict(line.split() for line in (group / "memory.events").read_text().splitlines())
    return int(lines["max"])


@pytest.mark.kernel
def test_busy_gateway_under_memory_pressure_is_never_killed(tmp_path: Path) -> None:
    """Supervisor, gateway and jobs in a 400 MB memory cgroup filled with page cache and a
    hog: the gateway keeps answering, so no stage ever starts and its boot id stays."""
    with child_memory_cgroup(400 * 1024 * 1024) as (version, group):
        procs = group / "cgroup.procs"
        prefix = ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]
        with serve(
            tmp_path,
            prefix=prefix,
            ROOMKEEPER_GUARD="off",
            # A fifth of the default 30 s, yet three missed 2 s probes in a row: a busy CI
            # machine (other test files beside this one) can delay a single probe.
            ROOMKEEPER_WATCHDOG_HEARTBEAT="6",
        ) as s:
            url = f"http://127.0.0.1:{s.port}"
            boot = wait_healthy(url)
            token = (s.home / "token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            big = tmp_path / "ws"
            big.mkdir(exist_ok=True)
            fill = f"while :; do dd if=/dev/zero of={big}/f bs=1M count=600 2>/dev/null; done"
            hog = HOG
            for argv in (["sh", "-c", fill], [sys.executable, "-c", hog]):
                answer = httpx.post(
                    f"{url}/v1/jobs", json={"argv": argv}, headers=headers, timeout=10
                )
                assert answer.status_code == 201, answer.text
            deadline = time.monotonic() + 14  # more than two heartbeat windows
            while time.monotonic() < deadline:
                httpx.get(f"{url}/v1/status", headers=headers, timeout=10)
            assert wait_healthy(url) == boot
            events = s.events()
            assert not {"relief", "sigterm", "sigkill", "exited"} & set(names(events))
            assert limit_hits(version, group) > 0  # the kernel reclaimed at the limit


@pytest.mark.kernel
def test_bare_gateway_with_supervise_adopts_supervision_once(tmp_path: Path) -> None:
    """``roomkeeper gateway`` with ROOMKEEPER_SUPERVISE=1 and no channel becomes the supervisor
    of one gateway child (which has a channel and does not adopt again)."""
    port = free_port()
    env = gateway_env(tmp_path, **FAST, ROOMKEEPER_SUPERVISE="1", ROOMKEEPER_RESTART_REASON="crash")
    with (tmp_path / "adopt.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "roomkeeper", "gateway", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    tree: list[psutil.Process] = []
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
        home = Path(env["ROOMKEEPER_HOME"])
        events = read_events(home)
        assert names(events)[:2] == ["adopted", "supervisor_started"]
        assert first(events, "launched")["reason"] == "crash"  # the inherited reason is kept
        tree = list(psutil.Process(proc.pid).children(recursive=True))
        gateways = [p for p in tree if "gateway" in p.cmdline()]
        assert [p.ppid() for p in gateways] == [proc.pid]  # one gateway, our child: not twice
        assert names(read_events(home)).count("adopted") == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_ours(tree)


# The real gateway, with one extra route that blocks its event loop: alive, and useless.
BLOCKING_GATEWAY = """
import sys, time
import roomkeeper.api.serve as gateway_main
from roomkeeper.api import app as api

def create_app(gateway, **kw):
    app = api.create_app(gateway, **kw)

    @app.post("/test-block-the-loop")
    async def block() -> None:
        time.sleep(3600)

    return app

gateway_main.create_app = create_app
gateway_main.run_gateway(int(sys.argv[1]), None)
"""


@pytest.mark.kernel
def test_real_gateway_with_a_blocked_event_loop_is_replaced(tmp_path: Path) -> None:
    """A real gateway whose event loop blocks: relief, SIGTERM, SIGKILL, then a new boot id."""
    port = free_port()
    command = [sys.executable, "-c", BLOCKING_GATEWAY, str(port)]
    # A 2 s heartbeat, and whichever generation is healthy when it blocks: a busy machine
    # may stall a start or a probe past a shorter one, and the first gateway be replaced.
    with serve(tmp_path, gateway=command, ROOMKEEPER_WATCHDOG_HEARTBEAT="2") as s:
        url = f"http://127.0.0.1:{port}"
        gen, _ = healthy_gateway(s)
        before = wait_healthy(url)

        def block() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"{url}/test-block-the-loop", timeout=30)

        blocked_at = time.monotonic()
        threading.Thread(target=block, daemon=True).start()
        events = s.wait_healthy_gen(gen + 1, timeout=60)
        t = {
            n: first_after(events, n, blocked_at, gen=gen)["mono"]
            for n in ("relief", "sigterm", "sigkill")
        }
        assert t["relief"] < t["sigterm"] < t["sigkill"]
        after = wait_healthy(url)
        assert after != before


def test_as_pid_1_every_zombie_is_reaped_though_a_child_vanished_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a container's init the supervisor reaps the zombies handed to it; a child that is
    gone between the listing and its status does not leave the ones after it for later."""
    supervisor = Supervisor(["true"], env={"ROOMKEEPER_HOME": str(tmp_path)})
    zombie = subprocess.Popen(["true"])  # never waited for: a zombie once it exits
    wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, "a zombie")

    class Vanished:
        pid = 2**22 + 1

        def status(self) -> str:
            raise psutil.NoSuchProcess(self.pid)

    real = psutil.Process(zombie.pid)
    monkeypatch.setattr(psutil.Process, "children", lambda self: [Vanished(), real])
    monkeypatch.setattr(os, "getpid", lambda: 1)
    supervisor._reap_orphans()
    monkeypatch.undo()
    assert not psutil.pid_exists(zombie.pid), "the zombie after the vanished child was left"
    zombie.returncode = 0  # reaped above: Popen must not wait for it again

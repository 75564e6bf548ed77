"""The freezer's waits and undo on a fake clock: what does not stop is named, and let go on."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from roomkeeper.errors import SuspendError
from roomkeeper.kernel import freezer
from roomkeeper.kernel.freezer import FreezeMethod, FreezerGroup
from roomkeeper.kernel.job_cgroups import JobCgroup
from roomkeeper.processes.suspension import Suspension
from roomkeeper.testing import FakeClock


def v2_group(tmp_path: Path, frozen: int) -> Path:
    """A v2 job group whose cgroup.events says ``frozen``, whatever is written."""
    group = tmp_path / "job"
    group.mkdir()
    (group / "cgroup.freeze").write_text("0\n")
    (group / "cgroup.events").write_text(f"populated 1\nfrozen {frozen}\n")
    return group


def proc_with(tmp_path: Path, states: dict[int, str]) -> str:
    """A /proc with one stat file per pid, in the given states."""
    proc = tmp_path / "proc"
    for pid, state in states.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (job) {state} 1 {pid} {pid} 0\n")
    return str(proc)


def test_v2_freeze_returns_once_the_kernel_says_frozen(tmp_path: Path) -> None:
    """cgroup.freeze gets 1, and frozen 1 in cgroup.events ends the wait at once."""
    group = v2_group(tmp_path, frozen=1)
    clock = FakeClock()
    freezer.set_v2_frozen(str(group), True, clock=clock, sleep=clock.advance)
    assert (group / "cgroup.freeze").read_text() == "1"
    assert clock() == FakeClock()()


def test_v2_freeze_that_never_completes_times_out_naming_the_group(tmp_path: Path) -> None:
    """frozen 0 for the whole timeout is a TimeoutError that names cgroup.events."""
    group = v2_group(tmp_path, frozen=0)
    clock = FakeClock()
    with pytest.raises(TimeoutError, match=r"cgroup.events says frozen 0 after 5 s"):
        freezer.set_v2_frozen(str(group), True, timeout=5.0, clock=clock, sleep=clock.advance)
    assert clock() - FakeClock()() >= 5.0


def test_v1_freezer_keeps_asking_while_freezing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FREEZING is written FROZEN again until the timeout, then named in the error."""
    group = tmp_path / "freezer-job"
    group.mkdir()
    state = group / "freezer.state"
    state.write_text("THAWED\n")
    # The kernel's answer while a task resists freezing, whatever was written.
    monkeypatch.setattr(freezer, "read_file", lambda path: b"FREEZING\n")
    clock = FakeClock()
    writes = []

    def sleep(seconds: float) -> None:
        writes.append(state.read_text())
        state.write_text("")
        clock.advance(seconds)

    with pytest.raises(TimeoutError, match=r"freezer\.state still reads FREEZING after 1 s"):
        FreezerGroup(str(group)).set_frozen(True, timeout=1.0, clock=clock, sleep=sleep)
    assert len(writes) > 3 and set(writes) == {"FROZEN"}


def test_signals_stop_names_a_member_that_would_not_stop(tmp_path: Path) -> None:
    """A member still running at the deadline (say in D state) is named; SIGSTOP went to it."""
    proc = proc_with(tmp_path, {101: "T", 102: "D"})
    sent: list[tuple[int, int]] = []
    clock = FakeClock()
    with pytest.raises(TimeoutError, match=r"pids \[102\] still ran after 2 s"):
        freezer.stop_processes(
            lambda: {101, 102},
            send=lambda pid, sig: sent.append((pid, sig)),
            proc_root=proc,
            timeout=2.0,
            clock=clock,
            sleep=clock.advance,
        )
    assert {pid for pid, _ in sent} == {102}  # the stopped one is left alone
    assert {sig for _, sig in sent} == {signal.SIGSTOP}


def test_a_failed_suspension_lets_the_tree_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """SuspendError says what did not stop, and every member signalled gets SIGCONT back."""
    sent: list[tuple[int, int]] = []

    def send(pid: int, sig: int) -> None:
        sent.append((pid, sig))

    def stops_one_of_two(
        members: Callable[[], set[int]],
        *,
        first: set[int],
        send: Callable[[int, int], None],
        timeout: float,
    ) -> None:
        for pid in first | members():
            send(pid, signal.SIGSTOP)
        raise TimeoutError("pids [8] still ran after 0.1 s")

    monkeypatch.setattr(freezer, "stop_processes", stops_one_of_two)
    suspension = Suspension("j", cgroup=None, freezer_group=None, members=lambda: {7, 8}, send=send)
    with pytest.raises(SuspendError, match=r"'j' could not be suspended: SIGSTOP: pids \[8\]"):
        suspension.suspend(0.1)
    assert suspension.method is None
    assert sorted(p for p, sig in sent if sig == signal.SIGCONT) == [7, 8]


def test_the_way_is_the_kernels_first(tmp_path: Path) -> None:
    """A v2 group freezes; else a v1 freezer group; else signals."""
    group = v2_group(tmp_path, frozen=0)

    def way(cgroup: JobCgroup | None, freezer_group: FreezerGroup | None) -> FreezeMethod:
        return Suspension(
            "j", cgroup=cgroup, freezer_group=freezer_group, members=set, send=lambda p, s: None
        ).way()

    assert way(JobCgroup(str(group), 2), None) is FreezeMethod.CGROUP_V2
    assert way(JobCgroup(str(group), 1), FreezerGroup("x")) is FreezeMethod.FREEZER_V1
    assert way(None, None) is FreezeMethod.SIGNALS


def test_the_members_known_already_are_stopped_before_the_first_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listing walks /proc, slow on a busy machine: the members known already get SIGSTOP
    before it runs, so a growing tree is frozen at once."""
    events: list[tuple[str, int]] = []
    stopped: set[int] = set()

    def send(pid: int, sig: int) -> None:
        events.append(("signal", pid))
        if sig == signal.SIGSTOP:
            stopped.add(pid)

    def members() -> set[int]:
        events.append(("listing", 0))
        return {41, 42}

    monkeypatch.setattr(freezer, "_state", lambda pid, root: "T" if pid in stopped else "R")
    freezer.stop_processes(members, first={41}, send=send, timeout=1.0)
    assert events[:2] == [("signal", 41), ("listing", 0)]
    assert stopped == {41, 42}


def test_a_halt_stops_the_known_members_and_a_failed_suspension_lets_them_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """halt() SIGSTOPs the members known without a walk; the suspension that follows walks for
    the rest, and when it fails every process halted gets SIGCONT back."""
    sent: list[tuple[int, int]] = []
    views = [{7, 8}, {8}]  # the sampler's view of the tree changes between the two calls

    suspension = Suspension(
        "j",
        cgroup=None,
        freezer_group=None,
        members=lambda: {9},
        send=lambda pid, sig: sent.append((pid, sig)),
        known=lambda: views.pop(0) if len(views) > 1 else views[0],
    )
    suspension.halt()
    assert sorted(sent) == [(7, signal.SIGSTOP), (8, signal.SIGSTOP)]

    def never_stops(members: Callable[[], set[int]], **_: object) -> None:
        raise TimeoutError("pids [9] still ran after 0.1 s")

    monkeypatch.setattr(freezer, "stop_processes", never_stops)
    with pytest.raises(SuspendError):
        suspension.suspend(0.1)
    assert sorted(p for p, sig in sent if sig == signal.SIGCONT) == [7, 8, 9]

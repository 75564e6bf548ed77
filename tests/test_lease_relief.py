"""Leases the relief ladder may relieve: chosen newest first at the stop rung, through their
relieve hook only, settled by the memory that comes back (fake clock, fake leases)."""

from __future__ import annotations

import concurrent.futures
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from roomkeeper.config import PressureSettings
from roomkeeper.gateway.leases import DurableLeases
from roomkeeper.gateway.relieve import LeaseRelief
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import RELIEVE_ASKED, Leases, LeaseState, LeaseView
from roomkeeper.guard.lines import Reading
from roomkeeper.journal.database import Journal
from roomkeeper.loopback.hook_calls import HookRunner
from roomkeeper.loopback.hooks import ReleaseHook
from roomkeeper.relief.cooldown import Cooldown, CooldownCause
from roomkeeper.relief.ladder import LadderState, Live, Plan, Step, decide
from roomkeeper.relief.monitor import RELIEF_WAIT_S, MonitorPace, PressureMonitor
from roomkeeper.testing import FakeClock
from tests.fakes import FakeLeases, FakeTarget, fixture_guard

MB = 10**6
GB = 10**9
SETTINGS = PressureSettings(full_percent=20.0, full_seconds=5.0, cooldown_s=60.0, retries=3)
LINE, STOP = 1800 * MB, 1950 * MB  # a 2 GB container at 10 % headroom
HOOK = ReleaseHook("POST", "http://127.0.0.1:9/relieve/x")


def reading(used: int, at: float = 0.0) -> Reading:
    return Reading(
        used=used, limit=2 * GB, headroom_percent=10.0, reserve=0, full_avg10=None, at=at
    )


def lease(name: str, started: float, share: int = 200 * MB) -> Live:
    return Live(
        job_id=name, started=started, footprint=0, estimate=share, suspendable=False, lease=True
    )


def job(name: str, started: float, **over: object) -> Live:
    fields: dict[str, object] = {"footprint": 300 * MB, "estimate": 100 * MB, **over}
    return Live(job_id=name, started=started, **fields)  # type: ignore[arg-type]


def plan_for(used: int, live: Sequence[Live], leases: Sequence[Live]) -> Plan:
    plan, _ = decide(LadderState(), reading(used), live, SETTINGS, cooling=False, leases=leases)
    return plan


def steps(plan: Plan) -> list[tuple[Step, str | None]]:
    return [(a.step, a.job_id) for a in plan.actions if a.step is not Step.HOLD]


def test_the_stop_rung_relieves_the_newest_lease_when_it_is_newer_than_every_tree() -> None:
    """Trees and relievable leases are one line by age, newest first, a lease ranking as
    restartable work: before a tree that cannot run again, after a newer one that can."""
    plan = plan_for(STOP + 1, [job("a", 1), job("b", 2)], [lease("x", 3), lease("y", 4)])
    assert steps(plan) == [(Step.RELIEVE, "y")]
    plan = plan_for(STOP + 1, [job("a", 1), job("b", 5, restartable=True)], [lease("x", 3)])
    assert steps(plan) == [(Step.STOP, "b")]
    plan = plan_for(STOP + 1, [job("a", 1), job("b", 5)], [lease("x", 3)])
    assert steps(plan) == [(Step.RELIEVE, "x")]


def test_leases_alone_are_relieved_newest_first_and_the_oldest_last() -> None:
    """With no tree of ours, the newest lease is relieved; the oldest only when it is alone."""
    assert steps(plan_for(STOP + 1, [], [lease("x", 1), lease("y", 2)])) == [(Step.RELIEVE, "y")]
    assert steps(plan_for(STOP + 1, [], [lease("x", 1)])) == [(Step.RELIEVE, "x")]


def test_below_the_stop_rung_no_lease_is_relieved() -> None:
    """Past the line or the suspend line a lease is never touched: relief ends a turn."""
    for used in (LINE + 1, 1900 * MB + 1):
        assert steps(plan_for(used, [], [lease("x", 1), lease("y", 2)])) == []


def test_nothing_to_choose_is_flagged_and_a_lease_without_relieve_is_never_chosen() -> None:
    """Past the stop line with no tree and no relievable lease, the plan says so."""
    plan = plan_for(STOP + 1, [], [])
    assert steps(plan) == [] and plan.unrelieved
    assert not plan_for(STOP + 1, [job("a", 1)], []).unrelieved


def monitor(
    clock: FakeClock, feed: list[Reading], target: FakeTarget, leases: FakeLeases
) -> tuple[PressureMonitor, Cooldown]:
    readings = iter(feed)
    cooldown = Cooldown(clock)
    m = PressureMonitor(
        target=target,
        read=lambda: next(readings),
        cooldown=cooldown,
        settings=lambda: SETTINGS,
        pace=MonitorPace(clock=clock),
    )
    m.watch_leases(leases)
    return m, cooldown


def test_a_relief_counts_once_its_hook_answered_and_used_fell_by_about_its_share() -> None:
    """The hook is called once; the relief is counted when it answered and used fell by half
    its share, and until then no second victim is chosen."""
    clock = FakeClock(0.0)
    leases = FakeLeases([lease("x", 1), lease("y", 2)])
    back = reading(STOP + 1 - 100 * MB)
    feed = [reading(STOP + 1), reading(STOP + 2), back, back]
    m, cooldown = monitor(clock, feed, FakeTarget([]), leases)
    m.tick()
    assert leases.asked == ["y"] and cooldown.holding(CooldownCause.PRESSURE)
    clock.advance(0.1)
    m.tick()  # still past the stop line, its memory not back yet: nobody else is asked
    assert leases.asked == ["y"] and leases.settled == []
    clock.advance(0.1)
    m.tick()  # used fell, but the hook has not answered: not taken for its doing yet
    assert leases.settled == []
    leases.hooks["y"].set_result("ok 200")
    m.tick()
    assert [(s[0], s[1]) for s in leases.settled] == [("y", True)]
    assert leases.settled[0][2].startswith("relieved: used fell 0.10 GB")
    assert leases.settled[0][3] == 100 * MB
    stats = m.statistics()
    assert (stats.relieves, stats.relieved) == (1, 1)


def test_a_relief_that_gives_nothing_back_lets_the_ladder_go_on() -> None:
    """Used does not fall within the wait: not relieved, and the next victim is chosen."""
    clock = FakeClock(0.0)
    leases = FakeLeases([lease("x", 1), lease("y", 2), lease("z", 3)])
    m, _ = monitor(clock, [reading(STOP + 1, at=t) for t in range(4)], FakeTarget([]), leases)
    m.tick()
    leases.hooks["z"].set_result("ok 200")
    clock.advance(RELIEF_WAIT_S - 0.1)
    m.tick()
    assert leases.asked == ["z"] and leases.settled == []
    clock.advance(0.2)
    m.tick()
    assert leases.settled[0][:2] == ("z", False)
    assert leases.settled[0][2].startswith("not relieved: used fell 0.00 of its 0.20 GB")
    assert leases.asked == ["z", "y"]


def test_a_failed_relieve_hook_is_not_waited_for() -> None:
    """The hook answered an error: not relieved at once, even if used fell meanwhile for
    another reason, and the ladder goes on."""
    clock = FakeClock(0.0)
    leases = FakeLeases([lease("x", 1), lease("y", 2)])
    feed = [reading(STOP + 1), reading(STOP + 1 - 150 * MB)]
    m, _ = monitor(clock, feed, FakeTarget([]), leases)
    m.tick()
    leases.hooks["y"].set_result("failed: HTTP 500")
    m.tick()
    assert leases.settled[0][:3] == ("y", False, "not relieved: its relieve hook failed: HTTP 500")


def test_a_lease_reserving_nothing_needs_a_real_fall_and_an_answer() -> None:
    """A share of 0 is never relieved by a reading that fell by nothing; a hook given up is
    cancelled if it has not been called yet."""
    clock = FakeClock(0.0)
    leases = FakeLeases([lease("x", 1), lease("y", 2, share=0)])
    m, _ = monitor(clock, [reading(STOP + 1, at=t) for t in range(3)], FakeTarget([]), leases)
    m.tick()
    leases.hooks["y"].set_result("ok 200")
    m.tick()
    assert leases.settled == []
    clock.advance(RELIEF_WAIT_S + 0.1)
    m.tick()
    assert leases.settled[0][:2] == ("y", False)
    unanswered = FakeLeases([lease("z", 1), lease("w", 2)])
    other = FakeClock(0.0)
    m, _ = monitor(other, [reading(STOP + 1)] * 2, FakeTarget([]), unanswered)
    m.tick()
    other.advance(RELIEF_WAIT_S + 0.1)
    m.tick()
    assert unanswered.hooks["w"].cancelled()


def test_the_log_says_when_leases_without_relieve_leave_nothing_to_act_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Past the stop line with only unhooked leases: one warning names them, now and then."""
    clock = FakeClock(0.0)
    leases = FakeLeases([], unhooked=(3, 600 * MB))
    feed = [reading(STOP + 1, at=t) for t in (0.0, 1.0, 11.0)]
    m, _ = monitor(clock, feed, FakeTarget([]), leases)
    with caplog.at_level(logging.WARNING, logger="roomkeeper"):
        for _ in feed:
            m.tick()
    said = [r.getMessage() for r in caplog.records if "nothing to act on" in r.getMessage()]
    assert len(said) == 2, said
    assert "3 granted lease(s) reserving 0.60 GB carry no relieve hook" in said[0]


def test_a_lease_is_asked_once_and_ends_relieved_unless_it_gave_nothing_back(
    tmp_path: Path,
) -> None:
    """ask_relief marks a granted lease with a relieve hook once; its end is then ``relieved``,
    or ``released`` when the relief was found to give nothing back."""
    guard, _ = fixture_guard(tmp_path, used=1 * GB)
    leases = Leases(guard)
    leases.grant("a", LeaseTerms(owner="o", memory_bytes=100 * MB, relieve=HOOK))
    leases.grant("b", LeaseTerms(owner="o", memory_bytes=100 * MB, relieve=HOOK))
    leases.grant("c", LeaseTerms(owner="o", memory_bytes=100 * MB))
    assert [v.id for v in leases.relievable()] == ["a", "b"]
    assert leases.unrelievable() == (1, 100 * MB)
    assert leases.ask_relief("a") is not None and leases.ask_relief("a") is None
    assert leases.ask_relief("c") is None  # no relieve hook: never
    assert [v.id for v in leases.relievable()] == ["b"]
    ended = leases.end("a")
    assert ended is not None and ended.state is LeaseState.RELIEVED
    leases.ask_relief("b")
    leases.settle_relief("b", "not relieved: used fell 0.00 of its 0.10 GB within 5 s")
    ended = leases.end("b")
    assert ended is not None and ended.state is LeaseState.RELEASED
    leases.end("c")
    assert leases.counts() == {"granted": 0, "relieved": 1, "released": 2}
    assert leases.ended_without_hook() == 3


def test_an_older_leases_table_gains_relieve_and_a_restart_never_asks_twice(
    tmp_path: Path,
) -> None:
    """A journal from before relieve hooks is migrated on open; after a restart a granted
    lease keeps its relieve hook, and one asked before the restart and never judged is
    found not relieved (its hook is never called again)."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE leases (id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL,"
            " memory_bytes INTEGER NOT NULL, disk_bytes INTEGER NOT NULL, ttl_s REAL NOT NULL,"
            " granted_at REAL NOT NULL, expires_at REAL NOT NULL, ended_at REAL, release TEXT,"
            " hook_outcome TEXT)"
        )
    journal = Journal(path, synchronous="OFF")
    guard, _ = fixture_guard(tmp_path / "g", used=1 * GB)
    hooks = HookRunner(run=lambda hook: "ok 200")
    try:
        now = time.time()
        terms = LeaseTerms(owner="o", memory_bytes=100 * MB, ttl_s=60.0, relieve=HOOK)
        view = LeaseView("a", terms, LeaseState.GRANTED, now, now + 60)
        journal.record_lease(view).result()
        journal.record_lease(replace(view, id="b")).result()
        journal.record_relieve("b", RELIEVE_ASKED).result()
        durable = DurableLeases(
            leases=Leases(guard),
            guard=guard,
            journal=journal,
            refusals=deque(),
            closing=lambda: False,
            watch=lambda write: None,
            hooks=hooks,
        )
        durable.restore()
        rows = {r.id: r for r in journal.live_leases(now=now)}
    finally:
        hooks.close()
        journal.close()
    assert [v.id for v in durable.leases.relievable()] == ["a"]
    b = durable.leases.get("b")
    assert b.terms.relieve == HOOK and b.relieve_outcome is not None
    assert b.relieve_outcome.startswith("not relieved: the gateway restarted")
    assert rows["b"].relieve_outcome == b.relieve_outcome
    assert rows["a"].terms.relieve == HOOK and rows["a"].relieve_outcome is None


def test_lease_relief_saves_the_ask_before_the_call_and_ends_a_relieved_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ask is in the journal before the hook is called (keyed relieve-<id>); a settled
    relief is saved, goes in the history, and a relieved lease still granted is ended."""
    journal = Journal(tmp_path / "j.db", synchronous="OFF")
    guard, _ = fixture_guard(tmp_path / "g", used=1 * GB)
    leases = Leases(guard)
    durable = DurableLeases(
        leases=leases,
        guard=guard,
        journal=journal,
        refusals=deque(),
        closing=lambda: False,
        watch=lambda write: None,
        hooks=HookRunner(run=lambda hook: "ok 200"),
    )
    seen: list[tuple[str | None, str | None]] = []
    ended: list[str] = []

    def call(hook: ReleaseHook) -> str:
        rows = journal.live_leases(now=time.time())
        seen.append((hook.key, rows[0].relieve_outcome))
        return "ok 200"

    writes: list[concurrent.futures.Future[None]] = []
    relief = LeaseRelief(leases=durable, journal=journal, watch=writes.append, end=ended.append)
    monkeypatch.setattr("roomkeeper.gateway.relieve.run_hook", call)
    try:
        granted, _ = leases.grant("a", LeaseTerms(owner="o", memory_bytes=100 * MB, relieve=HOOK))
        assert granted is not None
        journal.record_lease(granted).result()
        future = relief.relieve("a", "test")
        assert future is not None and future.result(timeout=10) == "ok 200"
        assert seen == [("relieve-a", RELIEVE_ASKED)]
        assert relief.relieve("a", "again") is None  # once ever
        relief.settle("a", True, "relieved: used fell 0.10 GB in 12 ms", 100 * MB)
        assert ended == ["a"]
        for write in writes:
            write.result(timeout=10)
        outcome = journal.live_leases(now=time.time())[0].relieve_outcome
        assert outcome is not None and outcome.startswith("relieved")
        codes = [e.code.value for e in journal.history(limit=10)]
    finally:
        relief.close()
        journal.close()
    assert codes == ["lease_relieved"]


def test_a_leases_own_change_never_puts_its_relief_back_to_nothing(tmp_path: Path) -> None:
    """The ask is its own column: a heartbeat or an end written after it keeps it; an ask
    for a lease whose row is not written yet finds no row."""
    journal = Journal(tmp_path / "j.db", synchronous="OFF")
    try:
        now = time.time()
        terms = LeaseTerms(owner="o", memory_bytes=100 * MB, ttl_s=60.0, relieve=HOOK)
        view = LeaseView("a", terms, LeaseState.GRANTED, now, now + 60)
        assert journal.record_relieve("a", RELIEVE_ASKED).result() is False  # no row yet
        journal.record_lease(view).result()
        assert journal.record_relieve("a", RELIEVE_ASKED).result() is True
        journal.record_lease(replace(view, expires_at=now + 120)).result()  # a heartbeat
        rows = journal.live_leases(now=now)
    finally:
        journal.close()
    assert rows[0].relieve_outcome == RELIEVE_ASKED


def test_ended_leases_reserve_until_their_release_hook_has_run(tmp_path: Path) -> None:
    """Between a lease's end and its hook's outcome its session is still held: counted."""
    guard, _ = fixture_guard(tmp_path, used=1 * GB)
    leases = Leases(guard)
    leases.grant("a", LeaseTerms(owner="o", memory_bytes=100 * MB))
    leases.grant("b", LeaseTerms(owner="o", memory_bytes=50 * MB))
    assert leases.reserved() == 150 * MB
    leases.end("a")
    assert leases.reserved() == 150 * MB  # its hook still runs
    leases.complete("a", "ok 204")
    assert leases.reserved() == 50 * MB

"""Granted leases measured from the container's growth: a lease whose work has grown
reserves only the rest of its estimate, so more leases fit at once, and never less than
the leases may still grow into."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from roomkeeper.gateway import leases as gateway_leases
from roomkeeper.gateway.lease_growth import LeaseGrowth
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.attribution import ENDED_WORK_SETTLES_S, Holder, attribute, raised_base
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import Leases, LeaseState, guard_key
from roomkeeper.jobs.sizes import lease_size
from roomkeeper.loopback.hooks import ReleaseHook
from roomkeeper.testing import FakeClock
from roomkeeper.units import GB
from tests.agent_events import claude_post, claude_pre_agent
from tests.cgroups import memory_box
from tests.fakes import fixture_guard
from tests.gateways import gateway_in_box, in_process_gateway, wait_until

MB = 1 << 20
HOOK = "/v1/agent-hooks/claude-code"  # the http hook type: no process per event
GIB = 1 << 30


class QuietJobs:
    """The scheduler as attribution reads it: no job of ours runs."""

    def local_footprints(self) -> int:
        return 0

    def local_sessions(self) -> set[int]:
        return set()


def never(key: str, peak: int) -> None:
    raise AssertionError(f"nothing is learned here (got {key} {peak})")


def set_used(tmp_path: Path, used: int) -> None:
    """Rewrite the fake container's usage (the tree :func:`fixture_guard` made)."""
    group = tmp_path / "tree/sys/fs/cgroup/job"
    cache = 12345
    (group / "memory.current").write_text(f"{used + cache}\n")
    (group / "memory.stat").write_text(
        f"anon {used}\nfile {cache}\ninactive_anon 0\nactive_anon 0\n"
        f"inactive_file {cache}\nactive_file 0\nslab_reclaimable 0\n"
    )


def test_attribute_gives_growth_oldest_first_each_at_most_its_estimate() -> None:
    """The growth goes to the oldest lease first, none past its estimate, none below 0."""
    holders = [Holder("b", 2.0, 300), Holder("a", 1.0, 100), Holder("c", 3.0, 500)]
    assert attribute(250, holders) == {"a": 100, "b": 150, "c": 0}
    assert attribute(10_000, holders) == {"a": 100, "b": 300, "c": 500}
    assert attribute(-5, holders) == {"a": 0, "b": 0, "c": 0}


def test_the_base_rises_to_what_the_leases_cannot_explain() -> None:
    """Growth beyond every lease's estimate is no lease's: the base rises to it, never falls."""
    holders = [Holder("a", 1.0, 100), Holder("b", 2.0, 100)]
    assert raised_base(1000, 1150, holders) == 1000
    assert raised_base(1000, 1500, holders) == 1300
    assert raised_base(1000, 900, holders) == 1000


def test_measured_leases_fit_more_and_never_reserve_less_than_their_rest(
    tmp_path: Path,
) -> None:
    """Leases whose work grew are counted once: more fit in the same room than when each
    holds its whole estimate beside its grown work, and used + reserved never drops below
    the base plus every lease's estimate (all they may still grow into is held)."""
    guard, _ = fixture_guard(tmp_path / "measured", used=1 * GB, limit=10 * GB)
    assert guard.check().memory_line_bytes == 9 * GB
    leases = Leases(guard)
    growth = LeaseGrowth(guard=guard, scheduler=QuietJobs(), leases=leases, learn=never)  # type: ignore[arg-type]
    growth.step()  # a quiet moment: the base is what is there now
    measured, margins = fill_with(tmp_path / "measured", guard, growth, leases)
    assert measured == 8  # (9 GB line - 1 GB base) / 1 GB: each counted once
    assert min(margins) >= 0

    twice, _ = fixture_guard(tmp_path / "twice", used=1 * GB, limit=10 * GB)
    unmeasured, _ = fill_with(tmp_path / "twice", twice, None, Leases(twice))
    assert unmeasured == 4  # each counted 1.9 GB: 0.9 in the reading, 1 reserved
    assert measured > unmeasured


def fill_with(
    tmp_path: Path, guard: Guard, growth: LeaseGrowth | None, leases: Leases
) -> tuple[int, list[int]]:
    """Grant 1 GB leases one by one on ``leases``, each one's work growing to 0.9 GB before
    the next is asked; (how many were granted, and at each step what is reserved less all
    the leases' work may still grow by: never below 0 when sound)."""
    base = used = 1 * GB
    margins: list[int] = []
    granted = 0
    for n in range(20):
        lease, _ = leases.grant(f"l{n}", LeaseTerms(memory_bytes=1 * GB))
        if lease is None:
            break
        granted += 1
        for _ in range(9):  # its work allocates, a tenth of a GB at a time
            used += GB // 10
            set_used(tmp_path, used)
            if growth is not None:
                growth.step()
            # What every lease may still grow by: its estimate less its work's memory.
            rest = granted * GB - (used - base)
            margins.append(guard.statistics().reserved_bytes - rest)
    return granted, margins


@dataclass
class Attributed:
    """A fake 10 GB container holding 1 GB (line 9 GB), its leases, and their attribution
    after a quiet moment (the base is 1 GB)."""

    tmp_path: Path
    guard: Guard
    clock: FakeClock
    leases: Leases
    growth: LeaseGrowth

    def younger_grew_first(self, older: str, terms: LeaseTerms | None = None) -> None:
        """Grant ``older`` (3 GB; ``terms`` when given), then ``quick`` (3 GB), whose work
        grows to its estimate before the older one's starts."""
        for name, asked in ((older, terms), ("quick", None)):
            lease, _ = self.leases.grant(name, asked or LeaseTerms(memory_bytes=3 * GB))
            assert lease is not None
        set_used(self.tmp_path, 4 * GB)

    def grant_while_room(self) -> list[str]:
        """Ask for 3 GB leases until one is refused; the ids granted."""
        granted = []
        for n in range(5):
            lease, _ = self.leases.grant(f"next{n}", LeaseTerms(memory_bytes=3 * GB))
            if lease is None:
                break
            granted.append(lease.id)
        return granted


def attributed(tmp_path: Path) -> Attributed:
    guard, clock = fixture_guard(tmp_path, used=1 * GB, limit=10 * GB)
    leases = Leases(guard)
    growth = LeaseGrowth(guard=guard, scheduler=QuietJobs(), leases=leases, learn=never)  # type: ignore[arg-type]
    growth.step()  # quiet: the base is what is there now
    return Attributed(tmp_path, guard, clock, leases, growth)


def test_a_lease_that_ends_takes_no_other_lease_s_measure_with_it(tmp_path: Path) -> None:
    """The growth given to an older lease may be a younger one's work.  When that younger
    lease ends, its work's memory leaves the reading and its reservation goes: the older
    one must not go on reserving nothing for work it has not grown yet, or more leases fit
    than the line holds once it grows."""
    box = attributed(tmp_path)
    box.younger_grew_first("slow")
    box.growth.step()
    assert box.growth.statistics().measured == {"slow": 3 * GB, "quick": 0}
    set_used(tmp_path, 1 * GB)  # its work ended, and then its lease
    assert box.leases.end("quick") is not None
    box.leases.complete("quick", None)
    granted = ["slow", *box.grant_while_room()]
    # The base and every granted lease's estimate fit under the line: 1 + 2 x 3 <= 9.
    assert granted == ["slow", "next0"]
    reading = box.guard.memory_reading()
    assert reading is not None
    assert reading.used + box.guard.statistics().reserved_bytes >= 1 * GB + 3 * GB * len(granted)


def test_memory_given_back_after_the_end_is_told_is_no_other_lease_s_share(
    tmp_path: Path,
) -> None:
    """A holder may tell its end before its work gives the memory back.  A step in between
    sees that memory with the lease gone: it is no remaining lease's, and none is told it,
    until the ended work has had time to give it back."""
    box = attributed(tmp_path)
    box.younger_grew_first("slow")
    box.growth.step()
    assert box.leases.end("quick") is not None  # its end is told first
    box.leases.complete("quick", None)
    box.growth.step()  # its work's 3 GB still in the reading
    assert box.growth.statistics().measured == {"slow": 3 * GB}  # read, and not taken:
    assert box.guard.statistics().reserved_bytes == 3 * GB  # the slow lease's whole estimate
    set_used(tmp_path, 1 * GB)  # now given back
    assert box.grant_while_room() == ["next0"]  # 1 + 2 x 3 <= 9
    # Once the ended work had time to give its memory back, shares are told again.
    box.clock.advance(ENDED_WORK_SETTLES_S)
    set_used(tmp_path, 4 * GB)  # the slow lease's work grew at last
    box.growth.step()
    assert box.guard.statistics().reserved_bytes == 3 * GB  # next0 whole, slow measured


def test_a_step_whose_reading_races_an_end_tells_nothing(tmp_path: Path) -> None:
    """The step counts ends before it reads the container: an end that lands during its
    reading makes what it would tell stale, and it tells nothing."""
    box = attributed(tmp_path)
    box.younger_grew_first("slow")
    box.clock.advance(ENDED_WORK_SETTLES_S)
    read = box.guard.memory_reading

    def end_while_reading() -> object:
        reading = read()
        box.leases.end("quick")
        box.leases.complete("quick", None)
        # Past the settling second: only when the reading was taken tells it is stale.
        box.clock.advance(ENDED_WORK_SETTLES_S)
        return reading

    box.guard.memory_reading = end_while_reading  # type: ignore[method-assign]
    box.growth.step()
    assert box.guard.statistics().reserved_bytes == 3 * GB  # the slow lease's whole estimate


def test_a_lease_whose_hook_runs_is_reset_when_another_ends(tmp_path: Path) -> None:
    """An ended lease whose release hook still runs holds its reservation: when another
    lease ends, what it was told may be that one's work too, so it reserves whole again."""
    box = attributed(tmp_path)
    hook = ReleaseHook("DELETE", "http://127.0.0.1:9/chat/1")
    box.younger_grew_first("hooked", LeaseTerms(memory_bytes=3 * GB, release=hook))
    box.growth.step()
    assert box.leases.end("hooked") is not None  # its hook runs from now
    set_used(tmp_path, 1 * GB)
    assert box.leases.end("quick") is not None
    box.leases.complete("quick", None)
    assert box.guard.statistics().reserved_bytes == 3 * GB  # the hooked lease's whole estimate


def test_a_share_told_from_a_reading_before_a_lease_ended_is_not_taken(
    tmp_path: Path,
) -> None:
    """Attribution reads the container, then tells each lease its share: a lease that ended
    in between makes those shares stale (its work may be in them), so they are not taken;
    shares from a reading after the end are."""
    guard, clock = fixture_guard(tmp_path, used=1 * GB, limit=10 * GB)
    leases = Leases(guard)
    for name in ("slow", "quick"):
        leases.grant(name, LeaseTerms(memory_bytes=3 * GB))
    read_at = clock()  # the step reads the container, then tells the shares
    clock.advance(0.1)
    assert leases.end("quick") is not None
    leases.complete("quick", None)
    guard.report_measured(guard_key("slow"), 3 * GB, shared_read_at=read_at)
    assert guard.statistics().reserved_bytes == 3 * GB
    clock.advance(ENDED_WORK_SETTLES_S)
    guard.report_measured(guard_key("slow"), 3 * GB, shared_read_at=read_at)
    assert guard.statistics().reserved_bytes == 3 * GB  # still read before the end
    guard.report_measured(guard_key("slow"), 3 * GB, shared_read_at=clock())
    assert guard.statistics().reserved_bytes == 0


def test_a_lease_whose_release_hook_still_runs_keeps_its_share(tmp_path: Path) -> None:
    """An ended lease whose release hook has not finished still holds its reservation, and
    its session its memory: that memory is its own share, never a granted lease's (which
    would then reserve nothing for growth it has not done)."""
    box = attributed(tmp_path)
    guard, leases, growth = box.guard, box.leases, box.growth
    hook = ReleaseHook("DELETE", "http://127.0.0.1:9/chat/1")
    leases.grant("ending", LeaseTerms(memory_bytes=3 * GB, release=hook))
    set_used(tmp_path, 4 * GB)  # its work grew to its estimate
    growth.step()
    leases.grant("young", LeaseTerms(memory_bytes=3 * GB))
    assert leases.end("ending") is not None  # its release hook is called now
    growth.step()
    assert growth.statistics().measured == {"ending": 3 * GB, "young": 0}
    assert guard.statistics().reserved_bytes == 3 * GB  # the young lease's whole estimate
    set_used(tmp_path, 1 * GB)  # the hook's work gave the memory back, then it finished
    leases.complete("ending", None)
    growth.step()
    assert growth.statistics().measured == {"young": 0}


def test_no_quiet_moment_seen_nothing_is_attributed(tmp_path: Path) -> None:
    """A gateway that never saw a quiet moment (leases held across a restart) measures
    nothing: every lease keeps its whole reservation."""
    guard, _ = fixture_guard(tmp_path, used=1 * GB, limit=10 * GB)
    leases = Leases(guard)
    growth = LeaseGrowth(guard=guard, scheduler=QuietJobs(), leases=leases, learn=never)  # type: ignore[arg-type]
    leases.grant("held", LeaseTerms(memory_bytes=1 * GB))
    set_used(tmp_path, 2 * GB)
    growth.step()
    assert growth.statistics().base_bytes is None
    assert guard.statistics().reserved_bytes == 1 * GB


def test_a_lease_that_ends_alone_teaches_its_kind_the_memory_it_gave_back(
    tmp_path: Path,
) -> None:
    """A lease of a kind whose work grew to 300 MB, then ended alone, teaches the kind
    300 MB (what the container gave back), even with another lease's work growing beside
    it, once no other end followed within the window; two ending at the same step, one
    followed closely by another, or a fall under the least kept, teach nothing."""
    guard, _ = fixture_guard(tmp_path, used=1 * GB, limit=10 * GB)
    leases = Leases(guard)
    kept: list[tuple[str, int]] = []
    clock = FakeClock()
    growth = LeaseGrowth(
        guard=guard,
        scheduler=QuietJobs(),  # type: ignore[arg-type]
        leases=leases,
        learn=lambda key, peak: kept.append((key, peak)),
        clock=clock,
    )
    used = 1 * GB

    def step(change: int = 0) -> None:
        nonlocal used
        used += change
        set_used(tmp_path, used)
        growth.sample()
        growth.step()
        clock.advance(0.5)

    def finish(lease_id: str, state: LeaseState = LeaseState.RELEASED) -> None:
        """End the lease and give its reservation back, as the gateway does."""
        leases.end(lease_id, state)
        leases.complete(lease_id, None)

    step()
    leases.grant("a", LeaseTerms(memory_bytes=1 * GB, kind="agent-Explore"))
    leases.grant("b", LeaseTerms(memory_bytes=1 * GB))  # no kind: teaches nothing
    for _ in range(3):
        step(100 * MB)  # a's work grows to 300 MB
    step(50 * MB)  # b's work begins
    finish("a")
    step(-300 * MB)  # a's work gave its memory back as it ended
    assert kept == []  # not yet: the next end told might own part of the fall
    for _ in range(6):
        step()  # past the window of a's end
    assert kept == [("kind:agent-Explore", 300 * MB)]
    assert growth.statistics().learned == {"agent-Explore": 300 * MB}

    leases.grant("c", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    leases.grant("d", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    step(400 * MB)
    finish("c")
    finish("d")
    step(-400 * MB)  # two ended together: whose was what is not known
    for _ in range(6):
        step()
    leases.grant("e", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    step(10 * MB)
    finish("e")
    step(-10 * MB)  # under the least kept: noise, or memory not given back
    for _ in range(6):
        step()
    leases.grant("f", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    leases.grant("g", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    step(500 * MB)
    step(-250 * MB)  # g's work ended first, its end not told yet
    finish("f")
    step(-250 * MB)  # f's end is told: the fall holds g's memory too
    finish("g")
    step()  # g's end, told close after: f's fall is not kept
    finish("b")
    for _ in range(6):
        step()
    assert kept == [("kind:agent-Explore", 300 * MB)]

    leases.grant("h", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    step(200 * MB)
    finish("h", LeaseState.EXPIRED)
    step(-200 * MB)  # an expiry: whatever fell is not known to be its work's
    for _ in range(6):
        step()
    granted, decision = leases.grant("i", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    assert granted is not None, decision
    step(240 * MB)
    for change in (-20 * MB, 20 * MB, -20 * MB, 20 * MB):
        step(change)  # other work's churn: its falls are not added up
    finish("i")
    step()  # its end is told before its work gives the memory back
    step(-240 * MB)
    for _ in range(6):
        step()
    assert kept == [("kind:agent-Explore", 300 * MB), ("kind:agent-Plan", 240 * MB)]

    leases.grant("j", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    leases.grant("k", LeaseTerms(memory_bytes=1 * GB, kind="agent-Plan"))
    step(420 * MB)
    finish("j")
    step()
    step()
    step(-200 * MB)  # j's work gives its memory back a second after its end was told
    finish("k")
    step(-220 * MB)  # k's end, 1.5 s after j's: its window holds j's fall too
    for _ in range(6):
        step()
    assert kept == [("kind:agent-Explore", 300 * MB), ("kind:agent-Plan", 240 * MB)]


def test_a_kind_sizes_its_leases_after_three_runs_at_the_top_they_point_to() -> None:
    """Under three runs the stated default stands; from three, the most of the runs plus
    the mean gap between them (the work of a lease cannot be paused if it outgrows it),
    but never a margin that alone puts it over the line."""
    assert lease_size([]) is None
    assert lease_size([300 * MB, 250 * MB]) is None
    assert lease_size([300 * MB, 250 * MB, 280 * MB]) == 325 * MB
    assert lease_size([200 * MB] * 5) == 200 * MB
    assert lease_size([300 * MB, 10 * MB, 280 * MB]) is None  # a run too small to count
    # Where the margin alone would put it over the line: the most of the runs, under it.
    assert lease_size([300 * MB, 250 * MB, 280 * MB], line=310 * MB) == 300 * MB
    assert lease_size([300 * MB, 250 * MB, 280 * MB], line=290 * MB) == 290 * MB


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_a_lease_of_a_kind_asking_no_memory_is_reserved_at_what_the_kind_learned(
    tmp_path: Path,
) -> None:
    """Through a real gateway: leases of kind ``build``, each one's work (a real process in
    a real group) grown to 200 MiB and ended alone, teach ``build`` (three runs, or a few
    more where a loaded machine's sampler missed an end); the next lease of the kind that
    asks no memory is reserved at about 200 MiB, not the guard's default, and says its
    kind."""
    with memory_box(GIB) as box, gateway_in_box(box, tmp_path) as (client, _):
        time.sleep(1.5)  # a quiet moment is seen

        def reserved() -> int:
            return int(client.get("/v1/status").json()["guard"]["reserved_bytes"])

        default = learned = None
        for run in range(6):
            before = reserved()
            lease = client.post("/v1/leases", json={"id": f"build-{run}", "kind": "build"})
            assert lease.status_code == 201, lease.text
            if default is not None and lease.json()["memory_bytes"] != default:
                assert run >= 3, f"learned from {run} run(s): three are needed"
                learned = lease.json()  # reserved at what the runs took
                break
            assert run < 5, "never learned from five runs of the kind"
            default = lease.json()["memory_bytes"]
            argv = box.argv([sys.executable, "-c", GROW, "200"], leaf="work")
            child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None and child.stdout.readline() == "grown\n"
            # Its growth is seen (the lease's reservation shrinks), so the readings before
            # its end hold it; a fixed pause could pass before a busy sampler's next look.
            grown = before + default - 100 * 2**20
            wait_until(lambda grown=grown: reserved() <= grown, "its growth seen", 30)
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)
            child.stdout.close()
            assert client.delete(f"/v1/leases/build-{run}").status_code == 200
            time.sleep(3.0)  # alone: no other end within the window after it, kept after
        assert learned is not None
        assert learned["kind"] == "build"
        assert 150 * MB <= learned["memory_bytes"] <= 300 * MB, (learned, default)
        assert box.oom_kills() == 0


GROW = (
    "import sys, time\n"
    "parts = []\n"
    "for _ in range(10):\n"
    "    parts.append(b'\\x01' * ((int(sys.argv[1]) << 20) // 10)); time.sleep(0.05)\n"
    "print('grown', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_subagents_whose_memory_shows_are_counted_once_in_a_real_group(
    tmp_path: Path,
) -> None:
    """In a real 1 GiB group, subagents of 150 MiB asked for at 160 MiB one after another
    (each grown before the next asks) through the http hook: at least 4 run at once, where
    counting each twice (its memory and its whole reservation) lets 3 at most; no OOM kill."""
    with memory_box(GIB) as box, gateway_in_box(box, tmp_path) as (client, _):
        time.sleep(1.5)  # a quiet moment is seen: the base is the gateway's own memory

        def reserved() -> int:
            return int(client.get("/v1/status").json()["guard"]["reserved_bytes"])

        running: list[tuple[dict[str, object], subprocess.Popen[str]]] = []
        try:
            for n in range(12):
                pre = claude_pre_agent(f"toolu_01grow{n:02d}")
                said = client.post(HOOK, params={"mode": "deny", "memory_mb": 160}, json=pre)
                assert said.status_code == 200, said.text
                if said.json() != {}:
                    break
                before = reserved()  # its lease reserved, nothing of its memory seen yet
                argv = box.argv([sys.executable, "-c", GROW, "150"], leaf="work")
                child = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
                running.append((pre, child))
                assert child.stdout is not None and child.stdout.readline() == "grown\n"
                # The attribution steps see it: its memory is counted, its reservation shrinks
                # (on a busy machine a step comes late; a fixed pause missed it).
                shrunk = before - 100 * 2**20
                wait_until(lambda shrunk=shrunk: reserved() <= shrunk, "its growth seen", 30)
                time.sleep(0.5)  # and one more step, as the fixed pause allowed
            at_once = len(running)
        finally:
            for pre, child in running:
                assert child.stdin is not None and child.stdout is not None
                child.stdin.close()
                child.wait(timeout=30)
                child.stdout.close()
                client.post(HOOK, json=claude_post(pre))
        assert at_once >= 4, at_once
        assert [child.returncode for _, child in running] == [0] * at_once
        assert box.oom_kills() == 0


def test_a_waiting_grant_is_judged_again_as_soon_as_a_lease_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant waiting for room is judged again the moment a lease gives its memory back,
    not at its next retry (made 30 s here, so only the wake can grant it within 10 s)."""
    monkeypatch.setattr(gateway_leases, "LEASE_RETRY_S", 30.0)
    with in_process_gateway(tmp_path) as gateway:

        async def scenario() -> tuple[bool, float]:
            leases = gateway.durable_leases
            free = gateway.guard.check(memory_bytes=0).memory_line_bytes or 0
            free -= gateway.guard.memory_reading().used  # type: ignore[union-attr]
            # The first leaves a quarter of the room; the second asks half: it waits for
            # the first, and fits the moment the first ends.
            first, _, _ = await leases.grant(
                "first", LeaseTerms(memory_bytes=free * 3 // 4), wait_s=0
            )
            assert first is not None
            waiting = asyncio.create_task(
                leases.grant("second", LeaseTerms(memory_bytes=free // 2), wait_s=60)
            )
            await asyncio.sleep(1.0)
            waited = not waiting.done()
            ended = time.monotonic()
            await leases.end("first")
            second, _, _ = await asyncio.wait_for(waiting, 60)
            assert second is not None
            await leases.end("second")
            return waited, time.monotonic() - ended

        waited, granted_after = asyncio.run(scenario())
    assert waited  # it did wait for room while the first held it
    assert granted_after < 10, granted_after


def test_a_waiting_grant_takes_what_its_kind_learned_while_it_waited(tmp_path: Path) -> None:
    """A lease of a kind asked at a default that cannot fit waits; once three runs of the
    kind are kept (100 MB each), its next try asks that much instead, and is granted."""
    with in_process_gateway(tmp_path) as gateway:

        async def scenario() -> int | None:
            leases = gateway.durable_leases
            reading = gateway.guard.memory_reading()
            assert reading is not None
            too_much = reading.limit + 1 * GB  # the stated default: never fits
            waiting = asyncio.create_task(
                leases.grant("w", LeaseTerms(kind="k"), wait_s=20, default_memory=too_much)
            )
            await asyncio.sleep(0.5)
            assert not waiting.done()
            for _ in range(3):
                await asyncio.wrap_future(gateway.journal.record_peak("kind:k", 100 * MB))
            lease, _, _ = await asyncio.wait_for(waiting, 30)
            assert lease is not None
            await leases.end("w")
            return lease.terms.memory_bytes

        assert asyncio.run(scenario()) == 100 * MB

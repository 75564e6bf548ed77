"""Granted leases measured from the container's growth: a lease whose work has grown
reserves only the rest of its estimate, so more leases fit at once, and never less than
the leases may still grow into."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from roomkeeper.gateway.lease_growth import LeaseGrowth
from roomkeeper.guard.admission import Guard
from roomkeeper.guard.attribution import Holder, attribute, raised_base
from roomkeeper.guard.lease_terms import LeaseTerms
from roomkeeper.guard.leases import Leases
from roomkeeper.units import GB
from tests.agent_events import claude_post, claude_pre_agent
from tests.cgroups import memory_box
from tests.fakes import fixture_guard
from tests.gateways import gateway_in_box

MB = 1 << 20
HOOK = "/v1/agent-hooks/claude-code"  # the http hook type: no process per event
GIB = 1 << 30


class QuietJobs:
    """The scheduler as attribution reads it: no job of ours runs."""

    def local_footprints(self) -> int:
        return 0

    def local_sessions(self) -> set[int]:
        return set()


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
    growth = LeaseGrowth(guard=guard, scheduler=QuietJobs(), leases=leases)  # type: ignore[arg-type]
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


def test_no_quiet_moment_seen_nothing_is_attributed(tmp_path: Path) -> None:
    """A gateway that never saw a quiet moment (leases held across a restart) measures
    nothing: every lease keeps its whole reservation."""
    guard, _ = fixture_guard(tmp_path, used=1 * GB, limit=10 * GB)
    leases = Leases(guard)
    growth = LeaseGrowth(guard=guard, scheduler=QuietJobs(), leases=leases)  # type: ignore[arg-type]
    leases.grant("held", LeaseTerms(memory_bytes=1 * GB))
    set_used(tmp_path, 2 * GB)
    growth.step()
    assert growth.statistics().base_bytes is None
    assert guard.statistics().reserved_bytes == 1 * GB


GROW = (
    "import sys, time\n"
    "parts = []\n"
    "for _ in range(10):\n"
    "    parts.append(b'\\x01' * ((int(sys.argv[1]) << 20) // 10)); time.sleep(0.05)\n"
    "print('grown', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_subagents_whose_memory_shows_are_counted_once_in_a_real_group(
    tmp_path: Path,
) -> None:
    """In a real 1 GiB group, subagents of 150 MiB asked for at 160 MiB one after another
    (each grown before the next asks) through the http hook: at least 4 run at once, where
    counting each twice (its memory and its whole reservation) lets 3 at most; no OOM kill."""
    with memory_box(GIB) as box, gateway_in_box(box, tmp_path) as (client, _):
        time.sleep(1.5)  # a quiet moment is seen: the base is the gateway's own memory
        running: list[tuple[dict[str, object], subprocess.Popen[str]]] = []
        try:
            for n in range(12):
                pre = claude_pre_agent(f"toolu_01grow{n:02d}")
                said = client.post(HOOK, params={"mode": "deny", "memory_mb": 160}, json=pre)
                assert said.status_code == 200, said.text
                if said.json() != {}:
                    break
                argv = box.argv([sys.executable, "-c", GROW, "150"])
                child = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
                running.append((pre, child))
                assert child.stdout is not None and child.stdout.readline() == "grown\n"
                time.sleep(1.0)  # two attribution steps see it
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

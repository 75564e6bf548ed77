"""The baseline watch: memory no live work explains, judged across endings (pure), and the
container's processes ranked by growth (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roomkeeper.config import BaselineSettings, read_baseline_settings
from roomkeeper.kernel.growth import ProcessGrowth
from roomkeeper.relief.baseline import BaselineRecord, BaselineWatch

MB = 10**6
LINE = 1000 * MB  # share 10 % = 100 MB
SETTINGS = BaselineSettings(growth_percent=10.0, endings=10)


def watch() -> BaselineWatch:
    return BaselineWatch(lambda: SETTINGS)


def record(used: int, leased: int = 0, footprints: int = 0) -> BaselineRecord:
    return BaselineRecord(at=0.0, used=used, footprints=footprints, leased=leased, line=LINE)


def turns(w: BaselineWatch, used_after: list[int]) -> list[int]:
    """One ending and one record per turn; the turns (1-based) at which the rule fired."""
    fired = []
    for n, used in enumerate(used_after, start=1):
        w.ended()
        if w.record(record(used)) is not None:
            fired.append(n)
    return fired


def test_turns_that_give_their_memory_back_never_fire() -> None:
    """The baseline returns after every ending: nothing is said, however many endings."""
    w = watch()
    w.record(record(200 * MB))
    assert turns(w, [200 * MB + (n % 3) * MB for n in range(100)]) == []
    assert not w.statistics().not_given_back


def test_turns_that_keep_their_sessions_fire_once_across_the_endings() -> None:
    """16 MB kept per turn: more than the share (100 MB) above the baseline N endings before
    it, and the lowest of the last records too: once, with its numbers."""
    w = watch()
    w.record(record(200 * MB))
    fired = []
    for n in range(1, 21):
        w.ended()
        said = w.record(record(200 * MB + n * 16 * MB))
        if said is not None:
            fired.append((n, said))
    assert [n for n, _ in fired] == [11]
    said = fired[0][1]
    # Measured from the first ending (the start-up's records are not "then"); at the 11th the
    # lowest of the last 3 records is the 9th turn's.
    assert (said.then_bytes, said.now_bytes) == (200 * MB + 16 * MB, 200 * MB + 9 * 16 * MB)
    assert (said.endings, said.share_bytes) == (10, 100 * MB)
    stats = w.statistics()
    assert stats.not_given_back and stats.fired == 1 and stats.endings == 20


def test_fewer_endings_than_asked_never_fire_however_high_it_rises() -> None:
    """Growth across fewer than N endings is not yet a pattern of endings."""
    w = watch()
    w.record(record(200 * MB))
    assert turns(w, [200 * MB + n * 200 * MB for n in range(1, 10)]) == []


def test_a_reading_taken_while_a_lease_was_young_is_never_taken_for_a_low_baseline() -> None:
    """Leases reserve more than their turns hold at first, so the plain baseline reads low
    then; growth is measured from the baseline that counts leases' memory in."""
    w = watch()
    w.record(record(300 * MB))
    w.ended()
    w.record(record(300 * MB, leased=8 * 100 * MB))  # eight young leases: plain -500 MB
    for _ in range(12):  # every ending returns to the same 300 MB, quiet
        w.ended()
        assert w.record(record(300 * MB)) is None


def test_one_high_reading_is_not_memory_kept() -> None:
    """Used read before a freed session was unmapped: the next records come back down."""
    w = watch()
    w.record(record(200 * MB))
    assert turns(w, [200 * MB] * 12) == []
    w.ended()
    assert w.record(record(900 * MB)) is None  # the lowest of the last three is 200 MB
    assert turns(w, [200 * MB] * 3) == []


def test_it_clears_once_the_baseline_comes_back_and_can_fire_again() -> None:
    """Back within half the share: given back, said no more; a new rise fires again."""
    w = watch()
    w.record(record(200 * MB))
    assert turns(w, [200 * MB] * 10 + [400 * MB] * 3) == [13]
    assert turns(w, [280 * MB] * 3) == []
    assert w.statistics().not_given_back  # 80 MB up: more than half the share still
    assert turns(w, [240 * MB] * 3) == []
    assert not w.statistics().not_given_back
    assert turns(w, [400 * MB] * 3) == [3]
    assert w.statistics().fired == 2


def test_what_starts_beside_the_gateway_before_the_first_ending_is_not_growth() -> None:
    """Helpers that start after the gateway (an agent server, a dispatcher) and hold their
    memory are the start-up, not memory a turn kept."""
    w = watch()
    w.record(record(100 * MB))  # the gateway alone
    w.record(record(300 * MB))  # its helpers arrived
    assert turns(w, [300 * MB] * 30) == []


def test_young_leases_never_make_kept_memory_look_given_back() -> None:
    """Once said, it is cleared only from readings that count leases' memory in: a new lease
    reserving more than its turn holds yet does not clear it."""
    w = watch()
    w.record(record(200 * MB))
    assert turns(w, [200 * MB] * 10 + [400 * MB] * 3) == [13]
    for _ in range(3):  # the same 400 MB held, and a fresh lease of 300 MB
        w.ended()
        w.record(record(400 * MB, leased=300 * MB))
    stats = w.statistics()
    assert stats.not_given_back
    # What it says it rose to counts the leases' memory in, as it judged: never below "then".
    assert (stats.then_bytes, stats.judged_bytes) == (200 * MB, 400 * MB)


@given(st.lists(st.integers(min_value=0, max_value=100 * MB), min_size=1, max_size=60))
def test_never_fires_while_it_stays_within_the_share(rises: list[int]) -> None:
    """However the baseline moves, never above the first record by the share, nothing fires."""
    w = watch()
    w.record(record(200 * MB))
    assert turns(w, [200 * MB + r for r in rises]) == []


def test_the_variables_are_read_and_bad_values_keep_the_defaults() -> None:
    """ROOMKEEPER_BASELINE_GROWTH_PERCENT and _ENDINGS, each checked against its range."""
    env = {"ROOMKEEPER_BASELINE_GROWTH_PERCENT": "5", "ROOMKEEPER_BASELINE_ENDINGS": "20"}
    assert read_baseline_settings(env) == BaselineSettings(growth_percent=5.0, endings=20)
    bad = {"ROOMKEEPER_BASELINE_GROWTH_PERCENT": "0", "ROOMKEEPER_BASELINE_ENDINGS": "-1"}
    assert read_baseline_settings(bad) == BaselineSettings()


@pytest.fixture
def grower() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that waits for a line on stdin, then holds 60 MB."""
    code = (
        "import sys; sys.stdin.readline(); b = bytearray(60_000_000); "
        "print('held', flush=True); sys.stdin.readline()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        try:
            yield proc
        finally:
            proc.kill()
            proc.wait()


def test_processes_are_ranked_by_growth_since_the_first_look(
    grower: subprocess.Popen[bytes],
) -> None:
    """A real process that grew 60 MB after the first look leads the ranking; left out by
    its session, it is not listed."""
    time.sleep(0.3)  # the interpreter has started: what it holds now is not growth
    growth = ProcessGrowth(lambda: None)
    growth.start()
    assert grower.stdin is not None and grower.stdout is not None
    grower.stdin.write(b"go\n")
    grower.stdin.flush()
    assert grower.stdout.readline() == b"held\n"
    ranked = growth.ranking()
    mine = [g for g in ranked if g.pid == grower.pid]
    assert mine and mine[0].bytes >= 55_000_000, ranked[:3]
    assert mine[0].name.startswith("python"), mine
    session = os.getsid(grower.pid)
    left_out = growth.ranking(sessions={session}, most=100)
    assert grower.pid not in {g.pid for g in left_out}

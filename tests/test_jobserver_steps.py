"""The jobserver's step rule: every step started can always be finished below the line."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from roomkeeper.jobserver.steps import (
    LEARNED_AFTER,
    NEED_GRAIN,
    Step,
    admits,
    expected_growth,
    finishable,
    growth_ahead,
    safe,
    step_need,
    to_pause,
    to_resume,
)

MB = 1_000_000


def step(n: int, footprint_mb: int, need_mb: int, rate_mb: float = 0, paused: bool = False) -> Step:
    """Step ``n`` (first seen at second ``n``: the higher, the newer)."""
    return Step(("job", n), float(n), footprint_mb * MB, need_mb * MB, rate_mb * MB, paused)


def test_steps_that_cannot_all_grow_at_once_can_still_finish_one_after_another() -> None:
    """Three steps each needing 500 MB more, with 600 MB of room: not all at once, but the
    first that finishes gives its 200 MB back, and so on; with 400 MB none can finish."""
    steps = [step(1, 200, 500), step(2, 200, 500), step(3, 200, 500)]
    assert finishable(steps, 600 * MB)
    assert not finishable(steps, 400 * MB)


def test_the_smallest_need_goes_first() -> None:
    """A nearly done step finishes first and frees room for a big one that alone would not fit."""
    steps = [step(1, 100, 900), step(2, 650, 50)]
    assert finishable(steps, 300 * MB)
    assert not finishable([step(1, 100, 900)], 300 * MB)


def test_growth_before_the_next_look_counts_against_the_room() -> None:
    """Running steps growing at 1 GB/s take 150 MB of the room in the 0.15 s before the next
    look; paused ones take none."""
    running = [step(1, 100, 200, rate_mb=500), step(2, 100, 200, rate_mb=500)]
    assert growth_ahead(running) == 150 * MB
    assert finishable(running, 300 * MB)
    assert not safe(running, 300 * MB)
    assert growth_ahead([step(1, 100, 200, rate_mb=500, paused=True)]) == 0


def test_running_steps_are_paused_furthest_from_their_end_first_until_it_is_safe() -> None:
    """Four steps of 50 MB, each growing 100 MB/s (15 MB before the next look), needing 450 to
    600 MB more: with 500 MB of room the growth of all four leaves too little for the first
    to finish; pausing the one furthest from its end is enough; with 485 MB, two must wait."""
    steps = [step(1, 50, 500, 100), step(2, 50, 600, 100), step(3, 50, 550, 100)]
    steps.append(step(4, 50, 450, 100))
    assert to_pause(steps, 500 * MB) == [("job", 2)]
    assert to_pause(steps, 485 * MB) == [("job", 2), ("job", 3)]
    assert to_pause(steps, 600 * MB) == []


def test_the_step_nearest_its_end_is_never_paused() -> None:
    """No room at all: every running step but the one nearest its end is paused."""
    steps = [step(3, 100, 900, 100), step(1, 500, 400, 100), step(2, 100, 800, 100)]
    assert to_pause(steps, 0) == [("job", 3), ("job", 2)]


def test_a_paused_step_goes_on_nearest_its_end_first_once_it_is_safe() -> None:
    """Two paused steps: the one nearer its end goes on first, and only once it is safe."""
    steps = [step(1, 400, 300, rate_mb=100), step(2, 100, 600, paused=True)]
    steps.append(step(3, 300, 400, paused=True))
    assert to_resume(steps, 200 * MB) is None  # neither would be safe beside the running one
    assert to_resume(steps, 900 * MB) == ("job", 3)


def test_one_paused_step_goes_on_when_nothing_runs() -> None:
    """All paused (the running ones ended): the one nearest its end goes on whatever the room."""
    steps = [step(2, 200, 800, paused=True), step(1, 300, 900, paused=True)]
    assert to_resume(steps, 0) == ("job", 2)


def test_a_new_step_is_let_in_only_while_every_step_stays_finishable() -> None:
    """A running step 100 MB from its end gives back 400 MB when it ends: a new step of up to
    700 MB fits after it in 450 MB of room, not in 350 MB (where the running one alone does)."""
    running = [step(1, 300, 100)]
    new = step(9, 0, 700)
    assert admits(running, 450 * MB, new)
    assert finishable(running, 350 * MB)
    assert not admits(running, 350 * MB, new)


def test_a_step_is_expected_to_grow_to_the_mean_of_the_finished_steps_above_it() -> None:
    """Finished at 200, 400, 600 and 800 MB: a step at 300 MB is expected at 600 (300 more),
    one at 700 at 800; one above them all by what it grows before the next look; and while
    fewer steps than LEARNED_AFTER finished, by the rest of the largest."""
    finished = [200 * MB, 400 * MB, 600 * MB, 800 * MB]
    assert len(finished) == LEARNED_AFTER
    assert expected_growth(300 * MB, finished, 800 * MB, 0) == 300 * MB
    assert expected_growth(700 * MB, finished, 800 * MB, 0) == 100 * MB
    assert expected_growth(900 * MB, finished, 900 * MB, 100 * MB) == 15 * MB
    assert expected_growth(300 * MB, finished[:3], 800 * MB, 0) == 500 * MB


def test_a_step_growing_past_the_largest_needs_what_it_grows_by_in_a_second() -> None:
    """The largest finished step was 100 MB; a step at 300 MB still growing 600 MB/s is not
    taken to be done: it needs 600 MB, and two such steps in 700 MB of room are not safe.
    Growing slowly (50 MB/s), it still needs as much again as it holds; settled, nothing."""
    assert step_need(300 * MB, 300 * MB, 600 * MB, 100 * MB) == 600 * MB
    assert step_need(300 * MB, 300 * MB, 50 * MB, 100 * MB) == 300 * MB
    assert step_need(700 * MB, 300 * MB, 100 * MB, 700 * MB) == 400 * MB
    assert step_need(300 * MB, 300 * MB, 0, 100 * MB) == 0
    need = step_need(300 * MB, 300 * MB, 600 * MB, 100 * MB)
    growing = [Step(("job", n), n, 300 * MB, need, 600 * MB) for n in (1, 2)]
    assert not safe(growing, 700 * MB)
    assert to_pause(growing, 700 * MB) == [("job", 2)]


sizes = st.integers(min_value=0, max_value=2_000)


@given(
    st.lists(st.tuples(sizes, sizes, st.integers(0, 3_000), st.booleans()), max_size=8),
    st.integers(-500, 3_000),
)
@example([(0, 1, 0, False), (0, 0, 0, False)], -1)  # needs within a grain: the older is nearest
def test_after_the_pauses_it_is_safe_or_only_the_step_nearest_its_end_runs(
    drawn: list[tuple[int, int, int, bool]], room_mb: int
) -> None:
    """Whatever the steps and the room: once the chosen steps are paused, either every step is
    safe or a single one runs, and the running step nearest its end is never chosen."""
    steps = [step(n, f, need, rate, paused) for n, (f, need, rate, paused) in enumerate(drawn)]
    chosen = to_pause(steps, room_mb * MB)
    after = [
        Step(s.key, s.began, s.footprint, s.need, s.rate, s.paused or s.key in chosen)
        for s in steps
    ]
    assert safe(after, room_mb * MB) or sum(1 for s in after if not s.paused) <= 1
    running = [s for s in steps if not s.paused]
    if running:
        # Needs within NEED_GRAIN are equal: of those, the older is the nearest.
        nearest = min(running, key=lambda s: (s.need // NEED_GRAIN, s.began))
        assert nearest.key not in chosen

"""How fast any jobserver could run bench_jobserver.py's build: a model, checked against make -jK.

bench_jobserver.py asks the memory-metered jobserver for a wall of at most 0.9x
the fastest ``make -jK`` that lost nothing.  This script asks what that goal
needs, in a model of the same build cheap enough to try every rule in:

- the same 24 steps, in the same order (``bench_jobserver.sizes``), each a
  ``grow.py``: an interpreter start (``--start`` s, ``--interpreter`` MB), then
  its size in 20 equal allocations over ``--grow`` s, then ``--hold`` s at its peak;
- the group: a 2 GiB limit, ``--base`` MB held by make and the batch, and the
  kernel's OOM killer taking the largest step whenever the sum passes the limit;
- time in steps of 10 ms.

A jobserver can only say *when* the next step starts, never *which*: make and
ninja start them in their own order.  So the model runs, for each rule:

1. ``make -jK`` for K from 2 to 8, to check the model against the walls
   bench_jobserver.py measures (it prints both for the reader to compare);
2. a jobserver with perfect foresight: it knows every step's whole future
   (size, growth, end) and starts the next as soon as the sum of every running
   step's future, with the new one's, never passes its line.  Starting as soon
   as possible is not always fastest (a step started early can hold back a
   larger one), so the line is tried at every 1 MB from 300 MB below the
   guard's hold line up, and the fastest is kept;
3. the best of a grid of pausing rules, each told every step's size the
   moment it starts and acting every 10 ms, then only every round of the
   meter (``ROUND_S``, 100 ms) as the real one does: a token whenever the memory
   expected a look-ahead from now, plus a reserve, stays under a line; the
   youngest (or largest, or furthest from its peak) growing step paused when
   the look-ahead would pass the line, and resumed nearest its peak first.

Neither 2 nor 3 can be built (a step's size is not known before it grows),
so their walls are bounds on what the jobserver could reach, not targets.

Usage: python benchmarks/jobserver_bound.py [--start 0.2] [--base 80]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from bench_jobserver import LIMIT, MB, sizes

from roomkeeper.guard.lines import Reading
from roomkeeper.jobserver.meter import ROUND_S

TICK_S = 0.01
CHUNKS = 20  # grow.py's default number of allocations
MAX_S = 300.0  # a rule that has not finished by then is stuck (every step paused)


@dataclass(frozen=True, slots=True)
class Build:
    """The build as the model sees it (sizes in MB)."""

    sizes: list[float]
    start_s: float
    grow_s: float
    hold_s: float
    interpreter_mb: float
    base_mb: float
    limit_mb: float

    def memory(self, step: int, age: float) -> float:
        """What step ``step`` holds ``age`` seconds after it started running."""
        grown = age - self.start_s
        if grown < 0:
            return self.interpreter_mb
        chunks = min(CHUNKS, int(grown / (self.grow_s / CHUNKS)) + 1)
        return self.interpreter_mb + self.sizes[step] * chunks / CHUNKS

    def life_s(self) -> float:
        return self.start_s + self.grow_s + self.hold_s


@dataclass(slots=True)
class Step:
    index: int
    age: float = 0.0
    paused: bool = False


@dataclass(slots=True)
class State:
    """What a rule sees at each tick."""

    build: Build
    running: list[Step] = field(default_factory=list)
    next_step: int = 0

    def used(self) -> float:
        return self.build.base_mb + sum(self.build.memory(s.index, s.age) for s in self.running)


Rule = Callable[[State], int]  # how many new steps to start now


@dataclass(frozen=True, slots=True)
class Outcome:
    wall_s: float
    killed: int
    paused_s: float  # step-seconds spent paused
    stuck: bool


def simulate(build: Build, rule: Rule) -> Outcome:
    """Run the build under ``rule`` until every step has ended or been killed."""
    state = State(build)
    now = paused = 0.0
    ended = killed = 0
    total = len(build.sizes)
    while ended + killed < total:
        if now > MAX_S:
            return Outcome(now, killed, paused, stuck=True)
        for _ in range(min(rule(state), total - state.next_step)):
            state.running.append(Step(state.next_step))
            state.next_step += 1
        for step in state.running:
            if step.paused:
                paused += TICK_S
            else:
                step.age += TICK_S
        if state.used() > build.limit_mb:  # the OOM killer takes the largest
            largest = max(state.running, key=lambda s: build.memory(s.index, s.age))
            state.running.remove(largest)
            killed += 1
        done = [s for s in state.running if s.age >= build.life_s()]
        for step in done:
            state.running.remove(step)
        ended += len(done)
        now += TICK_S
    return Outcome(now, killed, paused, stuck=False)


def fixed_count(k: int) -> Rule:
    """``make -jK``: start steps while fewer than K run."""
    return lambda state: max(0, k - len(state.running))


def foresight(line_mb: float) -> Rule:
    """Start the next step as soon as nothing, with it, would ever pass the line."""

    def rule(state: State) -> int:
        build = state.build
        ages = [(s.index, s.age) for s in state.running]
        started = 0
        while state.next_step + started < len(build.sizes):
            trial = [*ages, (state.next_step + started, 0.0)]
            if not _never_passes(build, trial, line_mb):
                break
            ages = trial
            started += 1
        return started

    return rule


def _never_passes(build: Build, ages: list[tuple[int, float]], line_mb: float) -> bool:
    ahead = 0.0
    while ahead <= build.life_s():
        alive = [(i, a + ahead) for i, a in ages if a + ahead < build.life_s()]
        if build.base_mb + sum(build.memory(i, a) for i, a in alive) > line_mb:
            return False
        ahead += TICK_S
    return True


PAUSE_FIRST = {
    "youngest": lambda build, s: s.age,
    "largest": lambda build, s: -build.sizes[s.index],
    "furthest from its peak": lambda build, s: build.memory(s.index, s.age) - build.sizes[s.index],
}


def pausing(line_mb: float, reserve_mb: float, most: int, pause_first: str, look_s: float) -> Rule:
    """Told every size: pause growth that would pass the line; start while a reserve fits."""
    order = PAUSE_FIRST[pause_first]

    def rule(state: State) -> int:
        build = state.build

        def growth(step: Step) -> float:
            peak = build.interpreter_mb + build.sizes[step.index]
            if step.age >= build.start_s + build.grow_s:
                return 0.0
            ahead = build.sizes[step.index] * look_s / build.grow_s
            return min(ahead, peak - build.memory(step.index, step.age))

        awake = [s for s in state.running if not s.paused]
        expected = state.used() + sum(growth(s) for s in awake)
        for step in sorted((s for s in awake if growth(s) > 0), key=lambda s: order(build, s)):
            if expected <= line_mb:
                break
            step.paused = True
            expected -= growth(step)
        asleep = [s for s in state.running if s.paused]
        for step in sorted(
            asleep, key=lambda s: build.sizes[s.index] - build.memory(s.index, s.age)
        ):
            if expected + growth(step) <= line_mb:
                step.paused = False
                expected += growth(step)
        if any(s.paused for s in state.running) or len(state.running) >= most:
            return 0
        return 1 if expected + reserve_mb <= line_mb else 0

    return rule


def every_round(rule: Rule, round_s: float) -> Rule:
    """``rule`` acting only once a round, as the meter does; nothing is started in between."""
    ticks = max(1, round(round_s / TICK_S))
    seen = itertools.count()
    return lambda state: rule(state) if next(seen) % ticks == 0 else 0


def best_pausing(build: Build, line_mb: float, round_s: float) -> tuple[Outcome, str]:
    """The fastest of the grid of pausing rules that killed nothing and did not get stuck."""
    best: tuple[Outcome, str] | None = None
    grid = itertools.product((50, 100, 200, 300, 400), (5, 6, 7), PAUSE_FIRST, (0.1, 0.2, 0.4))
    for reserve, most, first, look in grid:
        rule = every_round(pausing(line_mb, reserve, most, first, look), round_s)
        outcome = simulate(build, rule)
        if outcome.killed or outcome.stuck:
            continue
        if best is None or outcome.wall_s < best[0].wall_s:
            words = f"reserve {reserve} MB, at most {most}, pause the {first}, look {look} s"
            best = (outcome, words)
    if best is None:
        raise SystemExit("no pausing rule finished without a kill")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--grow", type=float, default=2.0, help="seconds each step grows")
    parser.add_argument("--hold", type=float, default=1.0, help="seconds each step holds")
    parser.add_argument("--start", type=float, default=0.2, help="a step's interpreter start (s)")
    parser.add_argument("--interpreter", type=float, default=8.0, help="a step's interpreter (MB)")
    parser.add_argument("--base", type=float, default=80.0, help="make and the batch (MB)")
    args = parser.parse_args()
    build = Build(
        sizes=[s / MB for s in sizes(args.steps)],
        start_s=args.start,
        grow_s=args.grow,
        hold_s=args.hold,
        interpreter_mb=args.interpreter,
        base_mb=args.base,
        limit_mb=LIMIT / MB,
    )
    lines = Reading(used=0, limit=LIMIT, headroom_percent=10.0, reserve=0, full_avg10=None, at=0)
    hold_mb, suspend_mb = lines.hold_line / MB, lines.suspend_line / MB
    print(
        f"model: {args.steps} steps of 150-700 MB, start {args.start} s, grow {args.grow} s, "
        f"hold {args.hold} s; limit {build.limit_mb:.0f} MB, hold line {hold_mb:.0f} MB, "
        f"suspend line {suspend_mb:.0f} MB (default headroom)"
    )
    clean: list[float] = []
    for k in range(2, 9):
        outcome = simulate(build, fixed_count(k))
        print(f"make -j{k}{'':28} wall {outcome.wall_s:6.2f} s  OOM kills {outcome.killed:2}")
        if not outcome.killed:
            clean.append(outcome.wall_s)
    fastest = min(clean)
    print(f"fastest lossless count {fastest:.2f} s; the goal, 0.9x, is {0.9 * fastest:.2f} s")
    lowest = int(hold_mb) - 300
    runs = [(simulate(build, foresight(line)), line) for line in range(lowest, int(suspend_mb) + 1)]
    for name, line_mb in (("hold line", hold_mb), ("suspend line", suspend_mb)):
        seen, at = min(
            ((o, line) for o, line in runs if line <= line_mb and not o.killed),
            key=lambda run: run[0].wall_s,
        )
        print(
            f"perfect foresight, under the {name:12} wall {seen.wall_s:6.2f} s = "
            f"{seen.wall_s / fastest:.3f}x  (its line at {at:.0f} MB)"
        )
        for round_s in (TICK_S, ROUND_S):
            paused, words = best_pausing(build, line_mb, round_s)
            print(
                f"best pausing rule, {round_s * 1000:3.0f} ms rounds, under the {name:12} "
                f"wall {paused.wall_s:6.2f} s = {paused.wall_s / fastest:.3f}x  "
                f"({words}; {paused.paused_s:.1f} step-s paused)"
            )


if __name__ == "__main__":
    main()

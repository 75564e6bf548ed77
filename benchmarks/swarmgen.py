"""Seeded random swarms of memory-hungry jobs, for benchmarks that pack work nobody has seen.

A swarm is a container size and a list of jobs, each run by ``grow.py``: idle
for a start delay, grow to its size in steps over its growth time, hold it,
then end.  Every knob is a range drawn from per job with one seeded
``random.Random``, so a seed names one swarm exactly::

    python benchmarks/swarmgen.py --seed 3            # print swarm 3 as commands
    python benchmarks/swarmgen.py --seed 3 --describe # and what it is made of

Shapes: ``steady`` (20 equal steps), ``stepwise`` (3 large steps) and
``slow-start`` (steady, after an idle start of up to half its growth time,
as a job importing its libraries does).

The memory-time bound is the shortest wall time any scheduler could reach:
the larger of the longest job and the swarm's memory-time (each job's bytes
integrated over its life) divided by the container's limit.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from roomkeeper.units import parse_size

HERE = Path(__file__).resolve().parent
GROW = HERE / "grow.py"
SHAPES = ("steady", "stepwise", "slow-start")
STEPS = {"steady": 20, "stepwise": 3, "slow-start": 20}


@dataclass(frozen=True, slots=True)
class Job:
    """One job of a swarm: how large, how it grows, how long it holds."""

    size: int
    grow_s: float
    hold_s: float
    shape: str
    start_delay_s: float

    @property
    def steps(self) -> int:
        return STEPS[self.shape]

    @property
    def duration_s(self) -> float:
        return self.start_delay_s + self.grow_s + self.hold_s

    @property
    def memory_time(self) -> float:
        """Byte-seconds it holds: ``steps`` equal steps over its growth, then all of it."""
        n = self.steps
        return self.size * self.grow_s * (n + 1) / (2 * n) + self.size * self.hold_s

    def command(self, done: str = "-", python: str = sys.executable) -> str:
        """The shell line that runs it (``done``: the file it writes when it finishes)."""
        return (
            f"{python} {GROW} {self.size} {self.grow_s:.2f} {self.hold_s:.2f} {done} "
            f"{self.start_delay_s:.2f} {self.steps}"
        )


@dataclass(frozen=True, slots=True)
class Swarm:
    """A seeded swarm: its container's limit and its jobs."""

    seed: int
    limit: int
    jobs: tuple[Job, ...]

    def bound_s(self) -> float:
        """The memory-time bound: no scheduler can finish sooner."""
        longest = max(j.duration_s for j in self.jobs)
        return max(longest, sum(j.memory_time for j in self.jobs) / self.limit)

    def describe(self) -> str:
        sizes = sorted(j.size for j in self.jobs)
        shapes = {s: sum(1 for j in self.jobs if j.shape == s) for s in SHAPES}
        return (
            f"seed {self.seed}: {len(self.jobs)} jobs in {self.limit / 1e9:.2f} GB, sizes "
            f"{sizes[0] / 1e9:.2f}..{sizes[-1] / 1e9:.2f} GB (median "
            f"{sizes[len(sizes) // 2] / 1e9:.2f}), shapes {shapes}, bound {self.bound_s():.1f} s"
        )


@dataclass(frozen=True, slots=True)
class Knobs:
    """The ranges a swarm is drawn from (sizes in bytes, times in seconds)."""

    jobs: tuple[int, int] = (12, 20)
    size: tuple[int, int] = (parse_size("200M"), parse_size("1100M"))
    size_spread: str = "mixed"  # uniform, skewed (many small, few large), or mixed (either)
    grow_s: tuple[float, float] = (2.0, 8.0)
    hold_s: tuple[float, float] = (0.5, 4.0)
    shapes: tuple[str, ...] = SHAPES
    limit: tuple[int, int] = (parse_size("2.5G"), parse_size("4G"))


def generate(seed: int, knobs: Knobs = Knobs()) -> Swarm:
    """The swarm of ``seed``: the same seed and knobs always give the same swarm."""
    rng = random.Random(seed)
    limit = rng.randint(*knobs.limit)
    spread = knobs.size_spread
    if spread == "mixed":
        spread = rng.choice(("uniform", "skewed"))
    low, high = knobs.size
    high = min(high, int(limit * 0.4))  # every job fits alone, with room for the line
    jobs = []
    for _ in range(rng.randint(*knobs.jobs)):
        u = rng.random() if spread == "uniform" else rng.random() ** 2.5
        grow = rng.uniform(*knobs.grow_s)
        shape = rng.choice(knobs.shapes)
        delay = rng.uniform(0, grow / 2) if shape == "slow-start" else 0.0
        jobs.append(
            Job(
                size=int(low + u * (high - low)),
                grow_s=round(grow, 2),
                hold_s=round(rng.uniform(*knobs.hold_s), 2),
                shape=shape,
                start_delay_s=round(delay, 2),
            )
        )
    return Swarm(seed, limit, tuple(jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", default="12,20", help="least,most jobs")
    parser.add_argument("--size", default="200M,1100M", help="smallest,largest peak")
    parser.add_argument("--spread", choices=("uniform", "skewed", "mixed"), default="mixed")
    parser.add_argument("--grow", default="2,8", help="least,most seconds of growth")
    parser.add_argument("--hold", default="0.5,4", help="least,most seconds held")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--limit", default="2.5G,4G", help="least,most container limit")
    parser.add_argument("--describe", action="store_true", help="say what the swarm is, too")
    args = parser.parse_args()
    knobs = knobs_from(args)
    swarm = generate(args.seed, knobs)
    if args.describe:
        print(swarm.describe(), file=sys.stderr)
    for job in swarm.jobs:
        print(job.command())


def knobs_from(args: argparse.Namespace) -> Knobs:
    """Knobs from the command line's ranges (each ``least,most``); a clear exit when bad."""

    def pair(text: str, convert: type[float] | type[int]) -> tuple[float, float]:
        try:
            low, high = (convert(x) for x in text.split(","))
        except ValueError:
            sys.exit(f"{text!r} is not a range: give least,most (say 2,8)")
        if low > high:
            sys.exit(f"{text!r}: the least is more than the most")
        return low, high

    def sizes(text: str) -> tuple[int, int]:
        try:
            low, high = (parse_size(x) for x in text.split(","))
        except ValueError:
            sys.exit(f"{text!r} is not a range of sizes: give least,most (say 200M,1100M)")
        return low, high

    shapes = tuple(s for s in args.shapes.split(",") if s)
    if not shapes or any(s not in SHAPES for s in shapes):
        sys.exit(f"--shapes takes some of {', '.join(SHAPES)}")
    jobs = pair(args.jobs, int)
    return Knobs(
        jobs=(int(jobs[0]), int(jobs[1])),
        size=sizes(args.size),
        size_spread=args.spread,
        grow_s=pair(args.grow, float),
        hold_s=pair(args.hold, float),
        shapes=shapes,
        limit=sizes(args.limit),
    )


if __name__ == "__main__":
    main()
